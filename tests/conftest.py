"""Shared fixtures: private real Redis servers (see ``redis_servers.py``), and
the order the tests start in (:data:`LONGEST_FIRST`)."""

from typing import Any

from redis_servers import (
    async_redis_client,
    make_redis_cluster,
    make_redis_server,
    namespace,
    redis_client,
    redis_cluster,
    redis_server,
    redis_url,
    tls_files,
)

__all__ = [
    "async_redis_client",
    "make_redis_cluster",
    "make_redis_server",
    "namespace",
    "redis_client",
    "redis_cluster",
    "redis_server",
    "redis_url",
    "tls_files",
]


#: The longest tests (``pytest --durations`` on 2 cores, 20 s to 5 s each),
#: started first. With ``--dist load`` (pyproject.toml) each process takes the
#: next test in this order as it finishes one, so the long ones run side by
#: side from the start and the short ones fill in around them, instead of a
#: long test started late ending the run with one process busy and the
#: others idle. Order only: every test still runs.
LONGEST_FIRST = (
    "tests/test_worker_bytes.py::test_a_backlog_of_big_entries_merges_whole_under_512_mib",
    "tests/test_chaos.py::test_chaos_soak",
    "tests/test_cluster.py::test_chaos_on_a_cluster",
    "tests/test_worker_count.py::test_worker_count_does_not_matter",
    "tests/test_worker_redis_restart.py::test_workers_resume_after_redis_restarts",
    "tests/test_cluster.py::test_a_shard_moves_to_a_new_master_under_load",
    "tests/test_serve_chaos.py::test_streams_survive_killed_replicas_workers_and_a_redis_restart",
    "tests/test_worker_numbered.py::test_redis_restarted_without_persistence_never_completes",
    "tests/test_worker_bytes.py::test_huge_entries_under_an_address_space_limit",
    "tests/test_cli_errors.py::test_a_closed_stdout_ends_a_command_quietly",
    "tests/test_cli_dlq.py::test_fix_and_replay_a_poison_entry",
    "tests/test_serve_view.py",
    "tests/test_chaos.py",
    "tests/test_serve_stream.py::test_a_client_that_does_not_read_is_dropped",
    "tests/test_worker_memory.py",
    "tests/test_demo.py",
    "tests/test_worker_crash.py",
    "tests/test_serve_hub.py::test_closing_never_hangs_on_a_blocked_read",
    "tests/test_agui_clients.py",
    "tests/test_cli_dlq.py",
    "tests/test_cli_errors.py",
)


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Put :data:`LONGEST_FIRST` first, in its order (a stable sort: the
    rest keep the order they were collected in)."""

    def rank(item: Any) -> int:
        for index, prefix in enumerate(LONGEST_FIRST):
            if item.nodeid.startswith(prefix):
                return index
        return len(LONGEST_FIRST)

    items.sort(key=rank)

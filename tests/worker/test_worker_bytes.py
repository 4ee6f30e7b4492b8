"""Worker memory is bounded in bytes (processor/worker/budget.py): a backlog of
big valid entries is merged whole by one ``processor run`` under the
shipped Deployment's 512Mi, holding turns or not.

600 updates of ~0.93 MB (a base64 ``data`` content, under the 1 MiB entry
limit) in 10 interleaved turns, ~560 MB, are all in the stream before the
worker starts: its reads, its read-ahead, its held turns and mirrors, and
the turns it finalises must each stay within their byte budget. The peak is
the kernel's (``VmHWM``); a watchdog stops a worker past 1 GiB, so a
regression fails fast instead of eating the machine. docs/reliability.md
(*Memory*) quotes the figures."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.big_entries import big_update, data_uri, digest, uris_of
from support.turn_reference import end_entry, text_delta
from support.worker_harness import Harness

from processor.embedded import EmbeddedRedis
from processor.wire.ids import TurnKey

TURNS = 10
PER_TURN = 60
#: The shipped Deployment's memory limit (deploy/k8s/deployment.yaml).
LIMIT = 512 << 20
WATCHDOG = 1 << 30


def status_bytes(pid: int, name: str) -> int:
    """``VmRSS`` or ``VmHWM`` (peak) of a process, in bytes (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    return 0


def backlog() -> tuple[list[dict[str, Any]], dict[str, list[bytes]]]:
    """The entries, interleaved turn by turn, and the digests of each turn's
    data URIs (not the URIs: the backlog is in Redis, not kept twice here)."""
    entries: list[dict[str, Any]] = []
    uris: dict[str, list[bytes]] = {f"big-{t}": [] for t in range(TURNS)}
    for n in range(PER_TURN):
        for rid in uris:
            uri = data_uri(f"{rid}/{n}")
            entries.append(big_update(rid, n, uri=uri))
            uris[rid].append(digest(uri))
    entries += [{"response_id": rid, "kind": "end"} for rid in uris]
    return entries, uris


async def run_backlog(server: EmbeddedRedis, namespace: str, tmp_path: Path,
                      **flags: Any) -> int:
    """Send the backlog, run one worker until every turn is merged, check
    each response whole; return the worker's peak RSS."""
    entries, uris = backlog()
    async with Harness(server.url, namespace, log_dir=tmp_path) as harness:
        await harness.add(entries, chunk=20)
        del entries
        sub = harness.spawn(**flags)
        pid = sub.proc.pid
        peak = 0

        async def merged_all() -> bool:
            nonlocal peak
            peak = max(peak, status_bytes(pid, "VmHWM"))
            if status_bytes(pid, "VmRSS") > WATCHDOG:
                sub.proc.kill()
                raise AssertionError(f"worker RSS over {WATCHDOG >> 20} MiB: killed")
            return await harness.merged_count() >= TURNS

        await harness.wait_for(merged_all, 240, "the backlog was not merged")
        peak = max(peak, status_bytes(pid, "VmHWM"))
        await harness.wait_drained()
        log = sub.log()
        assert harness.terminate(sub) == 0, log[-3000:]
        # (Not the events: their content events carry every URI once more.)
        outputs = await harness.outputs(events=False)
    assert '"level": "error"' not in log, log[-3000:]
    assert outputs.dlq == []
    for rid, want in uris.items():
        [merged] = outputs.turns[TurnKey(rid, "")].merged
        assert merged["status"] == "completed", rid
        got = [digest(uri) for uri in uris_of(merged["response"])]
        assert got == want, rid
    return peak


@pytest.mark.slow
@pytest.mark.parametrize("hold", [True, False], ids=["held", "stored"])
async def test_a_backlog_of_big_entries_merges_whole_under_512_mib(
    make_redis_server: Callable[..., EmbeddedRedis], namespace: str, tmp_path: Path,
    hold: bool,
) -> None:
    server = make_redis_server()
    peak = await run_backlog(server, namespace, tmp_path, hold_turns=hold)
    print(f"peak RSS {'held' if hold else 'stored'}: {peak / (1 << 20):.0f} MiB")
    assert peak < LIMIT, f"worker peak RSS {peak >> 20} MiB"


#: The address space the MemoryError test gives its worker: a read of the
#: huge entries whole does not fit, the worker's own budget does.
ADDRESS_SPACE = 1536 << 20
_UNDER_RLIMIT = ("import resource, runpy, sys; "
                 f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE})); "
                 "sys.argv = ['processor', *sys.argv[3:]]; "
                 "runpy.run_module('processor.cli', run_name='__main__')")


@pytest.mark.slow
async def test_huge_entries_under_an_address_space_limit_never_stay_pending(
    make_redis_server: Callable[..., EmbeddedRedis], namespace: str, tmp_path: Path,
) -> None:
    """Eight 50 MB entries, a normal turn and a silent one, read by a worker
    whose address space (RLIMIT_AS) a whole read of them does not fit. They
    used to stay pending for ever (redelivered past --max-deliveries, each
    read failing with MemoryError), the stream was no longer trimmed and the
    silent turn never timed out. Now each is dead-lettered whole (read
    budget, processor/worker/budget.py: never read), the turns end as they should,
    and the stream is empty with nothing pending."""
    server = make_redis_server()
    huge = [{"response_id": f"huge-{i}", "update": "x" * (50 << 20)} for i in range(8)]
    normal = [{"response_id": "normal", "update": json.dumps(
        {"contents": [{"type": "text", "text": "fine"}]})}, {"response_id": "normal",
                                                              "kind": "end"}]
    silent = [{"response_id": "silent", "update": json.dumps(
        {"contents": [{"type": "text", "text": "..."}]})}]
    async with Harness(server.url, namespace, log_dir=tmp_path) as harness:
        ids = await harness.add(huge, chunk=1)
        await harness.add(normal + silent)
        del huge
        sub = harness.spawn(None, launcher=["-c", _UNDER_RLIMIT], max_deliveries=2,
                            reclaim_idle_ms=500, turn_timeout=3)
        await harness.wait_merged(2, timeout=90)
        await harness.wait_drained(timeout=60)
        harness.assert_workers_alive()
        log = sub.log()
        assert harness.terminate(sub) == 0, log[-3000:]
        outputs = await harness.outputs()
    assert outputs.turns[TurnKey("normal", "")].merged[0]["status"] == "completed"
    timed_out = outputs.turns[TurnKey("silent", "")].result()
    assert timed_out["status"] == "error"
    assert timed_out["events"][-1]["error"]["code"] == "turn_timeout"
    dead = {d["source_id"]: d for d in outputs.dlq}
    assert set(dead) == set(ids)
    for entry_id in ids:
        assert dead[entry_id]["reason"] in ("too_large", "max_deliveries"), dead[entry_id]
        assert len(dead[entry_id]["update"]) == 50 << 20


async def test_a_memory_error_in_a_read_fails_that_batch_like_any_error(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read whose reply the worker cannot hold (``MemoryError`` from the
    parser, here from a seam around the held path's read) fails that batch
    like any other error: its entries stay pending to the worker, which takes
    them back (bounded, processor/worker/budget.py) and merges them; the shard
    goes on, a silent turn still times out and a later turn merges. (An entry
    that fails every time is dead-lettered whole after --max-deliveries:
    tests/cli/test_cli_dlq.py, MemoryError included.)"""
    from processor.engine.lifecycle import Limits
    from processor.worker import runner

    real = runner.read_raw
    failed: list[int] = []

    async def out_of_memory(*args: Any, **kw: Any) -> Any:
        entries = await real(*args, **kw)
        if any(b"poison" in fields for _id, fields in entries):
            failed.append(len(entries))
            raise MemoryError
        return entries

    monkeypatch.setattr(runner, "read_raw", out_of_memory)
    poison = {**text_delta("p", "read twice"), "poison": "1"}
    async with Harness(redis_url, namespace, limits=Limits(turn_timeout=2.0),
                       reclaim_idle_ms=100, max_deliveries=3) as harness:
        await harness.start_worker()
        await harness.add([poison, text_delta("quiet", "...")])
        await harness.wait_merged(2, timeout=30)
        await harness.add([text_delta("ok", "fine"), end_entry("ok")])
        await harness.wait_merged(3, timeout=30)
        await harness.wait_drained()
        outputs = await harness.outputs()
    assert failed and outputs.dlq == []
    for turn, text in (("p", "read twice"), ("quiet", "...")):
        result = outputs.turns[TurnKey(turn, "")].result()
        assert result["events"][-1]["error"]["code"] == "turn_timeout"
        assert result["response"]["messages"][0]["contents"][0]["text"] == text
    assert outputs.turns[TurnKey("ok", "")].merged[0]["status"] == "completed"


async def test_the_harness_waits_for_a_reply_slower_than_5_s(
    make_redis_server: Callable[..., EmbeddedRedis], namespace: str,
) -> None:
    """Why ``test_a_backlog_of_big_entries_merges_whole_under_512_mib[stored]``
    failed under load (``TimeoutError: Timeout reading from 127.0.0.1:...``)
    and passed alone: the harness read the ten merged turns, 560 MB, in one
    XRANGE on a client with redis-py 8's default 5 s socket timeout, which
    bounds the whole reply; on a busy machine the reply took longer. Any
    reply slower than 5 s did the same; the harness's client now has no
    per-reply deadline (the tests' own waits are bounded)."""
    server = make_redis_server()
    async with Harness(server.url, namespace) as harness:
        # A BLPOP on an empty list answers (nil) after its 6 s timeout: a
        # reply that takes that long, with no CPU spent waiting for it.
        started = time.monotonic()
        assert await harness.client.blpop([f"{namespace}:nothing"], 6) is None
        assert time.monotonic() - started > 5

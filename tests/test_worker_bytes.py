"""Worker memory is bounded in bytes (processor/budget.py): a backlog of
big valid entries is merged whole by one ``processor run`` under the
shipped Deployment's 512Mi, holding turns or not.

600 updates of ~0.93 MB (a base64 ``data`` content, under the 1 MiB entry
limit) in 10 interleaved turns, ~560 MB, are all in the stream before the
worker starts: its reads, its read-ahead, its held turns and copies, and
the turns it finalises must each stay within their byte budget. The peak is
the kernel's (``VmHWM``); a watchdog stops a worker past 1 GiB, so a
regression fails fast instead of eating the machine. docs/reliability.md
(*Memory*) quotes the figures."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from big_entries import big_update, uris_of
from worker_harness import Harness

from processor.embedded import EmbeddedRedis
from processor.ids import TurnKey

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


def backlog() -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The entries, interleaved turn by turn, and each turn's data URIs."""
    entries: list[dict[str, Any]] = []
    uris: dict[str, list[str]] = {f"big-{t}": [] for t in range(TURNS)}
    for n in range(PER_TURN):
        for rid in uris:
            entry = big_update(rid, n)
            entries.append(entry)
            uris[rid].append(json.loads(entry["update"])["contents"][0]["uri"])
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
        outputs = await harness.outputs()
    assert '"level": "error"' not in log, log[-3000:]
    assert outputs.dlq == []
    for rid, want in uris.items():
        [merged] = outputs.turns[TurnKey(rid, "")].merged
        assert merged["status"] == "completed", rid
        got = uris_of(merged["response"])
        assert [len(u) for u in got] == [len(u) for u in want], rid
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

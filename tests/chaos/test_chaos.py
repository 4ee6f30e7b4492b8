"""The chaos soak (short form; the long one is bench/chaos_soak.py, recorded in
docs/reliability.md): 3 ``processor run`` workers, random multi-agent turns
with cancels, producer errors and silent producers, while a random worker is
SIGKILLed every ~2 s and restarted, redis-server (AOF, appendfsync always) is
SIGKILLed and restarted once, and every worker connection is CLIENT KILLed
once. Every turn ends with exactly one merged entry and one terminal event,
its response equals ``processor merge`` of the entries it merged (cut where
the cancel or the timeout was seen, see tests/support/chaos.py), every sent entry is
merged, dropped or dead-lettered exactly once, and no state is left.

``PROCESSOR_CHAOS_TURNS=1000 PROCESSOR_CHAOS_SECONDS=120 python -m pytest -s
tests/chaos/test_chaos.py`` runs a longer soak (``PROCESSOR_CHAOS_SEED`` picks the turns).
"""

from __future__ import annotations

import json
import os

import pytest
from support.chaos import ChaosConfig, ChaosRun
from support.worker_harness import Harness

from processor.engine.lifecycle import Limits


@pytest.mark.parametrize(("shards", "hold"), [(1, True), (6, True), (3, False)])
async def test_chaos_soak(
    make_redis_server, namespace: str, tmp_path, shards: int, hold: bool
) -> None:
    """With one shard every worker reads it (and, sharing it, stores its
    turns); with six, the workers split them (shard affinity) and hold the
    turns of their own, while they are killed and restarted under it (a
    killed worker's held entries are pending, reclaimed and stored by
    another). Six: the three workers and the killed ones still in the live
    set for --worker-ttl, so that most of the time each shard has one
    reader. On three shards, storing every entry (--no-hold-turns)."""
    server = make_redis_server(appendonly=True)  # appendfsync always
    assert server.appendonly
    turns = int(os.environ.get("PROCESSOR_CHAOS_TURNS", "150"))
    cfg = ChaosConfig(
        turns=turns,
        shards=shards,
        seed=int(os.environ.get("PROCESSOR_CHAOS_SEED", "1")),
        produce_seconds=float(os.environ.get("PROCESSOR_CHAOS_SECONDS", "10")),
        hold_turns=hold,
        # Holding, a busy loop competes for the CPUs too: the races around a
        # cancel (a held turn meeting its cancel) happen more under load.
        cpu_load=1 if hold else 0,
    )

    async def restart() -> None:
        await server.akill()  # a crash: only what the AOF fsynced survives
        await server.astart()

    run = ChaosRun(server.url, namespace, cfg, [server.url], restart=restart, log_dir=tmp_path)
    figures = await run.run()
    print("\nchaos soak:\n  " + "\n  ".join(figures.lines()))
    assert run.problems == [], "\n".join(run.problems[:20])
    assert figures.worker_kills >= 5 and figures.redis_restarts == 1
    assert figures.client_kills >= cfg.workers
    assert figures.lost == figures.duplicated == figures.mismatches == 0
    assert figures.unexpected == 0 and figures.leftover_keys == 0 and figures.holes == 0
    assert sum(figures.statuses.values()) == figures.turns
    if hold and shards >= cfg.workers:
        # Each worker reads its shards alone: turns were held (how many the
        # survivors published held is chance). With fewer shards than
        # workers the shards are shared and their turns stored.
        assert figures.spill_logs > 0


async def test_no_timeout_while_the_turns_entries_wait_to_be_reclaimed(
    redis_url: str, namespace: str
) -> None:
    """Found by the soak with a short turn timeout: a turn whose next entries
    sat in a dead worker's pending list longer than ``--turn-timeout`` was
    timed out although its producer never paused, and those entries then
    went to the DLQ as turn_closed. Idle means no entry *arrived*: a turn
    is not timed out while entries older than its timeout wait unapplied."""
    # The producer's pause is the first worker's drain (between "a" and "b"):
    # a 3 s timeout leaves it room on a loaded machine (at 1 s, a slow drain
    # made the turn really idle past its timeout), and the reclaim waits 6 s.
    async with Harness(redis_url, namespace, limits=Limits(turn_timeout=3.0),
                       reclaim_idle_ms=6000) as harness:
        (worker,) = await harness.start_workers(1)
        await harness.add([_delta("slow", "a")])
        await harness.wait_applied()
        await harness.stop_worker(worker)
        await harness.add([_delta("slow", "b"), {"response_id": "slow", "kind": "end"}])
        # A consumer reads them and dies: they wait 6 s to be reclaimed.
        shard = harness.shards[0]
        await harness.client.xreadgroup(harness.group, "ghost", {shard.updates: ">"}, count=10)
        await harness.start_workers(1)
        await harness.wait_merged(1, timeout=30)
        outputs = await harness.outputs()
    (turn,) = outputs.turns.values()
    assert turn.merged[0]["status"] == "completed", turn.events[-1]
    assert json.loads(turn.response)["messages"][0]["contents"][0]["text"] == "ab"
    assert outputs.dlq == []


def _delta(rid: str, text: str) -> dict:
    return {"response_id": rid, "update": {"type": "agent_response_update", "role": "assistant",
                                           "message_id": "m1",
                                           "contents": [{"type": "text", "text": text}]}}

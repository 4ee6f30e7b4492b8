"""Live progress at most once per ``--live-interval-ms`` per running turn
(processor.worker.live_progress): a turn whose updates come faster has them
coalesced, nothing of them lost, and its last events still come before its
outcome."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from support.turn_reference import entry_fields
from support.worker_harness import Harness

from processor.engine.live_reader import replay_texts
from processor.wire.ids import TurnKey
from processor.worker.live_pace import Renewals, live_interval, read_lag


def _update(text: str) -> str:
    return json.dumps({"type": "agent_response_update", "role": "assistant",
                       "message_id": "m1", "contents": [{"type": "text", "text": text}]})


@pytest.mark.parametrize("hold", [False, True], ids=["stored", "held"])
async def test_a_fast_turn_is_told_once_per_interval_and_whole(
    redis_url: str, namespace: str, hold: bool
) -> None:
    """30 updates of one turn, each read in a batch of its own, 20 ms apart
    (0.6 s), under a 400 ms interval: at most a few live publishes (the
    first at once, then one per interval; with every batch published it
    would be about 30), whose chunks, replayed, are the whole text before
    the turn's end is sent; its outcome's text is the same."""
    rid = "fast-turn"
    pieces = [f"w{i} " for i in range(30)]
    config = {"hold_turns": hold, "live_interval_ms": 400}
    async with Harness(redis_url, namespace, **config) as harness:
        await harness.start_workers(1)
        for piece in pieces:
            await harness.add([{"response_id": rid, "update": _update(piece)}])
            await asyncio.sleep(0.02)
        whole = "".join(pieces)

        async def told_whole() -> bool:  # (no further input: the loop publishes it)
            return any(replay_texts(t.events, "synthesis.chunk") == {"m1": whole}
                       for t in (await harness.outputs()).turns.values())

        await harness.wait_for(told_whole, 10, "the live chunks tell the whole text")
        [running] = (await harness.outputs()).turns.values()
        chunks = [e for e in running.events if e["type"] == "synthesis.chunk"]
        shard = harness.shards[0]
        log = shard.live(TurnKey(rid, "").encode())
        entries = await harness.client.xlen(log)
        assert 1 <= len(chunks) <= 6, [c["delta"] for c in chunks]
        assert entries == len(chunks)  # one log entry per publish, each with its updates
        updates = [u for _, f in await harness.client.xrange(log)
                   for u in json.loads(f[b"updates"])]
        assert "".join(u["contents"][0]["text"] for u in updates) == whole
        assert await harness.client.ttl(log) > 0  # (its first entry gave it its TTL)
        await harness.add([{"response_id": rid, "kind": "end"}])
        await harness.wait_merged(1)
        [turn] = (await harness.outputs()).turns.values()
    [message] = json.loads(turn.merged[0]["response"])["messages"]
    assert message["contents"][0]["text"] == whole
    assert turn.events[-1]["type"] == "synthesis"  # (the terminal event, after every chunk)


async def test_interval_zero_tells_every_batch(redis_url: str, namespace: str) -> None:
    """``--live-interval-ms 0``: every batch that moves a turn publishes it."""
    rid = "every-batch"
    async with Harness(redis_url, namespace, live_interval_ms=0) as harness:
        await harness.start_workers(1)
        for i in range(5):
            await harness.add([{"response_id": rid, "update": _update(f"p{i} ")}])

            async def told(n: int = i + 1) -> bool:
                turns = (await harness.outputs()).turns.values()
                return any(sum(e["type"] == "synthesis.chunk" for e in t.events) == n
                           for t in turns)

            await harness.wait_for(told, 10, f"{i + 1} chunks")


def test_a_log_gets_its_ttl_first_then_once_per_period() -> None:
    """Renewals: due for a turn the first time, not again within the
    period, due again after at most two periods; other turns apart."""
    a, b = TurnKey("a", ""), TurnKey("b", "")
    renewals = Renewals(60.0, now=1000.0)
    assert renewals.due(a, 1000.0)
    assert not renewals.due(a, 1001.0)
    assert renewals.due(b, 1030.0)
    assert not renewals.due(a, 1059.0)
    assert not renewals.due(a, 1061.0)  # (a turn of the period: a is in the older generation)
    assert renewals.due(a, 1121.0)  # (two turns: forgotten)
    assert not renewals.due(a, 1122.0)


@pytest.mark.parametrize(("interval", "most", "told"), [
    (0, 0, {"stored": 20, "held": 20}),
    (0, 60_000, {"stored": 2, "held": 2}),
    (100, 60_000, {"stored": 2, "held": 1}),
], ids=["every-batch", "stretched-from-0", "stretched"])
@pytest.mark.parametrize("hold", [False, True], ids=["stored", "held"])
async def test_a_read_behind_its_producers_stretches_the_interval(
    redis_url: str, namespace: str, hold: bool, interval: int, most: int,
    told: dict[str, int]
) -> None:
    """20 updates of one turn whose ids say they were added 30 s ago, read
    one per batch: read that far behind, the interval stretches to the lag
    (up to ``--live-interval-max-ms``), so the turn is told when it starts
    and then with its outcome; under the default interval a held turn's
    first publish waits too and the turn, read whole within it, is told
    once, with its outcome (a stored turn is told when its mirror begins).
    Under ``--live-interval-ms 0`` a turn's first publish never waits, and
    with ``--live-interval-max-ms 0`` every batch tells it. Either way the
    chunks replayed are the whole text."""
    rid = "behind"
    pieces = [f"w{i} " for i in range(20)]
    config = {"hold_turns": hold, "live_interval_ms": interval, "live_interval_max_ms": most,
              "batch": 1}
    async with Harness(redis_url, namespace, **config) as harness:
        await harness.start_workers(1)
        entries = [{"response_id": rid, "update": _update(piece)} for piece in pieces]
        entries.append({"response_id": rid, "kind": "end"})
        then = int(time.time() * 1000) - 30_000
        async with harness.client.pipeline(transaction=False) as pipe:
            for i, entry in enumerate(entries):
                shard = harness.shard_of(entry)
                pipe.xadd(shard.updates, entry_fields(entry), id=f"{then}-{i + 1}")
            await pipe.execute()
        await harness.wait_merged(1)
        [turn] = (await harness.outputs()).turns.values()
    chunks = [e["delta"] for e in turn.events if e["type"] == "synthesis.chunk"]
    assert "".join(chunks) == "".join(pieces)
    assert len(chunks) == told["held" if hold else "stored"], chunks


def test_the_live_interval_stretches_to_the_lag_within_its_bounds() -> None:
    assert live_interval(0.1, 0.0, 1.0) == 0.1  # not behind: the interval
    assert live_interval(0.1, 0.05, 1.0) == 0.1  # behind less than it: the interval
    assert live_interval(0.1, 0.4, 1.0) == 0.4  # the lag
    assert live_interval(0.1, 30.0, 1.0) == 1.0  # up to the most
    assert live_interval(0.1, 30.0, 0.0) == 0.1  # never stretched
    assert live_interval(0.0, 0.02, 0.0) == 0.0  # every batch


def test_a_reads_lag_is_the_age_of_its_newest_id() -> None:
    assert read_lag(b"1000-5", 3500) == 2.5
    assert read_lag("1000-0", 3500) == 2.5
    assert read_lag("5000-0", 3500) == 0.0  # ahead of the clock: not behind
    assert read_lag("junk", 3500) == 0.0


async def test_a_waiting_held_turn_keeps_its_updates_undecoded_until_it_is_told(
    redis_url: str, namespace: str
) -> None:
    """Under a long interval a held turn is told at its first update, then
    waits: the updates after it stay pending, undecoded (decoded and folded
    together when it is told, not one by one per batch), and the turn's end
    tells the whole text."""
    rid = "waits"
    pieces = [f"w{i} " for i in range(6)]
    async with Harness(redis_url, namespace, live_interval_ms=60_000, hold_ms=60_000,
                       batch=1) as harness:
        [running] = await harness.start_workers(1)
        for piece in pieces:
            await harness.add([{"response_id": rid, "update": _update(piece)}])
        holds = running.worker.live.shards[0].holds

        def all_read() -> bool:
            return any(len(held.ids) == len(pieces) for held in holds.turns.values())

        await harness.wait_for(all_read, 30, "every update held")
        [held] = holds.turns.values()
        assert len(held.pending) == len(pieces) - 1  # (the first was told at once)
        await harness.add([{"response_id": rid, "kind": "end"}])
        await harness.wait_merged(1)
        [turn] = (await harness.outputs()).turns.values()
    chunks = [e["delta"] for e in turn.events if e["type"] == "synthesis.chunk"]
    assert "".join(chunks) == "".join(pieces)
    assert len(chunks) == 2

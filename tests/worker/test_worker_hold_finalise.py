"""Held turns (``--hold-turns``) finalised and checkpointed
(processor/worker/held/path.py): a batch's ``finalise_held`` runs while the
next batch is merged, so an entry after the end of a turn whose finalise
is in flight is late, and a finalise that fails leaves its turns to spill
and finish stored; past ``--hold-ms`` a turn's merge is checkpointed (one
snapshot, its entries acked) in calls of about a batch, and the turn
finishes held."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import redis.exceptions
from support.held_runs import HOLD, metric
from support.turn_reference import (
    compare_with_offline,
    end_entry,
    entry_fields,
    interleave,
    offline_results,
    response_text,
    text_delta,
)
from support.worker_harness import Harness

from processor.wire.ids import TurnKey
from processor.worker.held.per_call import FINALISE_TURN_ENTRIES


async def test_a_turn_held_past_hold_ms_is_checkpointed_and_finishes_held(
    redis_url: str, namespace: str
) -> None:
    """Past --hold-ms a running turn's merge is stored as one snapshot and
    its entries acked (the stream trimmed), not a record per entry; it
    stays held and is published from memory."""
    async with Harness(redis_url, namespace, hold_ms=200, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add([text_delta("s", "1"), text_delta("s", "2")])
        await harness.wait_applied()  # checkpointed: acked, and the stream trimmed
        recs = await harness.client.hkeys(harness.shards[0].recs(TurnKey("s").encode()))
        await harness.add([text_delta("s", "3"), end_entry("s")])
        await harness.wait_merged(1)
        await harness.wait_drained()
        outputs = await harness.outputs()
        spilled = metric(running.worker, "processor_held_turns_spilled_total")
        checkpoints = metric(running.worker, "processor_held_turns_checkpointed_total")
        left = await harness.state_keys()
    assert recs == [b"state"] and spilled == 0 and checkpoints == 1
    assert response_text(outputs, "s") == "123" and left == []


async def test_an_entry_after_the_end_of_a_turn_whose_finalise_is_in_flight_is_late(
    redis_url: str, namespace: str
) -> None:
    """A batch's finalise runs while the next batch is merged (HeldPath.settle).
    An entry of a turn whose finalise is still in flight, in that next
    batch, waits for the finalise: it is then dead-lettered as late
    (``turn_closed``), not fed to the published turn and left pending; the
    batch's other turn goes on held. Here the finalise's reply is held back
    until the late entry has been delivered."""
    async with Harness(redis_url, namespace, batch=10, hold_turns=True) as harness:
        (running,) = await harness.start_workers(1)
        # (A first turn: the loop's first reclaim, which commits first, is behind it.)
        await harness.add([text_delta("w", "0"), end_entry("w")])
        await harness.wait_merged(1)
        scripts = running.worker.scripts
        real, entered, release = scripts.finalise_held, asyncio.Event(), asyncio.Event()

        async def held_back(**kwargs: Any) -> Any:
            result = await real(**kwargs)
            if not entered.is_set():
                entered.set()
                await release.wait()
            return result

        scripts.finalise_held = held_back
        async with harness.client.pipeline(transaction=True) as pipe:  # (read as one batch)
            for entry in (text_delta("a", "1"), end_entry("a")):
                pipe.xadd(harness.ns.shard(0).updates, entry_fields(entry))
            await pipe.execute()
        await asyncio.wait_for(entered.wait(), 10)
        async with harness.client.pipeline(transaction=True) as pipe:
            for entry in (text_delta("a", "late"), text_delta("b", "2"), end_entry("b")):
                pipe.xadd(harness.ns.shard(0).updates, entry_fields(entry))
            await pipe.execute()

        async def delivered() -> bool:  # (the first batch is acked: its finalise ran)
            pending = await harness.client.xpending(harness.ns.shard(0).updates, harness.group)
            return int(pending["pending"]) == 3

        await harness.wait_for(delivered, 10, "the second batch was never read")
        await asyncio.sleep(0.2)  # (the applier reaches the second batch meanwhile)
        release.set()
        await harness.wait_merged(3)
        await harness.wait_drained(10)  # (left pending, it would wait for a reclaim: 30 s)
        outputs = await harness.outputs()
        held = metric(running.worker, "processor_turns_settled_total", source="held")
    assert response_text(outputs, "a") == "1" and response_text(outputs, "b") == "2"
    assert [(d["response_id"], d["reason"]) for d in outputs.dlq] == [("a", "turn_closed")]
    assert held == 3


async def test_a_batch_finalise_that_fails_leaves_its_turns_to_spill_and_finish_stored(
    redis_url: str, namespace: str
) -> None:
    """The batch's finalise runs on its own (HeldPath._settle): one that
    fails with an error that is not a connection error is counted and
    logged, its turns stay held, spill when due (``--hold-ms``) and are
    published once by the stored path."""
    async with Harness(redis_url, namespace, hold_ms=300, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        scripts = running.worker.scripts
        real, calls = scripts.finalise_held, 0

        async def fails_once(**kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise redis.exceptions.ResponseError("finalise failed (test)")
            return await real(**kwargs)

        scripts.finalise_held = fails_once
        entries = [text_delta("f", "1"), text_delta("f", "2"), end_entry("f")]
        await harness.add(entries)
        await harness.wait_merged(1)
        await harness.wait_drained()
        outputs = await harness.outputs()
        spilled = metric(running.worker, "processor_held_turns_spilled_total")
        failed = metric(running.worker, "processor_step_failures_total")
    compare_with_offline(outputs, offline_results(entries))
    assert calls == 1 and spilled == 1 and failed == 1


async def test_turns_held_past_hold_ms_checkpoint_in_calls_of_about_a_batch(
    redis_url: str, namespace: str
) -> None:
    """All the turns due at once are checkpointed in calls of whole turns of
    about ``--batch`` entries (in one call, 1,000 paced turns' 50,000
    entries kept redis-server busy for seconds, every client waiting), each
    turn's entries in one call, and finish as ``processor merge`` says."""
    turns = [[text_delta(f"t{i}", str(j)) for j in range(5)] for i in range(30)]
    ends = [end_entry(f"t{i}") for i in range(30)]
    calls: list[tuple[int, list[str]]] = []  # entries, and their turns, of each checkpoint
    async with Harness(redis_url, namespace, hold_ms=300, batch=20, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        _record_calls(running.worker.scripts, "checkpoint_held", 3, 7, calls)
        await harness.add(interleave(turns, random.Random(3)))
        await harness.wait_for(
            lambda: metric(running.worker, "processor_held_turns_checkpointed_total") == 30, 20,
            "not all checkpointed")
        await harness.wait_applied()
        spill = list(calls)
        await harness.add(ends)
        await harness.wait_merged(30)
        outputs = await harness.outputs()
    assert sum(n for n, _ in spill) == 150
    assert max(n for n, _ in spill) <= 20
    every = [tk for _, tks in spill for tk in tks]
    assert len(every) == len(set(every)) == 30  # each turn's entries in one call
    for i in range(30):
        assert response_text(outputs, f"t{i}") == "01234"


async def test_held_turns_ending_together_finalise_in_calls_of_about_a_batch(
    redis_url: str, namespace: str
) -> None:
    """The held turns one batch ends are finalised in calls of whole turns
    of about ``--batch`` entries, each turn counting ``FINALISE_TURN_ENTRIES``
    more: in one call, 500 paced turns kept redis-server busy for 50-210 ms
    (holding 1 or 200 entries each), every client waiting. Each turn's
    entries go in one call, and the turns finish as ``processor merge``
    says."""
    turns = [[text_delta(f"t{i}", str(j)) for j in range(5)] for i in range(30)]
    ends = [end_entry(f"t{i}") for i in range(30)]
    calls: list[tuple[int, list[str]]] = []  # held entries, and their turns, of each finalise
    # (Held throughout: a checkpoint at --hold-ms would ack what it holds.)
    async with Harness(redis_url, namespace, batch=60, hold_ms=60_000, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        _record_calls(running.worker.scripts, "finalise_held", 8, 5, calls)
        await harness.add(interleave(turns, random.Random(3)))
        stream = harness.ns.shard(0).updates

        async def all_held() -> bool:
            return bool((await harness.client.xpending(stream, harness.group))["pending"] == 150)

        await harness.wait_for(all_held, 20, "not every update read and held")
        await harness.add(ends)
        await harness.wait_merged(30)
        outputs = await harness.outputs()
        held = metric(running.worker, "processor_turns_settled_total", source="held")
    assert held == 30
    assert sum(n for n, _ in calls) == 180  # (each turn's 5 updates and its end)
    # (6 entries and FINALISE_TURN_ENTRIES more a turn: at most two turns a call.)
    assert all(n + FINALISE_TURN_ENTRIES * len(tks) <= 60 for n, tks in calls)
    every = [tk for _, tks in calls for tk in tks]
    assert len(every) == len(set(every)) == 30  # each turn's entries in one call
    compare_with_offline(outputs, offline_results(interleave(turns, random.Random(3)) + ends))
    for i in range(30):
        assert response_text(outputs, f"t{i}") == "01234"


def _record_calls(scripts: Any, name: str, rows_at: int, ids_at: int,
                  calls: list[tuple[int, list[str]]]) -> None:
    """Wrap the held path's script ``name`` (its turns one msgpack array of
    rows in ARGV ``rows_at``, each row's held entry ids at ``ids_at``, its
    ``TurnKey.encode`` first) so that each call appends to ``calls`` how
    many held entries it had, and its turns."""
    real = getattr(scripts, name)

    async def recorded(*, keys: list[Any], args: list[Any]) -> Any:
        rows = msgspec.msgpack.decode(args[rows_at], type=list[list[msgspec.Raw]])
        calls.append((sum(len(msgspec.msgpack.decode(row[ids_at], type=list[str]))
                          for row in rows),
                      sorted(msgspec.msgpack.decode(row[0], type=str) for row in rows)))
        return await real(keys=keys, args=args)

    setattr(scripts, name, recorded)

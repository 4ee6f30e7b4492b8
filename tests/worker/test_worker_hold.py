"""Held turns (``--hold-turns``, processor/worker/held/holds.py, processor/worker/held/path.py):
a turn's entries stay pending and are merged in the worker's memory only,
then published and acked in one ``finalise_held``; whenever holding stops
being safe (a crash, another consumer's entries, a cancel, the hold bound,
a stop) the turn is spilled to ``apply_entries`` and finishes as a stored
turn. Every path publishes what ``processor merge`` of the same entries
publishes, exactly once. Live progress of held turns is
test_worker_hold_live.py's; the finalise and the checkpoint,
test_worker_hold_finalise.py's."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from support.held_runs import HOLD, metric, random_turns
from support.turn_reference import (
    as_read,
    compare_with_offline,
    end_entry,
    interleave,
    offline_results,
    response_text,
    simple_turn,
    text_delta,
)
from support.worker_harness import Harness

from processor.engine.lifecycle import Limits
from processor.redis_io.replies import entry_of
from processor.wire.ids import TurnKey
from processor.worker.held.batch import HeldBatch, group_batch
from processor.worker.held.holds import Holds


async def test_held_turns_publish_the_offline_merge_without_storing_a_record(
    redis_url: str, namespace: str
) -> None:
    turns = random_turns(60)
    entries = interleave(turns, random.Random(3))
    async with Harness(redis_url, namespace, batch=50, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add(entries)
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
        worker = running.worker
        held = metric(worker, "processor_turns_settled_total", source="held")
        spilled = metric(worker, "processor_held_turns_spilled_total")
    compare_with_offline(outputs, offline_results(entries))
    assert held == len(turns) and spilled == 0


async def test_mirror_turns_0_keeps_no_mirror_and_still_holds_turns(
    redis_url: str, namespace: str
) -> None:
    """--mirror-turns 0 means "always read back" a stored turn; it bounds the
    mirrors, not the held turns (their own bound): every turn is still held and
    published from memory, none spilled because a mirror cache is empty."""
    turns = random_turns(20)
    entries = interleave(turns, random.Random(5))
    async with Harness(redis_url, namespace, batch=50, mirror_turns=0, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add(entries)
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        outputs = await harness.outputs()
        worker = running.worker
        held = metric(worker, "processor_turns_settled_total", source="held")
        spilled = metric(worker, "processor_held_turns_spilled_total")
    compare_with_offline(outputs, offline_results(entries))
    assert held == len(turns) and spilled == 0


@pytest.mark.parametrize("shards", [1, 2])
async def test_workers_hold_only_the_shards_they_read_alone(
    redis_url: str, namespace: str, shards: int
) -> None:
    """Two workers on one shard both read it: a turn's entries reach both,
    and holding would spill nearly every turn, so each stores what it reads
    (Membership.sole_reader). On two shards each reads one alone and holds."""
    turns = random_turns(40, seed=13)
    entries = interleave(turns, random.Random(9))
    async with Harness(redis_url, namespace, shards=shards, batch=20, worker_ttl=1.0,
                       **HOLD) as harness:
        a, b = await harness.start_workers(2)
        await harness.wait_for(lambda: a.worker.membership.live == b.worker.membership.live
                               == sorted([a.consumer, b.consumer]), 5, "both to see each other")
        await asyncio.sleep(0.3)  # reads begun before the first beat have ended
        assert [w.worker.membership.sole_reader(0) for w in (a, b)].count(True) == shards - 1
        await harness.add(entries)
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        outputs = await harness.outputs()
        held = sum(metric(w.worker, "processor_turns_settled_total", source="held")
                   for w in (a, b))
        spilled = sum(metric(w.worker, "processor_held_turns_spilled_total") for w in (a, b))
    compare_with_offline(outputs, offline_results(entries))
    if shards == 1:
        assert held == spilled == 0
    else:
        assert held == len(turns) and spilled == 0


def _grouped(entries: list[Any]) -> HeldBatch:
    return group_batch(entries, 0, 1, Limits().max_entry_bytes)


def _plain(entry_id: int, update: dict[str, Any]) -> list[Any]:
    """A plain update as a worker holding turns reads it (it joins its turn's run)."""
    return [f"{entry_id}-0".encode(), [b"response_id", b"r1", b"update",
                                       json.dumps(update).encode()]]


def test_a_turn_is_held_from_its_first_entry_and_fed_each_entry_once() -> None:
    holds = Holds(Limits(), max_turns=10, max_bytes=1 << 20)
    key = TurnKey("r1")
    fields = [{"response_id": "r1", "update": e["update"]} for e in simple_turn("r1", 2)[:2]]
    raw = as_read([(f"{i}-0", f) for i, f in enumerate(fields, 1)])  # str: decoded on reading
    batch = _grouped(raw)
    assert holds.to_open(batch) == {key: {}}
    holds.opened({key: True}, "5", now=0.0)
    routed = holds.route(raw, batch)
    assert routed.held == [key] and routed.stored == []
    again = holds.route(raw, batch)  # the same batch after a lost reply: nothing twice
    assert again.held == [] and holds.turns[key].ids == ["1-0", "2-0"]
    assert holds.to_open(batch) == {}


def test_a_turn_starting_with_an_entry_to_dead_letter_is_left_to_the_stored_path() -> None:
    """The stored path starts a turn at the first entry it applies: a turn
    whose first entry it dead-letters (bad JSON here) is not held, else it
    would publish synthesis.started and stay active until its timeout."""
    holds = Holds(Limits(), max_turns=10, max_bytes=1 << 20)
    bad = [b"1-0", [b"response_id", b"bad", b"update", b"{not json"]]
    good = _plain(2, {"contents": [{"type": "text", "text": "hi"}]})
    then_good = [b"3-0", [b"response_id", b"bad", b"update", good[1][3]]]
    batch = _grouped([bad, good, then_good])
    assert holds.to_open(batch) == {TurnKey("r1"): {}}
    assert TurnKey("bad") in holds.old
    holds.opened({TurnKey("r1"): True}, "5", now=0.0)
    routed = holds.route([bad, good, then_good], batch)
    assert routed.held == [TurnKey("r1")]
    assert [entry_id for entry_id, _ in routed.stored] == [b"1-0", b"3-0"]  # both, in order


def test_held_entries_are_refreshed_once_per_period_and_not_looked_at_between() -> None:
    """``Holds.stale``: a turn's entries are due for a refresh ``every``
    seconds after it was opened or last refreshed, each turn on its own
    clock; between the soonest such time and now nothing is due (the loop
    calls it after every batch: it does not look at the turns then)."""
    holds = Holds(Limits(), max_turns=10, max_bytes=1 << 20)
    one = _plain(1, {"contents": [{"type": "text", "text": "a"}]})
    two = [b"2-0", [b"response_id", b"r2", b"update", one[1][3]]]
    for entry, key, now in ((one, TurnKey("r1"), 0.0), (two, TurnKey("r2"), 4.0)):
        batch = _grouped([entry])
        assert holds.to_open(batch) == {key: {}}
        holds.opened({key: True}, "5", now=now)
        holds.route([entry], batch)
    assert holds.stale(5.0, 10.0) == []
    assert holds.stale(10.0, 10.0) == ["1-0"]
    assert holds.stale(13.0, 10.0) == []
    assert holds.stale(14.0, 10.0) == ["2-0"]
    holds.turns[TurnKey("r1")].refreshed = 0.0  # (behind the bookkeeping's back: not looked at)
    assert holds.stale(19.0, 10.0) == []
    assert holds.stale(20.0, 10.0) == ["1-0"]


def test_a_batch_routed_again_feeds_nothing_twice_whatever_it_ends_with() -> None:
    """The same call is retried after a lost reply: entries already fed are
    not fed again, even when the batch's last entry did not decode (so the
    batch's ids, not its decoded entries, say how far routing went)."""
    holds = Holds(Limits(), max_turns=10, max_bytes=1 << 20)
    key = TurnKey("r1")
    updates = [e["update"] for e in simple_turn("r1", 5)[:5]]
    first = [_plain(i, u) for i, u in enumerate(updates[:2], 1)]
    second = [*(_plain(i, u) for i, u in enumerate(updates[2:4], 3)), [b"5-0", [b"bad", b"x"]]]
    holds.opened({key: True}, "5", now=0.0)
    holds.route(first, _grouped(first))
    routed = holds.route(second, _grouped(second))
    bad = entry_of(second[2])
    assert routed.stored == [bad]  # the undecodable one: apply_entries dead-letters it
    again = holds.route(second, _grouped(second))
    assert again.held == [] and again.stored == [bad]
    # Part of a run routed before, part new: only the new part is held.
    overlap = [second[1], _plain(6, updates[4])]
    assert holds.route(overlap, _grouped(overlap)).held == [key]
    held = holds.turns[key]
    assert held.ids == ["1-0", "2-0", "3-0", "4-0", "6-0"]
    assert held.catch_up() and held.replay.life.counts.updates == 5


async def _pending(harness: Harness, consumer: str | None = None) -> int:
    shard = harness.shards[0]
    if consumer is None:
        return int((await harness.client.xpending(shard.updates, harness.group))["pending"])
    rows = await harness.client.xpending_range(shard.updates, harness.group, min="-", max="+",
                                               count=1000, consumername=consumer)
    return len(rows)


async def test_a_crashed_holders_entries_are_reclaimed_and_merged_once(
    redis_url: str, namespace: str
) -> None:
    """A worker holding turns dies (its task cancelled: no spill); their
    entries stay pending, another worker reclaims and stores them, and each
    turn is published once, as processor merge publishes it."""
    entries = [text_delta(rid, text) for rid, text in (("a", "1"), ("b", "x"), ("a", "2"),
                                                       ("b", "y"))]
    ends = [end_entry("a"), end_entry("b")]
    async with Harness(redis_url, namespace, **HOLD) as harness:
        holder = await harness.start_worker(hold_ms=60_000, reclaim_idle_ms=120_000)
        await harness.add(entries)
        await harness.wait_for(lambda: len(holder.worker.shard(0).held_turns) == 2, 10,
                               "the turns were never held")
        holder.task.cancel()  # a crash: nothing spilled, nothing acked
        await asyncio.gather(holder.task, return_exceptions=True)
        harness.workers.remove(holder)
        assert await _pending(harness, holder.consumer) == 4
        rescuer = await harness.start_worker(reclaim_idle_ms=300)

        def reclaimed() -> float:
            return metric(rescuer.worker, "processor_entries_consumed_total", shard="0",
                           source="reclaim")

        # The ends come once the rescuer took the entries over: read first, an end
        # would let it finish the turn on the stored path with the dead holder's
        # entries still pending, which is another test's case.
        await harness.wait_for(lambda: reclaimed() == 4, 30, "the entries were never reclaimed")
        await harness.add(ends)
        await harness.wait_merged(2, timeout=30)
        await harness.wait_drained()
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline_results(entries + ends))
    assert reclaimed() == 4


async def test_another_consumers_older_entry_makes_the_holder_spill(
    redis_url: str, namespace: str
) -> None:
    """An entry of the turn pending to another consumer (read, not applied)
    fails finalise_held's check: the turn is spilled, waits for that entry
    (reclaimed once idle) and is published with it, in order."""
    async with Harness(redis_url, namespace, reclaim_idle_ms=500, **HOLD) as harness:
        await harness.add([text_delta("t", "1")])
        shard = harness.shards[0]
        await harness.client.xgroup_create(shard.updates, harness.group, id="0")
        await harness.client.xreadgroup(harness.group, "ghost", {shard.updates: ">"}, count=10)
        (running,) = await harness.start_workers(1)
        rest = [text_delta("t", "2"), text_delta("t", "3"), end_entry("t")]
        await harness.add(rest)
        await harness.wait_merged(1, timeout=30)
        await harness.wait_drained()
        outputs = await harness.outputs()
        spilled = metric(running.worker, "processor_held_turns_spilled_total")
    assert response_text(outputs, "t") == "123"
    assert spilled == 1


@pytest.mark.parametrize(
    "bad",
    [{"response_id": "t", "update": "{not json"},
     {"response_id": "t", "update": "{not json", "kind": "update"}],
    ids=["waiting", "decoded-on-read"],
)
async def test_a_dead_letter_of_a_held_turn_spills_it(
    bad: dict[str, str], redis_url: str, namespace: str
) -> None:
    """A bad entry of a held turn is dead-lettered by apply_entries, and the
    turn spills and is published with the dead letter counted. A plain
    update waits undecoded (processor/worker/held/holds.py ``Held``): the worker finds it
    bad when it decodes the turn's waiting updates (here, at the end) and
    spills the turn, entry included. Any other entry is decoded on reading:
    one that fails is stored at once, which moves the turn's version, and
    finalise_held refuses the worker's copy (which never saw it)."""
    async with Harness(redis_url, namespace, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add([text_delta("t", "1")])
        await harness.wait_for(lambda: running.worker.shard(0).held_turns, 10, "never held")
        await harness.add([bad, text_delta("t", "2"), end_entry("t")])
        await harness.wait_merged(1, timeout=30)
        await harness.wait_drained()
        outputs = await harness.outputs()
        spilled = metric(running.worker, "processor_held_turns_spilled_total")
    turn = outputs.turns[TurnKey("t")]
    assert response_text(outputs, "t") == "12"
    assert [d["reason"] for d in outputs.dlq] == ["bad_encoding"]
    assert turn.events[-1]["counts"]["dlq"] == 1 and spilled == 1


async def test_a_cancelled_held_turn_is_published_cancelled_with_what_was_held(
    redis_url: str, namespace: str
) -> None:
    async with Harness(redis_url, namespace, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add([text_delta("c", "1"), text_delta("c", "2")])
        await harness.wait_for(lambda: running.worker.shard(0).held_turns, 10, "never held")
        await harness.cancel("c")
        await harness.wait_merged(1, timeout=30)
        await harness.add([text_delta("c", "3"), end_entry("c")])
        await harness.wait_drained()
        outputs = await harness.outputs()
        done = await harness.client.hgetall(harness.shards[0].done(TurnKey("c").encode()))
    turn = outputs.turns[TurnKey("c")]
    assert turn.merged[0]["status"] == "cancelled" and response_text(outputs, "c") == "12"
    assert int(done[b"dropped"]) == 2 and outputs.dlq == []
    assert outputs.terminal_counts()[TurnKey("c")] == 1


async def test_a_stopping_worker_stores_what_it_holds(redis_url: str, namespace: str) -> None:
    async with Harness(redis_url, namespace, hold_ms=60_000, reclaim_idle_ms=120_000,
                       **HOLD) as harness:
        first = await harness.start_worker()
        await harness.add([text_delta("p", "1"), text_delta("p", "2")])
        await harness.wait_for(lambda: first.worker.shard(0).held_turns, 10, "never held")
        await harness.stop_worker(first)
        assert await _pending(harness) == 0  # stored and acked before it left
        await harness.start_worker()
        await harness.add([text_delta("p", "3"), end_entry("p")])
        await harness.wait_merged(1)
        outputs = await harness.outputs()
    assert response_text(outputs, "p") == "123"


async def test_a_stored_turn_does_not_wait_for_held_turns(
    redis_url: str, namespace: str
) -> None:
    """A stored turn (started before this worker held anything) is published
    as soon as its end is applied, though older entries of held turns are
    still pending: they are this worker's, and held turns never need them
    (the floor of includes/watermark.lua)."""
    async with Harness(redis_url, namespace, hold_ms=60_000, reclaim_idle_ms=120_000,
                       **HOLD) as harness:
        plain = await harness.start_worker(hold_turns=False)
        await harness.add([text_delta("old", "1")])
        await harness.wait_applied()
        await harness.stop_worker(plain)
        (running,) = await harness.start_workers(1)
        await harness.add([text_delta("held", "x")])
        await harness.wait_for(lambda: running.worker.shard(0).held_turns, 10, "never held")
        await harness.add([text_delta("old", "2"), end_entry("old")])
        await harness.wait_merged(1, timeout=10)
        still_held = list(running.worker.shard(0).held_turns)
        await harness.add([end_entry("held")])
        await harness.wait_merged(2)
        outputs = await harness.outputs()
    assert still_held == [TurnKey("held")]
    assert response_text(outputs, "old") == "12" and response_text(outputs, "held") == "x"


async def test_a_live_holder_keeps_what_it_holds_past_the_reclaim_idle_time(
    redis_url: str, namespace: str
) -> None:
    """A turn held longer than --reclaim-idle-ms: the holder resets its held
    entries' idle time (XCLAIM JUSTID to itself), so another worker sweeping
    the shard for idle entries reclaims none, and the turn is still
    published held once its end comes."""
    async with Harness(redis_url, namespace, hold_turns=True, affinity=False,
                       reclaim_idle_ms=900, hold_ms=60_000) as harness:
        holder = await harness.start_worker()
        await harness.add([text_delta("long", "1"), text_delta("long", "2")])
        await harness.wait_for(lambda: holder.worker.shard(0).held_turns, 10, "never held")
        other = await harness.start_worker()
        await asyncio.sleep(3.0)  # over three reclaim idle times
        reclaimed = metric(other.worker, "processor_entries_consumed_total", shard="0",
                            source="reclaim")
        await harness.stop_worker(other)
        assert await _pending(harness, holder.consumer) == 2
        await harness.add([end_entry("long")])
        await harness.wait_merged(1)
        outputs = await harness.outputs()
        held = metric(holder.worker, "processor_turns_settled_total", source="held")
    assert reclaimed == 0 and held == 1 and response_text(outputs, "long") == "12"

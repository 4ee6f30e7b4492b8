"""Held turns (``--hold-turns``, processor/worker/held/holds.py, processor/worker/held/path.py):
a turn's entries stay pending and are merged in the worker's memory only,
then published and acked in one ``finalise_held``; whenever holding stops
being safe (a crash, another consumer's entries, a cancel, the hold bound,
a stop) the turn is spilled to ``apply_entries`` and finishes as a stored
turn. Every path publishes what ``processor merge`` of the same entries
publishes, exactly once."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import msgspec
import pytest
import redis.exceptions
from support.strategies import random_turn
from support.turn_reference import (
    as_read,
    compare_with_offline,
    end_entry,
    entry_fields,
    interleave,
    offline_results,
    response_text,
    simple_turn,
    text_delta,
)
from support.worker_harness import Harness

from processor.engine.lifecycle import Limits
from processor.engine.live_reader import replay_texts
from processor.redis_io.replies import entry_of
from processor.wire.ids import TurnKey
from processor.worker.held.batch import HeldBatch, group_batch
from processor.worker.held.holds import Holds
from processor.worker.worker import Worker, WorkerConfig

HOLD = {"hold_turns": True}


def _metric(worker: Worker, name: str, **labels: str) -> float:
    value = worker.metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


def _turns(n: int, seed: int = 7) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [random_turn(rng, f"r{i}") for i in range(n)]


async def test_held_turns_publish_the_offline_merge_without_storing_a_record(
    redis_url: str, namespace: str
) -> None:
    turns = _turns(60)
    entries = interleave(turns, random.Random(3))
    async with Harness(redis_url, namespace, batch=50, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add(entries)
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
        worker = running.worker
        held = _metric(worker, "processor_turns_settled_total", source="held")
        spilled = _metric(worker, "processor_held_turns_spilled_total")
    compare_with_offline(outputs, offline_results(entries))
    assert held == len(turns) and spilled == 0


async def test_mirror_turns_0_keeps_no_mirror_and_still_holds_turns(
    redis_url: str, namespace: str
) -> None:
    """--mirror-turns 0 means "always read back" a stored turn; it bounds the
    mirrors, not the held turns (their own bound): every turn is still held and
    published from memory, none spilled because a mirror cache is empty."""
    turns = _turns(20)
    entries = interleave(turns, random.Random(5))
    async with Harness(redis_url, namespace, batch=50, mirror_turns=0, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add(entries)
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        outputs = await harness.outputs()
        worker = running.worker
        held = _metric(worker, "processor_turns_settled_total", source="held")
        spilled = _metric(worker, "processor_held_turns_spilled_total")
    compare_with_offline(outputs, offline_results(entries))
    assert held == len(turns) and spilled == 0


def _live_texts_match(outputs: Any, response_text_of: Any = None) -> int:
    """Every turn's live chunks replay to its merged messages' texts
    (processor.engine.live); returns the number of chunks seen."""
    chunks = 0
    for key, got in outputs.turns.items():
        merged = json.loads(got.merged[0]["response"])
        for kind, content in (("synthesis.chunk", "text"), ("reasoning.chunk", "text_reasoning")):
            shown = {m: t for m, t in replay_texts(got.events, kind).items() if t}
            want = {m["message_id"]: t for m in merged["messages"]
                    if (t := "".join(c.get("text") or "" for c in m["contents"]
                                     if c["type"] == content))}
            assert shown == want, f"{key}: {kind}"
            chunks += sum(1 for e in got.events if e["type"] == kind)
    return chunks


@pytest.mark.parametrize(("hold", "batch"), [(True, 7), (False, 7), (True, 200)])
async def test_live_progress_replays_to_the_merged_text_held_or_stored(
    redis_url: str, namespace: str, hold: bool, batch: int
) -> None:
    """Live progress is on by default, holding turns or not: every turn's
    text and reasoning chunks, replayed, are its merged messages' texts, in
    gap-free seqs between synthesis.started and the terminal event, and the
    merge is processor merge's; held turns stay held (none stored). Batches
    of 200 entries move more than SPLIT_TURNS turns: two calls each."""
    turns = _turns(30, seed=11)
    entries = interleave(turns, random.Random(5))
    assert WorkerConfig().progress and WorkerConfig(**HOLD).hold_turns
    async with Harness(redis_url, namespace, batch=batch, hold_turns=hold) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add(entries)
        await harness.wait_merged(len(turns))
        outputs = await harness.outputs()
        held = _metric(running.worker, "processor_turns_settled_total", source="held")
        logs = await harness.client.keys(f"{{{namespace}:*}}:live:*")
    compare_with_offline(outputs, offline_results(entries))
    assert _live_texts_match(outputs) > len(turns)
    assert held == (len(turns) if hold else 0)
    assert logs == []  # each went with its turn's state when it was published


async def test_no_progress_publishes_only_the_start_and_the_outcome(
    redis_url: str, namespace: str
) -> None:
    turns = _turns(6, seed=3)
    entries = interleave(turns, random.Random(2))
    async with Harness(redis_url, namespace, batch=7, progress=False) as harness:
        await harness.start_workers(1)
        await harness.add(entries)
        await harness.wait_merged(len(turns))
        outputs = await harness.outputs()
        logs = await harness.client.keys(f"{{{namespace}:*}}:live:*")
    compare_with_offline(outputs, offline_results(entries))
    assert {tuple(e["type"] for e in t.events) for t in outputs.turns.values()} == {
        ("synthesis.started", "synthesis")}
    assert logs == []


@pytest.mark.parametrize("shards", [1, 2])
async def test_workers_hold_only_the_shards_they_read_alone(
    redis_url: str, namespace: str, shards: int
) -> None:
    """Two workers on one shard both read it: a turn's entries reach both,
    and holding would spill nearly every turn, so each stores what it reads
    (Membership.sole_reader). On two shards each reads one alone and holds."""
    turns = _turns(40, seed=13)
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
        held = sum(_metric(w.worker, "processor_turns_settled_total", source="held")
                   for w in (a, b))
        spilled = sum(_metric(w.worker, "processor_held_turns_spilled_total") for w in (a, b))
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
            return _metric(rescuer.worker, "processor_entries_consumed_total", shard="0",
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
        spilled = _metric(running.worker, "processor_held_turns_spilled_total")
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
        spilled = _metric(running.worker, "processor_held_turns_spilled_total")
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
        spilled = _metric(running.worker, "processor_held_turns_spilled_total")
        checkpoints = _metric(running.worker, "processor_held_turns_checkpointed_total")
        left = await harness.state_keys()
    assert recs == [b"state"] and spilled == 0 and checkpoints == 1
    assert response_text(outputs, "s") == "123" and left == []


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
        reclaimed = _metric(other.worker, "processor_entries_consumed_total", shard="0",
                            source="reclaim")
        await harness.stop_worker(other)
        assert await _pending(harness, holder.consumer) == 2
        await harness.add([end_entry("long")])
        await harness.wait_merged(1)
        outputs = await harness.outputs()
        held = _metric(holder.worker, "processor_turns_settled_total", source="held")
    assert reclaimed == 0 and held == 1 and response_text(outputs, "long") == "12"


async def _logged_updates(harness: Harness, response_id: str) -> list[dict[str, Any]]:
    """The updates a turn's live log holds, in order (publish_live.lua)."""
    log = harness.ns.shard(0).live(TurnKey(response_id).encode())
    return [update for _id, fields in await harness.client.xrange(log)
            for update in json.loads(fields[b"updates"])]


@pytest.mark.parametrize(("hold", "lost"), [(True, 1), (True, 2), (False, 1), (False, 2)])
async def test_a_live_publish_whose_reply_is_lost_says_each_delta_and_update_once(
    redis_url: str, namespace: str, hold: bool, lost: int
) -> None:
    """A ``publish_live`` call that ran in Redis but whose reply never came
    back (the connection cut just after): the worker learns what it did
    (the call again, which the turn's token makes a no-op that says "ran
    before") and goes on from there, so every delta is on the events stream
    once and every update in the turn's live log once, on both paths,
    whichever call (the turn's first, a later one) loses its reply."""
    rid = "lost-reply"
    updates = [text_delta(rid, f"d{i} ") for i in range(9)]
    async with Harness(redis_url, namespace, batch=3, hold_turns=hold) as harness:
        (running,) = await harness.start_workers(1)
        scripts = running.worker.scripts
        real, calls = scripts.publish_live, 0

        async def reply_lost(**kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            result = await real(**kwargs)
            if calls == lost:
                raise redis.exceptions.ConnectionError("reply lost (test)")
            return result

        scripts.publish_live = reply_lost
        for i in range(0, len(updates), 3):  # one batch each
            await harness.add(updates[i:i + 3])

            async def logged(n: int = i + 3) -> bool:
                return len(await _logged_updates(harness, rid)) >= n

            await harness.wait_for(logged, 10, f"the live log never had {i + 3} updates")
        got = await _logged_updates(harness, rid)
        events = (await harness.outputs()).turns[TurnKey(rid)].events
        await harness.add([end_entry(rid)])
        await harness.wait_merged(1)
        outputs = await harness.outputs()
    assert [u["contents"][0]["text"] for u in got] == [f"d{i} " for i in range(9)]
    assert replay_texts(events) == {"m": "".join(f"d{i} " for i in range(9))}
    assert calls > lost  # (the seam ran)
    compare_with_offline(outputs, offline_results([*updates, end_entry(rid)]))
    assert replay_texts(outputs.turns[TurnKey(rid)].events) == {"m": response_text(outputs, rid)}


async def test_a_held_turns_last_events_are_left_out_when_another_speaks_for_it(
    redis_url: str, namespace: str
) -> None:
    """The batch that ends a held turn publishes its last live events with
    its outcome (finalise_held), under the same token as publish_live: with
    the turn's `live` mark naming another worker, they are left out and the
    outcome is still published (its merged event ends any view); with this
    worker's mark they are there (test_live_progress_replays_...)."""
    rid = "other-speaker"
    first = [text_delta(rid, f"d{i} ") for i in range(3)]
    async with Harness(redis_url, namespace, batch=3, hold_turns=True) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add(first)

        async def logged() -> bool:
            return len(await _logged_updates(harness, rid)) >= 3

        await harness.wait_for(logged, 10, "the live log never had the first batch")
        turn = harness.ns.shard(0).turn(TurnKey(rid).encode())
        await harness.client.hset(turn, "live", "someone-else 1")
        async with harness.client.pipeline(transaction=True) as pipe:  # (read as one batch)
            for entry in (text_delta(rid, "d3 "), end_entry(rid)):
                pipe.xadd(harness.ns.shard(0).updates, entry_fields(entry))
            await pipe.execute()
        await harness.wait_merged(1)
        outputs = await harness.outputs()
        held = _metric(running.worker, "processor_turns_settled_total", source="held")
    events = outputs.turns[TurnKey(rid)].events
    assert replay_texts(events) == {"m": "d0 d1 d2 "}
    assert response_text(outputs, rid) == "d0 d1 d2 d3 "
    assert held == 1
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # gap-free to the terminal event


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
        held = _metric(running.worker, "processor_turns_settled_total", source="held")
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
        spilled = _metric(running.worker, "processor_held_turns_spilled_total")
        failed = _metric(running.worker, "processor_step_failures_total")
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
        scripts = running.worker.scripts
        checkpoint = scripts.checkpoint_held

        async def recorded(*, keys: list[Any], args: list[Any]) -> Any:
            rows = msgspec.msgpack.decode(args[3], type=list[list[msgspec.Raw]])
            calls.append((sum(len(msgspec.msgpack.decode(row[7], type=list[str])) for row in rows),
                          sorted(str(k).split(":turn:")[1] for k in keys[2::4])))
            return await checkpoint(keys=keys, args=args)

        scripts.checkpoint_held = recorded
        await harness.add(interleave(turns, random.Random(3)))
        await harness.wait_for(
            lambda: _metric(running.worker, "processor_held_turns_checkpointed_total") == 30, 20,
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

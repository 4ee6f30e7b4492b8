"""Live progress (on by default) of held turns and of stored ones: each
turn's chunks replay to its merged text, in gap-free seqs; without progress
only the start and the outcome are published; a ``publish_live`` whose
reply is lost says each delta and update once; and a held turn's last live
events are left out when its ``live`` mark names another worker."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import redis.exceptions
from support.held_runs import HOLD, metric, random_turns
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

from processor.engine.live_reader import replay_texts
from processor.wire.ids import TurnKey
from processor.worker.worker import WorkerConfig


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
    turns = random_turns(30, seed=11)
    entries = interleave(turns, random.Random(5))
    assert WorkerConfig().progress and WorkerConfig(**HOLD).hold_turns
    async with Harness(redis_url, namespace, batch=batch, hold_turns=hold) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add(entries)
        await harness.wait_merged(len(turns))
        outputs = await harness.outputs()
        held = metric(running.worker, "processor_turns_settled_total", source="held")
        logs = await harness.client.keys(f"{{{namespace}:*}}:live:*")
    compare_with_offline(outputs, offline_results(entries))
    assert _live_texts_match(outputs) > len(turns)
    assert held == (len(turns) if hold else 0)
    assert logs == []  # each went with its turn's state when it was published


async def test_no_progress_publishes_only_the_start_and_the_outcome(
    redis_url: str, namespace: str
) -> None:
    turns = random_turns(6, seed=3)
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
        held = metric(running.worker, "processor_turns_settled_total", source="held")
    events = outputs.turns[TurnKey(rid)].events
    assert replay_texts(events) == {"m": "d0 d1 d2 "}
    assert response_text(outputs, rid) == "d0 d1 d2 d3 "
    assert held == 1
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # gap-free to the terminal event


async def test_a_held_turn_that_spills_goes_on_in_its_live_log_without_a_repeat(
    redis_url: str, namespace: str
) -> None:
    """A held turn whose updates its live log already holds spills (an
    entry that will be dead-lettered breaks it) and goes on on the stored
    path: the stored path's first publish leaves out the updates the held
    path logged (``HandedLive.logged``), so the log holds each update once
    and its chunks replay to the merged text."""
    rid = "spills"
    before = [text_delta(rid, f"d{i} ") for i in range(6)]
    bad = {"response_id": rid, "update": '{"contents": [{"type": "text"'}  # (bad JSON)
    after = [text_delta(rid, f"d{i} ") for i in range(6, 9)]
    async with Harness(redis_url, namespace, batch=3) as harness:
        (running,) = await harness.start_workers(1)
        for i in range(0, len(before), 3):  # one batch each, each said
            await harness.add(before[i:i + 3])

            async def logged(n: int = i + 3) -> bool:
                return len(await _logged_updates(harness, rid)) >= n

            await harness.wait_for(logged, 10, f"the live log never had {i + 3} updates")
        await harness.add([bad, *after])

        async def all_logged() -> bool:
            return len(await _logged_updates(harness, rid)) >= 9

        await harness.wait_for(all_logged, 10, "the live log never had the updates after the spill")
        got = await _logged_updates(harness, rid)
        spilled = metric(running.worker, "processor_held_turns_spilled_total")
        await harness.add([end_entry(rid)])
        await harness.wait_merged(1)
        outputs = await harness.outputs()
    assert spilled == 1
    assert [u["contents"][0]["text"] for u in got] == [f"d{i} " for i in range(9)]
    compare_with_offline(outputs, offline_results([*before, bad, *after, end_entry(rid)]))
    assert replay_texts(outputs.turns[TurnKey(rid)].events) == {"m": response_text(outputs, rid)}

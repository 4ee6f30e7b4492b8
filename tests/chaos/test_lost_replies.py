"""Any reply may be lost: a worker's connection drops after Redis ran a
command and before its reply arrived, at random, for every command the
worker sends one at a time (reads, claims, take-backs, every script). Each
such failure reaches the step, whose retry must know what a lost reply
means: a read's entries taken back before the next read, a script's call
sent again unchanged and found to have run. The turns, held past
``--hold-ms`` (checkpointed) or not, merge as ``processor merge`` says,
each once, and nothing waits for a reclaim (minutes away here)."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import random
from typing import Any

import pytest
from support.chaos_plan import marker
from support.lost_replies import has_text, lose_replies
from support.strategies import random_turn
from support.turn_reference import (
    compare_with_offline,
    end_entry,
    interleave,
    offline_results,
    text_delta,
)
from support.worker_harness import Harness

from processor.wire.ids import TurnKey

#: The share of replies lost.
LOSS = 0.04
#: Seeds of the random test (``LOST_REPLY_SEEDS=40`` explores further: each
#: seed's losses fall on other commands, as timing decides).
SEEDS = int(os.environ.get("LOST_REPLY_SEEDS", "4"))


#: Each run's worker settings: turns held, held past --hold-ms
#: (checkpointed), stored, and two workers holding them.
RUNS: dict[str, tuple[int, dict[str, Any]]] = {
    "held": (1, {"hold_ms": 60_000}),
    "checkpointed": (1, {"hold_ms": 50}),
    "stored": (1, {"hold_turns": False}),
    "two-workers": (2, {"hold_ms": 50}),
}


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("seed", range(SEEDS))
async def test_turns_merge_whatever_replies_are_lost(redis_url: str, namespace: str,
                                                     run: str, seed: int) -> None:
    """Twelve random turns, interleaved, streamed to workers on two shards
    that each lose about one reply in 25."""
    workers, config = RUNS[run]
    rng = random.Random(seed)
    turns = [random_turn(rng, f"lost-{seed}-{n}", max_messages=8) for n in range(12)]
    entries = interleave(turns, rng)
    offline = offline_results(entries)
    async with Harness(redis_url, namespace, 2, reclaim_idle_ms=600_000, batch=4,
                       **config) as harness:
        lost = await _losing_workers(harness, workers, seed)
        for i in range(0, len(entries), 5):  # streamed, so that turns outlive --hold-ms
            await harness.add(entries[i:i + 5])
            await asyncio.sleep(0.01)
        await harness.wait_merged(len(offline), timeout=60)
        await harness.wait_drained(timeout=30)
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    count = sum(len(replies) for replies in lost)
    assert count >= 5, f"too few replies lost to test anything: {count}"
    compare_with_offline(outputs, offline, f"with {count} replies lost")
    assert outputs.dlq == []


#: Of the random test's twelve turns, how many are cancelled part-way.
CANCELLED = 4


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("seed", range(SEEDS))
async def test_cancels_cut_a_prefix_whatever_replies_are_lost(redis_url: str, namespace: str,
                                                              run: str, seed: int) -> None:
    """As above, with four of the twelve turns cancelled while they stream
    (their key set just before one of their entries is written, the rest
    written after it): each of those is published cancelled once, its
    partial merge the merge of a prefix of the turn (``processor merge`` of
    its first k entries and a cancel, for some k: docs/design.md,
    *Cancellation*), whatever replies are lost; the others merge as
    ``processor merge`` says."""
    workers, config = RUNS[run]
    rng = random.Random(1000 + seed)
    turns = [random_turn(rng, f"cut-{seed}-{n}", max_messages=8) for n in range(12)]
    for turn in turns:  # (each update marked, to tell which ones a merge holds)
        for i, entry in enumerate(turn):
            if "update" in entry:
                entry["update"].setdefault("additional_properties", {})[marker(i)] = 1
    entries = interleave(turns, rng)
    cuts = {id(turn[rng.randrange(len(turn))]): turn[0]["response_id"]
            for turn in rng.sample(turns, CANCELLED)}  # (the entry the cancel precedes)
    cancelled = set(cuts.values())
    offline = {key: turn for key, turn in offline_results(entries).items()
               if key.response_id not in cancelled}
    prefixes = {turn[0]["response_id"]: _prefix_merges(turn) for turn in turns
                if turn[0]["response_id"] in cancelled}
    async with Harness(redis_url, namespace, 2, reclaim_idle_ms=600_000, batch=4,
                       **config) as harness:
        lost = await _losing_workers(harness, workers, seed)
        chunk: list[dict[str, Any]] = []
        for entry in entries:  # streamed, so that turns outlive --hold-ms
            if id(entry) in cuts:
                await harness.add(chunk)
                chunk = []
                await harness.cancel(cuts[id(entry)])
            chunk.append(entry)
            if len(chunk) == 5:
                await harness.add(chunk)
                chunk = []
                await asyncio.sleep(0.01)
        await harness.add(chunk)
        await harness.wait_merged(len(turns), timeout=60)
        await harness.wait_drained(timeout=30)
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    count = sum(len(replies) for replies in lost)
    assert count >= 5, f"too few replies lost to test anything: {count}"
    for response_id, merges in prefixes.items():
        got = outputs.turns.pop(TurnKey(response_id))
        assert [m["status"] for m in got.merged] == ["cancelled"], (response_id, got.merged)
        props = json.loads(got.response).get("additional_properties") or {}
        assert got.response in merges, (
            f"{response_id}: with {count} replies lost, the partial merge is no prefix's: "
            f"it holds the updates {sorted(i for i in range(len(merges)) if marker(i) in props)} "
            f"of {len(merges) - 1} entries\nlive: {got.response}")
    compare_with_offline(outputs, offline, f"with {count} replies lost")
    assert outputs.dlq == []


async def _losing_workers(harness: Harness, workers: int, seed: int) -> list[list[Any]]:
    """Start ``workers`` workers whose clients each lose about one reply in
    25 (seeded); per worker, the replies it loses, as it loses them."""
    lost: list[list[Any]] = []
    for n in range(workers):
        running = await harness.start_worker()
        losing = random.Random(seed * 10 + n)
        lost.append(lose_replies(running.client, lambda *_, rng=losing: rng.random() < LOSS))
    return lost


def _prefix_merges(turn: list[dict[str, Any]]) -> list[str]:
    """``processor merge``'s response of a turn cut by a cancel after each
    of its prefixes (the first k entries, k from 0: cancelled before it
    began, every entry dropped)."""
    rid = turn[0]["response_id"]
    cancel = {"kind": "cancel", "response_id": rid, "reason": "test"}
    merges = [offline_results([cancel, *turn])[TurnKey(rid)].response]
    for k in range(1, len(turn) + 1):
        merges.append(offline_results([*turn[:k], cancel])[TurnKey(rid)].response)
    return merges


async def test_a_refused_finalise_spills_although_a_reply_on_the_way_is_lost(
    redis_url: str, namespace: str
) -> None:
    """A held turn's end is read while another consumer (departed, its
    entry not yet claimed) has an older entry pending: ``finalise_held``
    refuses the turn, which spills to the stored path. That spill runs in
    the finalise's own task, after the reply; its first command's reply
    (the namespace's record, read to tell a refusal from a lost state) is
    lost. The spill is retried, as every step is, rather than leaving the
    ended turn held until ``--hold-ms`` (10 minutes here)."""
    other = [text_delta("other", "x"), end_entry("other")]
    turn = [*(text_delta("refused", c) for c in "abc"), end_entry("refused")]
    offline = offline_results(other + turn)
    async with Harness(redis_url, namespace, worker_ttl=0.5, reclaim_idle_ms=600_000,
                       hold_ms=600_000) as harness:
        shard = harness.shards[0]
        await harness.client.xgroup_create(shard.updates, harness.group, id="0", mkstream=True)
        await harness.add(other[:1])
        await harness.client.xreadgroup(harness.group, "gone", {shard.updates: ">"}, count=1)
        await harness.add([*other[1:], *turn])
        await asyncio.sleep(0.6)  # "gone" is idle past --worker-ttl: departed
        running = await harness.start_worker()
        lost = lose_replies(running.client, lambda args, _reply: (
            args[0] == "HGETALL" and not lost
            and any(frame.function == "spill" for frame in inspect.stack())))
        await harness.wait_merged(2, timeout=20)
        await harness.wait_drained(timeout=20)
        outputs = await harness.outputs()
    assert lost, "no reply was lost: nothing was tested"
    compare_with_offline(outputs, offline, "a spill's reply lost")
    assert outputs.dlq == []


async def test_a_take_back_goes_on_where_a_lost_reply_cut_it(redis_url: str,
                                                             namespace: str) -> None:
    """A take-back reads every entry pending to the worker, the held ones
    too (it skips those), a few at a time. Over a connection that loses one
    reply in five of those reads, one that starts again from the first
    pending entry at each try never gets past the fourth read: the turns
    wait for ever. It goes on after the part it did, and they merge."""
    turns = [[*(text_delta(f"long-{t}", f"{t}{i} ") for i in range(12)), end_entry(f"long-{t}")]
             for t in range(3)]
    body = [e for i in range(12) for turn in turns for e in turn[i:i + 1]]
    trigger = [text_delta("trigger", "c"), end_entry("trigger")]
    warm = [text_delta("warm", "w"), end_entry("warm")]
    ends = [turn[-1] for turn in turns]
    offline = offline_results(body + warm[:1] + trigger + ends + warm[1:])
    take_back_reads: list[str] = []
    async with Harness(redis_url, namespace, reclaim_idle_ms=600_000, hold_ms=600_000,
                       batch=2) as harness:
        running = await harness.start_worker()
        await harness.add(body)  # 36 entries held, pending to the worker
        await harness.wait_for(lambda: len(running.worker.shard(0).held_ids()) == 36, 20,
                               "36 entries held")

        def loses(args: tuple[Any, ...], reply: Any) -> bool:
            if args[-1] == ">":  # the worker takes back from there on
                return args[0] == "XREADGROUP" and not lost and has_text(reply, "c")
            if args[0] == "XREADGROUP":
                take_back_reads.append(str(args[-1]))
                return len(take_back_reads) % 5 == 0
            return False

        lost = lose_replies(running.client, loses)
        # (The read waiting now was sent before: the next is the first that may lose.)
        await harness.add(warm[:1])
        await harness.wait_for(lambda: len(running.worker.shard(0).held_ids()) == 37, 20,
                               "37 entries held")
        await harness.add(trigger)
        await harness.add([*ends, *warm[1:]])
        await harness.wait_merged(5, timeout=20)
        await harness.wait_drained(timeout=20)
        outputs = await harness.outputs()
    assert lost and len(take_back_reads) >= 5, "no take-back reply was lost: nothing was tested"
    compare_with_offline(outputs, offline, "a take-back cut by lost replies")
    assert outputs.dlq == []

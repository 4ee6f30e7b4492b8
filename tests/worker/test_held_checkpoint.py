"""A turn held longer than ``--hold-ms`` is checkpointed, not spilled
(``checkpoint_held.lua``, processor.worker.held.path): its merge is
stored as one snapshot, its entries acked, and it stays held; its output,
its events and its live progress are what a turn held throughout gives,
also when the worker dies after a checkpoint."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from support.lost_replies import lose_replies
from support.turn_reference import compare_with_offline, offline_results
from support.worker_harness import Harness

from processor.engine.live_reader import replay_texts


def _turn(rid: str, pieces: int) -> list[dict[str, Any]]:
    """A turn of text updates, then its end."""
    update = {"type": "agent_response_update", "role": "assistant", "message_id": f"m-{rid}"}
    return ([{"response_id": rid, "update": json.dumps(
                {**update, "contents": [{"type": "text", "text": f"{rid}:{i} "}]})}
             for i in range(pieces)]
            + [{"response_id": rid, "kind": "end"}])


async def _stream(harness: Harness, turns: list[list[dict[str, Any]]], every: float) -> None:
    """Each turn's updates round-robin, one of each every ``every`` seconds,
    then their ends."""
    for i in range(max(len(t) for t in turns) - 1):
        await harness.add([t[i] for t in turns if i < len(t) - 1])
        await asyncio.sleep(every)
    await harness.add([t[-1] for t in turns])


def _sample(running: Any, name: str) -> float:
    return running.worker.metrics.registry.get_sample_value(name) or 0.0


async def test_a_turn_held_past_hold_ms_is_checkpointed_and_stays_held(
    redis_url: str, namespace: str
) -> None:
    """Three turns streaming 1.2 s under --hold-ms 200: several checkpoints
    each, no spill; the outputs are processor merge's, byte for byte, one
    terminal event each, live chunks that add up to the merged text, and
    nothing of the turns' state left (the snapshot goes with the turn)."""
    turns = [_turn(f"long-{n}", 30) for n in range(3)]
    offline = offline_results([e for i in range(31) for t in turns for e in t[i:i + 1]],
                              progress=True)
    async with Harness(redis_url, namespace, hold_ms=200) as harness:
        [running] = await harness.start_workers(1)
        await _stream(harness, turns, 0.04)
        await harness.wait_merged(3)
        await harness.wait_drained()
        outputs = await harness.outputs()
        leftover = await harness.state_keys()
        spilled = _sample(running, "processor_held_turns_spilled_total")
        checkpoints = _sample(running, "processor_held_turns_checkpointed_total")
    compare_with_offline(outputs, offline, "checkpointed")
    assert spilled == 0
    assert checkpoints >= 6, checkpoints
    for key, turn in outputs.turns.items():
        [message] = json.loads(turn.merged[0]["response"])["messages"]
        told = replay_texts(turn.events, "synthesis.chunk")
        assert told == {message["message_id"]: message["contents"][0]["text"]}, key
    assert leftover == [], leftover


async def test_a_worker_that_dies_after_a_checkpoint_loses_nothing(
    redis_url: str, namespace: str, tmp_path
) -> None:
    """SIGKILL of a worker holding turns it checkpointed several times, then
    the rest of the turns: another worker reclaims what was pending and
    finishes each turn from its snapshot and the entries after it, exactly
    as processor merge does."""
    turns = [_turn(f"ck-{n}", 40) for n in range(3)]
    offline = offline_results([e for i in range(41) for t in turns for e in t[i:i + 1]],
                              progress=True)
    flags = {"hold_ms": 200, "reclaim_idle_ms": 1000, "worker_ttl": 1, "progress": True}
    async with Harness(redis_url, namespace, log_dir=tmp_path) as harness:
        first = harness.spawn(**flags)
        await harness.wait_started([first])
        for i in range(25):
            await harness.add([t[i] for t in turns])
            await asyncio.sleep(0.04)

        async def checkpointed() -> bool:  # (its snapshots stored: recs hashes exist)
            shard = harness.shards[0]
            return len([k async for k in harness.client.scan_iter(
                match=f"{shard.tag}:recs:*")]) == 3

        await harness.wait_for(checkpointed, 10, "the turns checkpointed")
        for i in range(25, 30):  # held after the checkpoint, pending when it dies
            await harness.add([t[i] for t in turns])
        await asyncio.sleep(0.1)
        harness.kill(first)
        second = harness.spawn(**flags)
        await harness.wait_started([second])
        for i in range(30, 41):
            await harness.add([t[i] for t in turns])
        await harness.wait_merged(3, timeout=60)
        await harness.wait_drained(timeout=60)
        outputs = await harness.outputs()
        leftover = await harness.state_keys()
    compare_with_offline(outputs, offline, "after a checkpoint and a SIGKILL")
    assert leftover == [], leftover


async def test_a_checkpointed_turn_that_spills_goes_on_from_its_checkpoint(
    redis_url: str, namespace: str
) -> None:
    """A turn checkpointed, then held a few more entries, then spilled (here:
    the holds over their bound): the stored path follows it from its
    checkpoint, the spilled entries fed once (the worker's mirror of it used
    to be its held merge, which had them already: each counted twice), and
    it finishes as processor merge says, live chunks included."""
    [turn] = [_turn("sp", 12)]
    offline = offline_results(turn, progress=True)
    async with Harness(redis_url, namespace, hold_ms=200) as harness:
        [running] = await harness.start_workers(1)
        for entry in turn[:6]:
            await harness.add([entry])
            await asyncio.sleep(0.05)

        async def checkpointed() -> bool:
            return _sample(running, "processor_held_turns_checkpointed_total") >= 1

        await harness.wait_for(checkpointed, 10, "a checkpoint")
        running.worker.config.hold_ms = 60_000  # (no second checkpoint)
        await harness.add(turn[6:9])
        holds = running.worker.shards[0].holds

        async def held_all() -> bool:
            held = holds.turns.get(next(iter(holds.turns), None))  # type: ignore[arg-type]
            return held is not None and len(held.ids) >= 3

        await harness.wait_for(held_all, 10, "the entries after the checkpoint held")
        holds.max_turns = 0  # (over the bound: the next loop spills it)

        async def spilled() -> bool:
            return _sample(running, "processor_held_turns_spilled_total") >= 1

        await harness.wait_for(spilled, 10, "the spill")
        await harness.add(turn[9:])
        await harness.wait_merged(1)
        outputs = await harness.outputs()
        mirrored = running.worker.metrics.registry.get_sample_value(
            "processor_turns_settled_total", {"source": "mirror"})
    compare_with_offline(outputs, offline, "spilled after a checkpoint")
    [out] = outputs.turns.values()
    [message] = json.loads(out.merged[0]["response"])["messages"]
    assert replay_texts(out.events, "synthesis.chunk") == {
        message["message_id"]: message["contents"][0]["text"]}
    assert mirrored == 1  # (published from the mirror that followed it from its checkpoint)


async def test_no_checkpoint_while_an_older_entry_is_pending_to_another_consumer(
    redis_url: str, namespace: str
) -> None:
    """A turn's first entry was read by a consumer that died with it pending;
    this worker holds the turn's later entries past --hold-ms. A snapshot of
    what it holds would miss that entry, and the stored path would replay
    it after the snapshot once it is reclaimed (the merged text out of
    order; seen in the cluster chaos soak): the turn is not checkpointed
    (``HELD_ELSEWHERE``) but spilled, and the reclaimed entry lands in
    order, as processor merge says."""
    turn = _turn("older", 8)
    async with Harness(redis_url, namespace, hold_ms=200, reclaim_idle_ms=600) as harness:
        shard = harness.shards[0]
        await harness.client.xgroup_create(shard.updates, harness.group, id="0", mkstream=True)
        await harness.add(turn[:1])
        await harness.client.xreadgroup(harness.group, "gone", {shard.updates: ">"}, count=1)
        [running] = await harness.start_workers(1)
        for entry in turn[1:6]:
            await harness.add([entry])
            await asyncio.sleep(0.1)

        async def refused() -> bool:  # (held past --hold-ms: a checkpoint was tried)
            return _sample(running, "processor_held_turns_spilled_total") >= 1 \
                or _sample(running, "processor_held_turns_checkpointed_total") >= 1

        await harness.wait_for(refused, 10, "a checkpoint or a spill")
        checkpoints = _sample(running, "processor_held_turns_checkpointed_total")
        await harness.add(turn[6:])
        await harness.wait_merged(1, timeout=30)
        await harness.wait_drained(timeout=30)
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline_results(turn), "an older entry reclaimed")
    assert checkpoints == 0


async def test_no_checkpoint_while_a_claim_reply_is_lost(redis_url: str, namespace: str) -> None:
    """A turn's first entry was read by a consumer that died with it
    pending; this worker holds the turn's later entries. Its claim of the
    dead consumer's entry (``XCLAIM``) succeeds in Redis but the reply is
    lost: the entry is now pending to this worker, unknown to it until the
    take-back before its next read. The batch read ahead meanwhile is
    applied first, and the turn comes due for a checkpoint then: no other
    consumer has an entry pending, so ``checkpoint_held`` would accept it
    (its snapshot without the first entry, which the take-back would store
    after it: the text out of order). While entries it does not know of may
    be pending, the worker checkpoints nothing; the turn merges as processor
    merge says."""
    turn = _turn("claimed", 8)
    async with Harness(redis_url, namespace, batch=2, worker_ttl=0.5,
                       reclaim_idle_ms=600_000, hold_ms=600_000) as harness:
        shard = harness.shards[0]
        await harness.client.xgroup_create(shard.updates, harness.group, id="0", mkstream=True)
        await harness.add(turn[:1])
        await harness.client.xreadgroup(harness.group, "gone", {shard.updates: ">"}, count=1)
        await harness.add(turn[1:])
        await asyncio.sleep(0.6)  # "gone" is idle past --worker-ttl: departed
        running = await harness.start_worker()

        def the_claim(args: tuple[Any, ...], reply: Any) -> bool:
            if args[0] != "XCLAIM" or "JUSTID" in args or not reply or lost:
                return False
            running.worker.config.hold_ms = 1  # from here on the held turn is due
            return True

        lost = lose_replies(running.client, the_claim)
        await harness.wait_merged(1, timeout=20)
        await harness.wait_drained(timeout=20)
        outputs = await harness.outputs()
    assert lost, "no claim reply was lost: nothing was tested"
    compare_with_offline(outputs, offline_results(turn), "a claim's reply lost")

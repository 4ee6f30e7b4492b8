"""A cancelled turn's partial merge keeps every entry a worker had taken in
before the cancel was seen, and is a prefix of the turn (docs/design.md,
*Cancellation*: the cut). Each race is driven step by step, so it happens
every time: another worker sweeping the cancel of a turn this one holds, a
held turn spilled after its cancel was set, a turn held in part here and
stored in part elsewhere, an older entry still in a dead worker's hands,
a read applied after another worker stored a later entry, and an end first
met with the key outside a read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.stepped import Stepped
from support.turn_reference import end_entry, response_text, text_delta
from support.worker_harness import Harness

from processor.redis_io.replies import entry_of
from processor.scripts.stored_calls import build_apply
from processor.wire.ids import TurnKey
from processor.worker.held.batch import decode_batch
from processor.worker.worker import Worker


def meta(outputs: Any, response_id: str) -> dict[str, Any]:
    turn = outputs.turns[TurnKey(response_id)]
    assert len(turn.merged) == 1
    return dict(json.loads(turn.merged[0]["meta"]))


def status(outputs: Any, response_id: str) -> str:
    return str(outputs.turns[TurnKey(response_id)].merged[0]["status"])


async def test_a_worker_that_does_not_read_the_shard_leaves_a_held_turn_to_its_holder(
    redis_url: str, namespace: str
) -> None:
    """Another worker's cancel sweep (it sweeps shards it does not read, once
    a beat) found the cancel of a turn this worker holds: it published the
    turn with nothing (the held entries are only in the holder's memory) and
    the holder's entries were then dropped. It must leave the turn to the
    holder, which publishes it with what it holds."""
    async with Harness(redis_url, namespace) as harness:
        holder = await Stepped(harness).start()
        shard = holder.shard
        await harness.add([text_delta("c", "never "), text_delta("c", "finished")])
        await holder.step()
        assert TurnKey("c") in holder.worker.shard(0).held_turns
        await harness.cancel("c")
        other = Worker(harness.client, harness.worker_config(consumer="other"))
        await other.sweeper.sweep(shard, False)  # a shard it does not read: cancels only
        assert await harness.merged_count() == 0
        await holder.worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "c") == "cancelled"
    assert response_text(outputs, "c") == "never finished"
    assert meta(outputs, "c")["counts"]["updates"] == 2
    assert outputs.terminal_counts()[TurnKey("c")] == 1


async def test_a_held_turn_spilled_after_its_cancel_keeps_what_was_held(
    redis_url: str, namespace: str
) -> None:
    """A held turn goes to the stored path (held too long, the shard moved,
    stopping) after its cancel key was set but before the holder's sweep saw
    it: apply_entries found the key and dropped every held entry, so the
    turn was published cancelled with nothing."""
    async with Harness(redis_url, namespace) as harness:
        holder = await Stepped(harness).start()
        worker, shard = holder.worker, holder.shard
        await harness.add([text_delta("s", "kept "), text_delta("s", "whole")])
        await holder.step()
        await harness.cancel("s")
        await worker.held.spill_due(shard, True)  # e.g. stopping
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "s") == "cancelled"
    assert response_text(outputs, "s") == "kept whole"
    assert meta(outputs, "s")["counts"]["dropped"] == 0


async def test_a_turn_held_in_part_and_stored_in_part_is_cancelled_whole(
    redis_url: str, namespace: str
) -> None:
    """The shard moved while a turn ran: its first delta is held by the old
    reader, its second stored by the new one, then the turn is cancelled.
    The new reader published "finished" (the first delta lost, the partial
    merge no longer a prefix of the turn); it must wait for the held delta,
    which the old reader stores when it sees the cancel."""
    async with Harness(redis_url, namespace) as harness:
        holder = await Stepped(harness).start()
        shard = holder.shard
        await harness.add([text_delta("h", "never ")])
        await holder.step()
        await harness.add([text_delta("h", "finished")])
        other = Worker(harness.client, harness.worker_config(consumer="other"))
        read = [entry_of(e) for e in await holder.read("other")]
        # (the stored path: an open turn's hash exists)
        await other.stored.store(shard, read, {})
        await harness.cancel("h")
        await other.sweeper.sweep(shard)
        assert await harness.merged_count() == 0
        await holder.worker.sweeper.sweep(shard)  # sees the cancel: stores what it holds
        await other.sweeper.sweep(shard)
        await holder.worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "h") == "cancelled"
    assert response_text(outputs, "h") == "never finished"
    assert outputs.terminal_counts()[TurnKey("h")] == 1


async def test_a_cancel_waits_for_an_earlier_entry_in_a_dead_workers_hands(
    redis_url: str, namespace: str
) -> None:
    """Storing every entry: a worker read the first delta and died; another
    stored the second; the cancel published "finished" alone and the first
    delta, reclaimed later, was dropped. The cancel must wait until every
    entry read before it was seen is applied (here: reclaimed), so the
    partial merge is "never finished"; an entry that arrives after the
    cancel was seen and is applied before the publish is counted dropped."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness, hold_turns=False, reclaim_idle_ms=50).start()
        worker, shard = stepped.worker, stepped.shard
        await harness.add([text_delta("d", "never ")])
        await stepped.read("dead")
        await harness.add([text_delta("d", "finished")])
        await worker.stored.store(shard, [entry_of(e) for e in await stepped.read()], {})
        await harness.cancel("d")
        await worker.sweeper.sweep(shard)
        assert await harness.merged_count() == 0
        await harness.add([text_delta("d", " late")])  # after the cancel was seen
        await worker.stored.store(shard, [entry_of(e) for e in await stepped.read()], {})
        assert await harness.merged_count() == 0
        await harness.wait_for(_idle_past(harness, shard, 50), 5, "dead entry idle")
        await worker.recovery.reclaim(shard)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "d") == "cancelled"
    assert response_text(outputs, "d") == "never finished"
    assert meta(outputs, "d")["counts"]["dropped"] == 1
    assert outputs.dlq == []


async def test_an_end_read_before_the_cancel_was_seen_still_completes_the_turn(
    redis_url: str, namespace: str
) -> None:
    """The cut is where the cancel was first seen: a turn whose end a worker
    had already been given then completes, whoever applies it."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness, hold_turns=False).start()
        worker, shard = stepped.worker, stepped.shard
        await harness.add([text_delta("e", "all")])
        await worker.stored.store(shard, [entry_of(e) for e in await stepped.read()], {})
        await harness.add([end_entry("e")])
        pending = [entry_of(e) for e in await stepped.read("slow")]
        await harness.cancel("e")
        await worker.sweeper.sweep(shard)  # sees the cancel; the end is pending elsewhere
        assert await harness.merged_count() == 0
        call = build_apply(shard, pending, {}, worker.options, 0)
        await worker.scripts.apply_entries(keys=call.keys, args=call.argv("slow", ""))
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "e") == "completed"
    assert response_text(outputs, "e") == "all"


@pytest.mark.parametrize("hold_turns", [True, False], ids=["held", "stored"])
async def test_an_end_taken_in_after_the_cancel_was_set_does_not_complete_the_turn(
    redis_url: str, namespace: str, hold_turns: bool
) -> None:
    """The cancel key is set, then the turn's last delta and its end are sent
    (Producer.stream over Producer.watch does exactly this: the watch stops
    on the key, and stream sends the end), and the worker takes the end in
    before any sweep saw the key. The stored path meets the key applying the
    end's batch and cuts before it: cancelled. The held path reads no key
    when it routes a batch, and its finalise published the turn `completed`:
    same entries, same key, another outcome depending on which path held the
    turn (tests/deploy/test_acl_producers.py's producer test failed so once numbered entries
    took the held path). Now finalise_held meets the key and cuts at the end
    (what the holder routed before it, which it may have shown live, is
    merged): cancelled on both paths, without the end."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness, hold_turns=hold_turns).start()
        worker, shard = stepped.worker, stepped.shard

        async def step() -> None:  # (the stored path: as the shard loop prepares a batch)
            if hold_turns:
                await stepped.step()
                return
            read = [entry_of(e) for e in await stepped.read()]
            call = build_apply(shard, read, {}, worker.options, 0)
            call.newest, call.read_from = True, read[0][0]  # (read with XREADGROUP >)
            await worker.stored.store(shard, read, {}, call)

        await harness.add([text_delta("x", "kept "), text_delta("x", "whole")])
        await step()
        assert (TurnKey("x") in worker.shard(0).held_turns) == hold_turns
        await harness.cancel("x", reason="user")
        await harness.add([text_delta("x", " last"), end_entry("x")])
        await step()  # the end's batch, read after the key was set
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "x") == "cancelled"
    assert meta(outputs, "x")["cancel_reason"] == "user"
    if hold_turns:  # the cut: the end
        assert response_text(outputs, "x") == "kept whole last"
        assert meta(outputs, "x")["counts"]["dropped"] == 1
    else:  # the cut: the end's batch
        assert response_text(outputs, "x") == "kept whole"
        assert meta(outputs, "x")["counts"]["dropped"] == 2
    assert outputs.terminal_counts()[TurnKey("x")] == 1
    assert outputs.dlq == []


async def test_a_cancel_met_applying_a_read_keeps_what_another_worker_stored_after_it(
    redis_url: str, namespace: str
) -> None:
    """Two workers read one shard (storing, as on a shared shard): one read
    the turn's second delta and was slow to apply it; the other read and
    stored the third meanwhile; then the cancel. The slow one meets the key
    applying its read, and cut the turn just before that read (what it read
    counted as read after the cancel): its delta was dropped, the third
    merged, "never finished" published, no prefix of the turn. The cut never
    goes below what is stored of the turn (``stored_to``)."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness, hold_turns=False).start()
        worker, shard = stepped.worker, stepped.shard
        other = Worker(harness.client, harness.worker_config(consumer="other",
                                                             hold_turns=False))
        await harness.add([text_delta("s", "never ")])
        await worker.stored.store(shard, [entry_of(e) for e in await stepped.read()], {})
        await harness.add([text_delta("s", "ever ")])
        slow = [entry_of(e) for e in await stepped.read()]
        await harness.add([text_delta("s", "finished")])
        await other.stored.store(shard, [entry_of(e) for e in await stepped.read("other")], {})
        await harness.cancel("s")
        call = build_apply(shard, slow, {}, worker.options, 0)
        call.newest, call.read_from = True, slow[0][0]  # (read with XREADGROUP >)
        await worker.stored.store(shard, slow, {}, call)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "s") == "cancelled"
    assert response_text(outputs, "s") == "never ever finished"
    assert meta(outputs, "s")["counts"]["dropped"] == 0
    assert outputs.terminal_counts()[TurnKey("s")] == 1


@pytest.mark.parametrize("hold_turns", [True, False], ids=["held", "stored"])
async def test_an_end_first_met_with_the_cancel_off_a_read_does_not_complete_the_turn(
    redis_url: str, namespace: str, hold_turns: bool
) -> None:
    """The cancel key is set, then the turn's end is sent, and the first
    script to meet the key applies the end outside a read: a take-back (the
    end's read lost its reply), a reclaim, or a held turn's spill (its
    finalise waits while entries unknown to the worker may be pending to
    it). Such a call cut the turn after everything delivered, the end too:
    the turn completed, where the same entries read and applied as usual
    end it cancelled. The end taken in while the key exists is left out
    wherever it is applied, as finalise_held leaves it out."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness, hold_turns=hold_turns).start()
        worker, shard = stepped.worker, stepped.shard
        await harness.add([text_delta("t", "all")])
        if hold_turns:
            await stepped.step()
            assert TurnKey("t") in worker.shard(0).held_turns
        else:
            await worker.stored.store(shard, [entry_of(e) for e in await stepped.read()], {})
        await harness.cancel("t", reason="user")
        await harness.add([end_entry("t")])
        if hold_turns:
            worker.shard(0).orphans = True  # (a reply lost: the end's finalise spills the turn)
            await stepped.step()
        else:  # its read's reply lost: taken back (no read_from)
            taken = [entry_of(e) for e in await stepped.read()]
            await worker.stored.store(shard, taken, {})
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "t") == "cancelled"
    assert meta(outputs, "t")["cancel_reason"] == "user"
    assert response_text(outputs, "t") == "all"
    assert meta(outputs, "t")["counts"]["dropped"] == 1
    assert outputs.terminal_counts()[TurnKey("t")] == 1
    assert outputs.dlq == []


async def test_an_end_read_ahead_when_a_sweep_meets_the_cancel_does_not_complete_the_turn(
    redis_url: str, namespace: str
) -> None:
    """The cancel key is set, then the turn's end is sent; the worker's
    reader reads the end's batch ahead of its applier, and the applier's
    sweep meets the key first. The sweep cut after everything delivered,
    the batch read ahead too: its end, applied next, completed the turn.
    What a worker has read but not taken in counts as read after the
    cancel, as a read apply_entries meets the key applying does."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness, hold_turns=False).start()
        worker, shard = stepped.worker, stepped.shard
        state = worker.shard(0)
        await harness.add([text_delta("r", "all")])
        await worker.stored.store(shard, [entry_of(e) for e in await stepped.read()], {})
        await harness.cancel("r", reason="user")
        await harness.add([end_entry("r")])
        ahead = [entry_of(e) for e in await stepped.read()]
        state.read_batch(ahead)  # (read ahead: not applied yet)
        await worker.sweeper.sweep(shard)  # meets the key first: published without the end
        state.batch_done(ahead)
        call = build_apply(shard, ahead, {}, worker.options, 0)
        call.newest, call.read_from = True, ahead[0][0]
        await worker.stored.store(shard, ahead, {}, call)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "r") == "cancelled"
    assert response_text(outputs, "r") == "all"
    assert outputs.terminal_counts()[TurnKey("r")] == 1
    assert outputs.dlq == []  # (the end, applied after the publish, is dropped)


async def test_an_end_whose_read_reply_was_lost_when_a_sweep_meets_the_cancel_is_left_out(
    redis_url: str, namespace: str
) -> None:
    """As above, the end's read losing its reply instead: the end is
    pending to the worker, which has not taken it in, when its sweep meets
    the key; the take-back applies it after. A read whose reply was lost
    counts as read after the cancel, as one read ahead does."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness, hold_turns=False).start()
        worker, shard = stepped.worker, stepped.shard
        state = worker.shard(0)
        await harness.add([text_delta("l", "all")])
        first = await stepped.read()
        state.read_done(first[-1][0].decode(), 4)
        await worker.stored.store(shard, [entry_of(e) for e in first], {})
        await harness.cancel("l", reason="user")
        await harness.add([end_entry("l")])
        await stepped.read()  # delivered; its reply lost:
        state.reply_lost()
        await worker.sweeper.sweep(shard)  # meets the key first
        await worker.recovery.take_back(shard)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "l") == "cancelled"
    assert response_text(outputs, "l") == "all"
    assert outputs.terminal_counts()[TurnKey("l")] == 1
    assert outputs.dlq == []


async def test_a_spill_that_meets_the_cancel_leaves_out_what_is_read_ahead(
    redis_url: str, namespace: str
) -> None:
    """As above, holding the turn: the cancel key set, the turn's end read
    ahead of the applier, and a spill of the held turn (held too long, say)
    is the first to meet the key. It cut after everything delivered, the
    end too, which then completed the turn. What is read and not routed
    counts as read after the cancel: the held entries are kept, the end
    dropped."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness).start()
        worker, shard = stepped.worker, stepped.shard
        state = worker.shard(0)
        await harness.add([text_delta("k", "kept")])
        await stepped.step()
        assert TurnKey("k") in state.held_turns
        await harness.cancel("k", reason="user")
        await harness.add([end_entry("k")])
        ahead = await stepped.read()
        state.floor_marks.read(ahead[0][0].decode(), ahead[-1][0].decode())  # (read ahead)
        await worker.held.spill(shard, [TurnKey("k")], "due")  # meets the key first
        await worker.held.apply_held(shard, ahead, decode_batch(shard, ahead, worker.options, 0))
        await worker.held.settle(shard)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert status(outputs, "k") == "cancelled"
    assert response_text(outputs, "k") == "kept"
    assert outputs.terminal_counts()[TurnKey("k")] == 1
    assert outputs.dlq == []


def _idle_past(harness: Harness, shard: Any, ms: int) -> Any:
    async def idle() -> bool:
        pending = await harness.client.xpending_range(shard.updates, harness.group, "-", "+", 10)
        return all(p["time_since_delivered"] >= ms for p in pending)
    return idle

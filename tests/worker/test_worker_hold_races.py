"""Held turns (``--hold-turns``) where another consumer, a cut connection
or a reclaim gets in the way, driven step by step (the test reads for the
worker and hands it each batch), each found by the chaos soak: whatever
happens, a turn is published whole, once (docs/reliability.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.exceptions
from support.stepped import Stepped, settled_count
from support.turn_reference import end_entry, response_text, text_delta
from support.worker_harness import Harness

from processor.redis_io.replies import entry_of
from processor.scripts.stored_calls import build_apply
from processor.wire.ids import TurnKey
from processor.worker.held.batch import decode_batch


async def _cut(*args: Any) -> None:
    raise redis.exceptions.ConnectionError("cut")


async def test_a_turn_held_here_and_stored_elsewhere_is_published_whole(
    redis_url: str, namespace: str
) -> None:
    """Found by the chaos soak: a turn this worker holds part of, whose other
    entries (its end among them) another consumer stored. The watermark
    skips this worker's own held entries, so the stored path finds the turn
    ready here: the worker must store what it holds of it before
    publishing it, or those entries end up dead-lettered as turn_closed.
    Driven step by step (the worker's reads made by the test) so that the
    other consumer gets exactly the entries it should."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness).start()
        worker, shard = stepped.worker, stepped.shard
        await harness.add([text_delta("u", "1")])
        await stepped.step()
        assert TurnKey("u") in worker.shard(0).held_turns
        await harness.add([text_delta("u", "2"), end_entry("u")])
        # Another consumer stores them:
        others = [entry_of(e) for e in await stepped.read("other")]
        call = build_apply(shard, others, {}, worker.options, 0)
        await worker.scripts.apply_entries(keys=call.keys, args=call.argv("other", ""))
        await harness.add([text_delta("v", "x")])
        await stepped.step()  # its floor is now past u's end
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert response_text(outputs, "u") == "12" and outputs.dlq == []


async def test_entries_reclaimed_but_not_applied_are_waited_for(
    redis_url: str, namespace: str
) -> None:
    """Found by the chaos soak under load: a reclaim's apply cut by a
    connection error leaves the claimed entries pending to this worker,
    neither held nor applied; neither a held turn's publish nor the
    watermark's floor may pass them. The turn waits until they are taken
    back, and is published whole."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness, reclaim_idle_ms=100).start()
        worker, shard = stepped.worker, stepped.shard
        await harness.add([text_delta("u", "1")])
        await stepped.read("dead")  # a worker that died holding it
        await asyncio.sleep(0.2)
        real = worker.recovery.apply
        worker.recovery.apply = _cut
        with pytest.raises(redis.exceptions.ConnectionError):
            await worker.recovery.reclaim(shard)
        worker.recovery.apply = real
        await harness.add([text_delta("u", "2"), end_entry("u")])
        await stepped.step()
        assert await harness.merged_count() == 0  # waits for "1", pending here
        await worker.recovery.take_back(shard)  # what the loop does before its next read
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert response_text(outputs, "u") == "12" and outputs.dlq == []


async def test_a_spill_cut_by_a_connection_error_is_waited_for(
    redis_url: str, namespace: str
) -> None:
    """Found by the chaos soak under load: a spill whose apply_entries call
    a connection error cut leaves the turn's entries pending, no longer held
    and maybe not applied; the turn's end, stored next, must wait for them."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness).start()
        worker, shard = stepped.worker, stepped.shard
        await harness.add([text_delta("s", "1")])
        await stepped.step()
        real = worker.stored.store
        worker.stored.store = _cut  # type: ignore[method-assign]
        with pytest.raises(redis.exceptions.ConnectionError):
            await worker.held.spill(shard, [TurnKey("s")], "due")
        worker.stored.store = real  # type: ignore[method-assign]
        await harness.add([text_delta("s", "2"), end_entry("s")])
        await stepped.step()
        assert await harness.merged_count() == 0  # waits for "1", pending here
        await worker.recovery.take_back(shard)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    assert response_text(outputs, "s") == "12" and outputs.dlq == []


async def test_a_batch_read_ahead_has_its_new_turns_opened_before_it_is_applied(
    redis_url: str, namespace: str
) -> None:
    """The reader opens a held batch's new turns as soon as it has read it
    (the round trip overlaps the applier's work on the batch before); the
    applier then opens nothing more (nor looks for turns to open), and the
    turn is published whole, once."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness).start()
        worker, shard = stepped.worker, stepped.shard
        await harness.add([text_delta("a", "1"), text_delta("a", "2"), end_entry("a")])
        entries = await stepped.read()
        call = decode_batch(shard, entries, worker.options, 0)
        await worker.held.open_ahead(shard, call)
        assert TurnKey("a") in worker.shard(0).held_turns
        assert await harness.client.exists(shard.turn(TurnKey("a").encode())) == 1
        worker.scripts.open_turns = _cut  # the applier must not open it again
        holds, looked = worker.shard(0).holds, []
        holds.to_open = lambda decoded: looked.append(decoded) or {}  # type: ignore[method-assign]
        await worker.held.apply_held(shard, entries, call)
        await worker.held.settle(shard)  # (its finalise committed, as the shard loop does)
        outputs = await harness.outputs()
    assert response_text(outputs, "a") == "12" and outputs.dlq == [] and looked == []
    events = [e["type"] for e in outputs.turns[TurnKey("a")].events]
    assert events.count("synthesis.started") == 1 and outputs.terminal_counts()[TurnKey("a")] == 1


async def test_an_open_ahead_cut_by_a_connection_error_is_left_to_the_applier(
    redis_url: str, namespace: str
) -> None:
    """The reader's open is best effort: cut, it changes nothing, and the
    applier opens the turn and holds it."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness).start()
        worker, shard = stepped.worker, stepped.shard
        await harness.add([text_delta("b", "1"), end_entry("b")])
        entries = await stepped.read()
        call = decode_batch(shard, entries, worker.options, 0)
        real = worker.scripts.open_turns
        worker.scripts.open_turns = _cut
        await worker.held.open_ahead(shard, call)
        assert TurnKey("b") not in worker.shard(0).held_turns
        worker.scripts.open_turns = real
        await worker.held.apply_held(shard, entries, call)
        await worker.held.settle(shard)  # (its finalise committed, as the shard loop does)
        outputs = await harness.outputs()
    assert response_text(outputs, "b") == "1" and outputs.dlq == []
    assert settled_count(worker, "held") == 1


async def test_the_reader_and_the_applier_opening_at_once_open_each_turn_once(
    redis_url: str, namespace: str
) -> None:
    """The applier opens what the reader's open left (it failed, say) while
    the reader opens the next batch, which starts with the same turn: one
    ``open_turns`` must carry it, else the second finds the first's hash and
    calls the turn stored while it is held."""
    async with Harness(redis_url, namespace) as harness:
        stepped = await Stepped(harness).start()
        worker, shard = stepped.worker, stepped.shard
        await harness.add([text_delta("c", "1")])
        first = decode_batch(shard, await stepped.read(), worker.options, 0)
        await harness.add([text_delta("c", "2")])
        second = decode_batch(shard, await stepped.read(), worker.options, 0)
        real, carried = worker.scripts.open_turns, []

        async def counted(*, keys: list[Any], args: list[Any]) -> Any:
            carried.append(args[1])
            await asyncio.sleep(0.01)  # long enough for the other open to start
            return await real(keys=keys, args=args)

        worker.scripts.open_turns = counted
        await asyncio.gather(worker.held.open_batch(shard, first),
                             worker.held.open_ahead(shard, second))
    holds = worker.shard(0).holds
    assert carried == [1] and TurnKey("c") in holds.turns and TurnKey("c") not in holds.old

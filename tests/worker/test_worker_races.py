"""Delivery orders a busy deployment produces, made deterministic: entries of
one turn held by a consumer that stalls (or died) while later entries of the
same turn are applied by another worker, then handed over. The merged
response must still be ``processor merge``'s of the entries in stream order.

The worker is driven step by step through its own methods (read, apply,
sweep); a "ghost" consumer reads entries and sits on them.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio
from support.turn_reference import compare_with_offline, offline_dead, offline_results
from support.worker_harness import Harness

from processor.engine.lifecycle import Limits
from processor.wire.keys import Shard
from processor.worker.worker import Worker


def _update(text: str) -> dict:
    return {"type": "agent_response_update", "role": "assistant", "message_id": "m1",
            "contents": [{"type": "text", "text": text}]}


class Stepper:
    """One worker and one ghost consumer on shard 0, moved by hand."""

    def __init__(self, harness: Harness, client: Any, **config: Any) -> None:
        self.harness = harness
        self.shard: Shard = harness.shards[0]
        self.worker = Worker(client, harness.worker_config(consumer="stepper", **config))

    async def start(self) -> None:
        await self.worker.ensure_groups()

    async def ghost_reads(self, count: int) -> list[str]:
        reply = await self.harness.client.xreadgroup(
            self.harness.group, "ghost", {self.shard.updates: ">"}, count=count)
        return [i.decode() for i, _ in reply[0][1]]

    async def read_and_apply(self) -> None:
        await self.worker.runner(self.shard.index).read_once()

    async def hand_over(self, ids: list[str]) -> None:
        """The ghost's entries go to the worker (as a reclaim would) and are applied."""
        claimed = await self.harness.client.xclaim(
            self.shard.updates, self.harness.group, "stepper", 0, ids)
        await self.worker.stored.store(self.shard, claimed, {i: 2 for i in ids})

    async def sweep(self) -> None:
        await self.worker.sweeper.sweep(self.shard)


async def _run(redis_url: str, namespace: str, stream: list[dict], limits: Limits,
               script: Any) -> tuple[Any, list[str]]:
    async with Harness(redis_url, namespace, limits=limits) as harness:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            stepper = Stepper(harness, client)
            await stepper.start()
            ids = await harness.add(stream)
            await script(stepper, harness, ids)
            # Whatever is left is finished by an ordinary running worker.
            await harness.start_worker()
            await harness.wait_drained()
            outputs = await harness.outputs()
        finally:
            await client.aclose()
    return outputs, ids


async def test_limit_crossed_out_of_order(redis_url: str, namespace: str) -> None:
    """Updates applied out of stream order reach the update limit "early" in
    apply order; the turn must still end where the stream order says."""
    limits = Limits(max_turn_updates=5)
    stream = [{"response_id": "lim", "update": _update(f"<{i}>")} for i in range(1, 8)]
    stream.append({"response_id": "lim", "kind": "end"})

    async def script(s: Stepper, harness: Harness, ids: list[str]) -> None:
        held = await s.ghost_reads(3)  # u1 u2 u3 stall
        await s.read_and_apply()  # u4..u7 and end applied
        await s.hand_over(held[:2])  # u1 u2 applied: 6 updates applied, u3 still held
        await s.sweep()
        await s.hand_over(held[2:])  # u3 at last
        await s.sweep()

    outputs, ids = await _run(redis_url, namespace, stream, limits, script)
    compare_with_offline(outputs, offline_results(stream, limits), "limit out of order")
    live = sorted((d["source_id"], d["reason"]) for d in outputs.dlq)
    assert live == sorted((ids[i], r) for i, r, _ in offline_dead(stream, limits))


async def test_cancel_after_end_while_earlier_entry_held(redis_url: str, namespace: str) -> None:
    """The end was applied, an earlier entry is still held elsewhere, then the
    turn is cancelled: the cancel came after the end, so it changes nothing
    (docs/contract.md §6) and the held entry is merged, not lost."""
    stream = [{"response_id": "cae", "update": _update("first")},
              {"response_id": "cae", "update": _update(" second")},
              {"response_id": "cae", "kind": "end"}]

    async def script(s: Stepper, harness: Harness, ids: list[str]) -> None:
        held = await s.ghost_reads(1)
        await s.read_and_apply()
        await harness.cancel("cae")
        await s.sweep()  # sees the cancel key
        await s.hand_over(held)
        await s.sweep()

    outputs, _ = await _run(redis_url, namespace, stream, Limits(), script)
    offline = offline_results([*stream, {"kind": "cancel", "response_id": "cae"}])
    compare_with_offline(outputs, offline, "cancel after end")
    assert outputs.dlq == []


async def test_timeout_while_earlier_entry_held(redis_url: str, namespace: str) -> None:
    """The end was applied but an earlier entry is held past the turn timeout:
    the turn ended (in stream order) before it could time out, so it completes
    with every entry once the held one is applied."""
    limits = Limits(turn_timeout=0.05)
    stream = [{"response_id": "late", "update": _update("first")},
              {"response_id": "late", "update": _update(" second")},
              {"response_id": "late", "kind": "end"}]

    async def script(s: Stepper, harness: Harness, ids: list[str]) -> None:
        held = await s.ghost_reads(1)
        await s.read_and_apply()
        import asyncio

        await asyncio.sleep(0.2)
        await s.sweep()  # the turn is idle past its timeout
        await s.hand_over(held)
        await s.sweep()

    outputs, _ = await _run(redis_url, namespace, stream, limits, script)
    compare_with_offline(outputs, offline_results(stream, limits), "timeout vs held entry")
    assert outputs.dlq == []


async def test_cancelled_before_start_then_worker_dies(redis_url: str, namespace: str) -> None:
    """A turn cancelled before its first entry: the worker that drops its
    entries dies before finalising. Another worker still publishes the
    cancelled turn, and no state is left behind."""
    stream = [{"response_id": "gone", "update": _update("never")},
              {"response_id": "gone", "kind": "end"}]

    async def script(s: Stepper, harness: Harness, ids: list[str]) -> None:
        async def no_finalise(*_args: object) -> None:
            return None

        s.worker.finaliser.finalise = no_finalise  # type: ignore[method-assign]
        await s.read_and_apply()

    async with Harness(redis_url, namespace) as harness:
        await harness.cancel("gone")
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            stepper = Stepper(harness, client)
            await stepper.start()
            ids = await harness.add(stream)
            await script(stepper, harness, ids)
        finally:
            await client.aclose()
        await harness.start_worker()
        await harness.wait_merged(1)
        await harness.wait_drained()
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    [turn] = outputs.turns.values()
    assert turn.result()["status"] == "cancelled"
    assert turn.result()["meta"]["counts"]["dropped"] == 2

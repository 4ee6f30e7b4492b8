"""processor.client against a real Redis: Subscriber (every shard, resume, wait_for), and
producer, worker and subscriber end to end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
from agent_framework import AgentResponseUpdate, Content
from support.records import init_namespace

from processor.client import (
    EventItem,
    MergedItem,
    Producer,
    Subscriber,
)
from processor.wire.ids import TurnKey, response_id_for_turn, shard_of
from processor.wire.keys import Namespace


def _ids_on_distinct_shards(shards: int) -> list[str]:
    """One response id per shard, shard i first."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < shards:
        found.setdefault(shard_of(f"resp_{n}", shards), f"resp_{n}")
        n += 1
    return [found[i] for i in range(shards)]


async def _collect(iterator: Any) -> list[Any]:
    return [item async for item in iterator]


# --------------------------------------------------------------------------- subscriber


async def _publish_merged(client: Any, stream: str, rid: str, text: str, attempt: str = "") -> str:
    key = TurnKey(rid, attempt)
    response = {
        "type": "agent_response",
        "response_id": rid,
        "messages": [
            {
                "type": "message",
                "role": "assistant",
                "contents": [{"type": "text", "text": text}],
                "message_id": "m1",
            }
        ],
    }
    fields = {
        "type": "merged",
        "response_id": rid,
        "synthesis_id": key.synthesis_id(),
        "status": "completed",
        "response": json.dumps(response),
        "meta": json.dumps({"counts": {"updates": 1}}),
    }
    if attempt:
        fields["attempt_id"] = attempt
    return (await client.xadd(stream, fields)).decode()


async def _publish_event(client: Any, stream: str, rid: str, seq: int) -> str:
    synthesis = TurnKey(rid).synthesis_id()
    event = {
        "type": "synthesis.started",
        "synthesis_id": synthesis,
        "response_id": rid,
        "seq": seq,
        "ts": 0,
    }
    fields = {
        "type": event["type"],
        "response_id": rid,
        "synthesis_id": synthesis,
        "event": json.dumps(event),
    }
    return (await client.xadd(stream, fields)).decode()


async def _publish_round(client: Any, ns: Namespace, rids: list[str], tag: str) -> list[str]:
    """An event then a merged entry for each id; returns ``stream/id`` in write order."""
    written = []
    for rid in rids:
        shard = ns.shard_for(rid)
        written.append(f"{shard.events}/{await _publish_event(client, shard.events, rid, 0)}")
        entry = await _publish_merged(client, shard.merged, rid, f"{tag}-{rid}")
        written.append(f"{shard.merged}/{entry}")
    return written


async def _take(subscriber: Subscriber, n: int) -> list[Any]:
    items = []
    async for item in subscriber:
        items.append(item)
        if len(items) == n:
            break
    return items


def _per_stream(refs: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ref in refs:
        stream, _, entry = ref.rpartition("/")
        out.setdefault(stream, []).append(entry)
    return out


async def test_subscriber_reads_all_shards_in_order_and_resumes(async_redis_client, namespace):
    ns = Namespace(namespace, 3)
    rids = _ids_on_distinct_shards(3) * 2
    written = await _publish_round(async_redis_client, ns, rids, "one")
    await init_namespace(async_redis_client, namespace, 3)
    subscriber = Subscriber(async_redis_client, namespace, shards=3, block_ms=100)
    items = await asyncio.wait_for(_take(subscriber, len(written)), timeout=10)
    got = [f"{item.stream}/{item.id}" for item in items]
    assert _per_stream(got) == _per_stream(written)
    merged = [item for item in items if isinstance(item, MergedItem)]
    events = [item for item in items if isinstance(item, EventItem)]
    assert {m.response_id for m in merged} == set(rids)
    assert all(m.status == "completed" and m.response["messages"] for m in merged)
    assert merged[0].agent_response().text.startswith("one-")
    assert {e.type for e in events} == {"synthesis.started"}
    positions = dict(subscriber.positions)
    assert set(positions) == {getattr(s, k) for s in ns.all() for k in ("merged", "events")}

    more = await _publish_round(async_redis_client, ns, rids[:3], "two")
    resumed = Subscriber(
        async_redis_client, namespace, shards=3, block_ms=100, from_positions=positions
    )
    again = await asyncio.wait_for(_take(resumed, len(more)), timeout=10)
    assert _per_stream([f"{i.stream}/{i.id}" for i in again]) == _per_stream(more)
    assert await resumed.read(block_ms=50) == []


async def test_subscriber_start_at_end_skips_history(async_redis_client, namespace):
    ns = Namespace(namespace, 3)
    rids = _ids_on_distinct_shards(3)
    await _publish_round(async_redis_client, ns, rids, "old")
    await init_namespace(async_redis_client, namespace, 3)
    subscriber = Subscriber(async_redis_client, namespace, shards=3, start="$", block_ms=50)
    assert await subscriber.read(block_ms=50) == []
    new = await _publish_round(async_redis_client, ns, rids[:1], "new")
    items = await asyncio.wait_for(_take(subscriber, 2), timeout=10)
    assert _per_stream([f"{i.stream}/{i.id}" for i in items]) == _per_stream(new)


async def test_subscriber_stop_ends_iteration(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 2)
    subscriber = Subscriber(async_redis_client, namespace, shards=2, block_ms=50)
    asyncio.get_running_loop().call_later(0.1, subscriber.stop)
    assert await asyncio.wait_for(_collect(subscriber), timeout=5) == []


async def test_subscriber_as_context_manager_stops_and_cancels_reads(redis_cluster, namespace):
    client = redis.asyncio.cluster.RedisCluster.from_url(redis_cluster.url)
    try:
        await init_namespace(client, namespace, 2)
        async with Subscriber(client, namespace, shards=2) as subscriber:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(subscriber.read(block_ms=5000), timeout=0.3)
            pending = list(subscriber._pending.values())
            assert len(pending) == 2 and not any(task.done() for task in pending)
        assert all(task.cancelled() for task in pending) and not subscriber._pending
        assert await _collect(subscriber) == []
    finally:
        await client.aclose()


async def test_wait_for_finds_past_and_future_merged_entries(async_redis_client, namespace):
    ns = Namespace(namespace, 3)
    await init_namespace(async_redis_client, namespace, 3)
    subscriber = Subscriber(async_redis_client, namespace, shards=3, block_ms=100)
    past, future = _ids_on_distinct_shards(3)[:2]
    await _publish_merged(async_redis_client, ns.shard_for(past).merged, past, "done")
    item = await subscriber.wait_for(past, timeout=5)
    assert item.response_id == past
    assert item.response["messages"][0]["contents"][0]["text"] == "done"

    async def later() -> None:
        await asyncio.sleep(0.2)
        await _publish_merged(async_redis_client, ns.shard_for(future).merged, future, "x", "a2")

    task = asyncio.ensure_future(later())
    item = await subscriber.wait_for(f"{future}:a2:synthesis", timeout=5)
    await task
    assert (item.response_id, item.attempt_id) == (future, "a2")
    assert subscriber.positions == {k: "0-0" for k in subscriber.positions}


async def test_wait_for_times_out(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 2)
    subscriber = Subscriber(async_redis_client, namespace, shards=2, block_ms=100)
    with pytest.raises(TimeoutError):
        await subscriber.wait_for("resp_never", timeout=0.3)


async def test_wait_for_a_turn_sent_with_only_a_turn_id(async_redis_client, namespace):
    ns = Namespace(namespace, 4)
    rid = response_id_for_turn("turn-w")
    await _publish_merged(async_redis_client, ns.shard_for("turn-w").merged, rid, "t")
    await init_namespace(async_redis_client, namespace, 4)
    subscriber = Subscriber(async_redis_client, namespace, shards=4)
    item = await subscriber.wait_for(None, timeout=5, turn_id="turn-w")
    assert item.response_id == rid


# --------------------------------------------------------------------------- end to end


async def test_producer_worker_subscriber_end_to_end(async_redis_client, namespace):
    from processor.worker.worker import Worker, WorkerConfig

    worker = Worker(async_redis_client, WorkerConfig(namespace=namespace, shards=3))
    running = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(worker.ready.wait(), timeout=10)
        producer = Producer(async_redis_client, namespace, shards=3)

        async def updates() -> AsyncIterator[AgentResponseUpdate]:
            for word in ("Hello", ", ", "world"):
                yield AgentResponseUpdate(
                    contents=[Content.from_text(word)], message_id="m1", role="assistant"
                )

        sent = await producer.stream("resp_e2e", updates())
        subscriber = Subscriber(async_redis_client, namespace, shards=3)
        item = await subscriber.wait_for("resp_e2e", timeout=10, since=sent.first_id)
        assert item.status == "completed"
        assert item.agent_response().text == "Hello, world"
    finally:
        worker.stop()
        await asyncio.wait_for(running, timeout=10)


# --------------------------------------------------------------------------- cluster


async def test_producer_and_subscriber_on_a_cluster(redis_cluster, namespace):
    client = redis.asyncio.cluster.RedisCluster.from_url(redis_cluster.url)
    try:
        ns = Namespace(namespace, 3)
        rids = _ids_on_distinct_shards(3)
        await init_namespace(client, namespace, 3)
        producer = Producer(client, namespace, shards=3)
        for rid in rids:
            await producer.send(rid, {"contents": []}, idempotency_key=f"{rid}:0")
            await producer.send(rid, {"contents": []}, idempotency_key=f"{rid}:0")
            assert await client.xlen(ns.shard_for(rid).updates) == 1
        subscriber = Subscriber(client, namespace, shards=3, block_ms=100)
        written = await _publish_round(client, ns, rids, "c")
        items = await asyncio.wait_for(_take(subscriber, len(written)), timeout=10)
        assert _per_stream([f"{i.stream}/{i.id}" for i in items]) == _per_stream(written)
        item = await subscriber.wait_for(rids[2], timeout=5)
        assert item.response_id == rids[2]
        await subscriber.aclose()
    finally:
        await client.aclose()

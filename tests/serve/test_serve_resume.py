"""Exact resume as the turn ends (docs/serve.md, "Joining and resuming").

A join reads the turn's state, then its live log; the turn can be published
between the two reads, and its log goes with its state. Each test here
makes that happen at exactly that moment, with a real worker: the server's
(or ``Subscriber.follow``'s) source is wrapped so that its read of the log
waits until the turn has finished. A resuming client must still get every
seq after its id once, in order, then the merged response and the terminal
event; a fresh one the merged response and the terminal event. It used to
get the seqs published after it subscribed (14..20 after 11), or an empty
snapshot at seq 0."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from support.serve_harness import (
    bearer,
    chunk_text,
    merged_text,
    open_stream,
    payloads,
    served,
    text_update,
    wait_logged,
)
from support.worker_harness import Harness

from processor.client import Producer, Subscriber
from processor.client.follow import default_source
from processor.client.source import Final, History, TurnSource, TurnState
from processor.client.turns import LiveEvent, MergedOutput, Snapshot, TurnRef
from processor.wire.ids import TurnKey


class EndsBeforeTheLogIsRead:
    """A ``TurnSource`` whose reads of the live log (``snapshot``,
    ``history``) wait, once, until ``release`` is set: the test finishes the
    turn meanwhile (``entered`` tells it the read is due)."""

    def __init__(self, inner: TurnSource) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.states: list[str] = []

    async def _gate(self) -> None:
        if not self.entered.is_set():
            self.entered.set()
            await self.release.wait()

    async def state(self, turn: TurnRef) -> TurnState:
        state = await self.inner.state(turn)
        self.states.append(state.phase)
        return state

    async def snapshot(self, turn: TurnRef) -> Snapshot | None:
        await self._gate()
        return await self.inner.snapshot(turn)

    async def history(self, turn: TurnRef, after: int) -> History:
        await self._gate()
        return await self.inner.history(turn, after)

    async def final(self, turn: TurnRef, after: int | None = None) -> Final:
        return await self.inner.final(turn, after)


async def _first_part(harness: Harness, producer: Producer, rid: str) -> int:
    """A turn with a few updates told live; more sent after the id returned
    (the client's last), told before the client comes back."""
    for i in range(3):
        await producer.send(rid, text_update(f"a{i} "))
    await wait_logged(harness, rid, 3)
    log = await harness.client.xrange(harness.ns.shard_for(rid).live(TurnKey(rid).encode()))
    last = int(log[-1][1][b"seq"])
    for i in range(3):
        await producer.send(rid, text_update(f"b{i} "))
    await wait_logged(harness, rid, 6)
    return last


async def _end_while_gated(harness: Harness, producer: Producer, gate: EndsBeforeTheLogIsRead,
                           rid: str) -> dict[str, Any]:
    await asyncio.wait_for(gate.entered.wait(), 30)
    await producer.end(rid)
    subscriber = Subscriber(harness.client, harness.ns.name, harness.ns.shards)
    merged = (await subscriber.wait_for(rid, 30)).response
    gate.release.set()
    return merged


async def test_a_resume_as_the_turn_ends_gets_every_seq_after_its_id(
    redis_url, namespace
) -> None:
    rid = "ends-now"
    async with served(redis_url, namespace) as (harness, serve):
        gate = EndsBeforeTheLogIsRead(serve.server.source)
        serve.server.source = gate
        producer = Producer(harness.client, namespace)
        last = await _first_part(harness, producer, rid)
        async with aiohttp.ClientSession() as session:
            url = f"{serve.url}/v1/turns/{rid}/events"
            opening = asyncio.ensure_future(
                open_stream(session, url, {**bearer(rid), "Last-Event-ID": str(last)}))
            merged = await _end_while_gated(harness, producer, gate, rid)
            events = await (await opening).rest()
    assert gate.states[0] == "running"
    data = payloads(events)
    live = [(e, d) for e, d in zip(events, data, strict=True) if d["type"] != "merged"]
    assert [d["seq"] for _, d in live] == list(range(last + 1, last + 1 + len(live)))
    assert [e.id for e, _ in live] == [str(d["seq"]) for _, d in live]
    assert [d["type"] for d in data[-2:]] == ["merged", "synthesis"]
    assert chunk_text(data) == "b0 b1 b2 "
    assert merged_text(merged) == "a0 a1 a2 b0 b1 b2 "


async def test_a_fresh_join_as_the_turn_ends_gets_its_merged_response_not_an_empty_snapshot(
    redis_url, namespace
) -> None:
    rid = "ends-fresh"
    async with served(redis_url, namespace) as (harness, serve):
        gate = EndsBeforeTheLogIsRead(serve.server.source)
        serve.server.source = gate
        producer = Producer(harness.client, namespace)
        await _first_part(harness, producer, rid)
        async with aiohttp.ClientSession() as session:
            url = f"{serve.url}/v1/turns/{rid}/events"
            opening = asyncio.ensure_future(open_stream(session, url, bearer(rid)))
            merged = await _end_while_gated(harness, producer, gate, rid)
            events = await (await opening).rest()
    data = payloads(events)
    assert [d["type"] for d in data] == ["merged", "synthesis"], data
    assert data[0]["response"] == merged
    assert events[-1].id == str(data[-1]["seq"])


async def test_follow_resumed_as_the_turn_ends_gets_every_seq_after_its_id(
    redis_url, namespace
) -> None:
    rid = "follow-ends"
    async with Harness(redis_url, namespace) as harness:
        await harness.start_worker()
        producer = Producer(harness.client, namespace)
        subscriber = Subscriber(harness.client, namespace)
        last = await _first_part(harness, producer, rid)
        gate = EndsBeforeTheLogIsRead(default_source(harness.client, harness.ns))

        async def follow() -> list[Any]:
            return [item async for item in subscriber.follow(rid, after=last, source=gate)]

        following = asyncio.ensure_future(follow())
        merged = await _end_while_gated(harness, producer, gate, rid)
        items = await asyncio.wait_for(following, 30)
    events = [item for item in items if isinstance(item, LiveEvent)]
    assert [e.seq for e in events] == list(range(last + 1, last + 1 + len(events)))
    assert isinstance(items[-2], MergedOutput) and events[-1].terminal
    assert json.loads(items[-2].response) == merged
    assert chunk_text([json.loads(e.data) for e in events]) == "b0 b1 b2 "

"""The per-turn cache of ``processor serve`` (processor/serve/cache.py) in
front of a counting source, with the real hub on a real Redis: reads are
shared, kept while exact, and taken again once the turn publishes."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
import redis.asyncio

from processor.client.source import Final, History, LogSource, TurnState
from processor.client.turns import LiveEvent, MergedOutput, Snapshot, TurnRef
from processor.serve.cache import TurnCache
from processor.serve.gate import RedisGate
from processor.serve.hub import Hub
from processor.serve.metrics import ServeMetrics
from processor.wire.keys import Namespace


def _event(seq: int, kind: str = "synthesis.chunk") -> LiveEvent:
    return LiveEvent(seq, kind, json.dumps({"type": kind, "seq": seq}).encode())


class Counting:
    """A TurnSource that counts its reads; ``seq`` is what the turn is at."""

    def __init__(self) -> None:
        self.calls: Counter[Any] = Counter()
        self.seq = 3
        self.open = asyncio.Event()
        self.open.set()

    async def state(self, turn: TurnRef) -> TurnState:
        self.calls["state"] += 1
        return TurnState("running")

    async def snapshot(self, turn: TurnRef) -> Snapshot | None:
        self.calls["snapshot"] += 1
        await self.open.wait()
        return Snapshot(turn, self.seq, b'{"messages": []}')

    async def history(self, turn: TurnRef, after: int) -> History:
        self.calls[("history", after)] += 1
        await self.open.wait()
        return History([_event(seq) for seq in range(after + 1, self.seq + 1)])

    async def final(self, turn: TurnRef, after: int | None = None) -> Final:
        self.calls[("final", after)] += 1
        terminal = _event(10, "synthesis")
        merged = MergedOutput(turn, "completed", b"{}", b"{}")
        if after is None:
            return Final(merged, terminal)
        return Final(merged, terminal, [_event(seq) for seq in range(after + 1, 10)])


@pytest.fixture
async def cache_on_redis(redis_url: str, namespace: str) -> Any:
    client = redis.asyncio.Redis.from_url(redis_url)
    metrics = ServeMetrics()
    ns = Namespace(namespace, 1)
    hub = Hub(client, ns, metrics, block_ms=100)
    hub.start()
    while not hub.positioned:
        await asyncio.sleep(0.01)
    source = Counting()
    cache = TurnCache(source, hub, RedisGate(4, metrics.redis_wait), metrics, ttl=0.3)
    yield cache, source, client, ns
    await cache.close()
    await hub.close()
    await client.aclose()


async def _publish(client: Any, ns: Namespace, turn: TurnRef, seq: int) -> None:
    """An event of ``turn`` in its shard's events stream (what a worker publishes)."""
    await client.xadd(ns.shard_for(turn.response_id).events, {
        "response_id": turn.response_id, "type": "synthesis.chunk",
        "event": json.dumps({"type": "synthesis.chunk", "seq": seq})})


async def test_requests_share_one_read_and_reuse_it_while_the_turn_is_quiet(
    cache_on_redis: Any,
) -> None:
    cache, source, _, _ = cache_on_redis
    turn = TurnRef("quiet")
    source.open.clear()  # the first read stays in flight while 30 more ask
    first = asyncio.create_task(cache.snapshot(turn))
    await asyncio.sleep(0.05)
    rest = [asyncio.create_task(cache.snapshot(turn)) for _ in range(30)]
    await asyncio.sleep(0.05)
    source.open.set()
    snapshots = await asyncio.gather(first, *rest)
    assert source.calls["snapshot"] == 1
    assert {s.seq for s in snapshots if s is not None} == {3}
    assert (await cache.snapshot(turn)) == snapshots[0]  # still exact: kept
    assert source.calls["snapshot"] == 1
    whole = await cache.history(turn, -1)
    assert [e.seq for e in whole.events] == [0, 1, 2, 3] and whole.complete
    resumed = await cache.history(turn, 1)  # from the same read
    assert [e.seq for e in resumed.events] == [2, 3] and resumed.complete
    assert source.calls[("history", -1)] == 1 and source.calls[("history", 1)] == 0
    # processor_serve_redis_calls_total counts the reads made, not the 34 asked.
    made = cache.metrics.redis_calls
    assert [made.labels(kind)._value.get() for kind in ("snapshot", "history")] == [1, 1]


async def test_once_the_turn_publishes_the_next_request_reads_again(cache_on_redis: Any) -> None:
    cache, source, client, ns = cache_on_redis
    turn = TurnRef("moving")
    assert (await cache.snapshot(turn)) is not None
    source.seq = 4
    await _publish(client, ns, turn, 4)
    for _ in range(200):  # until the hub has handed the event to the cache's watch
        snapshot = await cache.snapshot(turn)
        if snapshot is not None and snapshot.seq == 4:
            break
        await asyncio.sleep(0.02)
    assert snapshot is not None and snapshot.seq == 4
    assert source.calls["snapshot"] == 2
    other = TurnRef("moving", attempt_id="a2")  # another synthesis: its own entry
    await cache.snapshot(other)
    assert source.calls["snapshot"] == 3


async def test_a_finished_turn_is_read_once_for_every_resume_it_covers(
    cache_on_redis: Any,
) -> None:
    cache, source, _, _ = cache_on_redis
    # Time stands still: every call below is within the 0.3 s ttl however
    # slow the machine (on a busy one, real time ran past it between calls).
    cache.clock = lambda: 1000.0
    turn = TurnRef("done")
    five = await cache.final(turn, 5)
    assert [e.seq for e in five.missed] == [6, 7, 8, 9]
    seven = await cache.final(turn, 7)
    assert [e.seq for e in seven.missed] == [8, 9] and seven.complete
    plain = await cache.final(turn)
    assert plain.missed == [] and plain.terminal == five.terminal
    assert source.calls[("final", 5)] == 1 and sum(
        n for k, n in source.calls.items() if k[0] == "final") == 1
    three = await cache.final(turn, 3)  # further back: one more read, then it covers 4
    assert [e.seq for e in three.missed] == [4, 5, 6, 7, 8, 9]
    await cache.final(turn, 4)
    assert source.calls[("final", 3)] == 1 and source.calls[("final", 4)] == 0
    state = await cache.state(turn)
    assert state.phase == "running"  # (not finished: never kept)
    await cache.state(turn)
    assert source.calls["state"] == 2


class DeletesAfterFirstPage:
    """A client whose first XRANGE is followed by the key's deletion (the
    turn published between two pages of a read of its log)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pages = 0

    async def xrange(self, key: str, **kwargs: Any) -> Any:
        page = await self.client.xrange(key, **kwargs)
        self.pages += 1
        if self.pages == 1:
            await self.client.delete(key)
        return page

    async def exists(self, key: str) -> int:
        return int(await self.client.exists(key))


async def test_a_log_that_goes_between_two_pages_is_read_as_gone(redis_url: str,
                                                                   namespace: str) -> None:
    """A read in pages (under a read budget) whose log is deleted between
    two pages comes back empty, as a read made after the deletion would: a
    cut log looked complete (events up to the cut, then a gap), and the
    join rule takes an empty log for "read the state again"."""
    client = redis.asyncio.Redis.from_url(redis_url)
    ns = Namespace(namespace, 1)
    turn = TurnRef("cut")
    key = ns.shard_for("cut").live(turn.key.encode())
    for seq in range(1, 11):
        await client.xadd(key, {"seq": seq, "events": json.dumps([json.loads(_event(seq).data)]),
                                "updates": "[]"})
    try:
        whole = await LogSource(client, ns, 1 << 20).history(turn, 0)
        assert [e.seq for e in whole.events] == list(range(1, 11))
        cutting = DeletesAfterFirstPage(client)
        cut = await LogSource(cutting, ns, 1 << 20).history(turn, 0)
        assert cutting.pages >= 2
        assert cut.events == []
    finally:
        await client.aclose()


async def test_a_history_read_is_followed_by_what_the_turn_publishes(
    cache_on_redis: Any,
) -> None:
    """Resumes of a turn that moves on are answered from one read of its
    log followed by the events its watch has had since: no read per resume."""
    cache, source, client, ns = cache_on_redis
    turn = TurnRef("followed")
    first = await cache.history(turn, 1)
    assert [e.seq for e in first.events] == [2, 3]
    for seq in (4, 5):
        await _publish(client, ns, turn, seq)
    for _ in range(200):  # until the hub has handed both to the watch
        later = await cache.history(turn, 3)
        if [e.seq for e in later.events] == [4, 5]:
            break
        await asyncio.sleep(0.02)
    assert [e.seq for e in later.events] == [4, 5] and later.complete
    again = await cache.history(turn, 1)
    assert [e.seq for e in again.events] == [2, 3, 4, 5]
    assert source.calls[("history", -1)] == 1

"""``checkpoint_held.lua``'s decisions, one by one, on states made by hand:
when it checkpoints, when it knows a call that ran before (its reply lost)
and when it refuses (the turn's state is not what this worker held)."""

from __future__ import annotations

from typing import Any

from processor.scripts import Scripts
from processor.scripts.held_calls import HeldCheckpoint, build_checkpoint_held
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace
from processor.worker.config import WorkerConfig

GROUP = "processor"


async def _call(client: Any, ns: Namespace, turn: HeldCheckpoint, consumer: str = "c1") -> int:
    options = WorkerConfig(group=GROUP)
    call = build_checkpoint_held(ns.shard(0), [turn], options, consumer)
    [result] = await Scripts(client).checkpoint_held(keys=call.keys, args=call.args)
    return int(result)


async def _held(client: Any, namespace: str, n: int) -> tuple[Namespace, TurnKey, list[str]]:
    """A turn whose ``n`` entries are pending to ``c1``, its hash as open_turns makes it."""
    ns = Namespace(namespace, 1)
    shard, key = ns.shard(0), TurnKey("t1")
    await client.xgroup_create(shard.updates, GROUP, id="0", mkstream=True)
    ids = [(await client.xadd(shard.updates, {"response_id": "t1", "update": "{}"})).decode()
           for _ in range(n)]
    await client.xreadgroup(GROUP, "c1", {shard.updates: ">"})
    await client.hset(shard.turn(key.encode()), mapping={"seq": 1, "ver": 0, "started": "1",
                                                         "holder": "c1"})
    return ns, key, ids


def _turn(key: TurnKey, ids: list[str], version: int = 0) -> HeldCheckpoint:
    return HeldCheckpoint(key, version, version + len(ids), len(ids), 10 * len(ids),
                          b"snapshot", ids[-1], ids, {})


async def test_a_checkpoint_acks_stores_the_snapshot_and_moves_the_version(
    async_redis_client: Any, namespace: str
) -> None:
    ns, key, ids = await _held(async_redis_client, namespace, 3)
    shard = ns.shard(0)
    assert await _call(async_redis_client, ns, _turn(key, ids)) == 1
    tk = key.encode()
    assert await async_redis_client.hgetall(shard.recs(tk)) == {b"state": b"snapshot"}
    turn = await async_redis_client.hgetall(shard.turn(tk))
    assert (turn[b"ver"], turn[b"n"], turn[b"cover"]) == (b"3", b"3", ids[-1].encode())
    assert (await async_redis_client.xpending(shard.updates, GROUP))["pending"] == 0
    assert await async_redis_client.zscore(shard.active, tk) is not None
    # The same call again (its reply lost): it ran, nothing more happens.
    assert await _call(async_redis_client, ns, _turn(key, ids)) == 1
    assert (await async_redis_client.hgetall(shard.turn(tk)))[b"ver"] == b"3"


async def test_a_turn_another_consumer_stored_into_is_refused_even_at_the_same_version(
    async_redis_client: Any, namespace: str
) -> None:
    """Another consumer reclaimed the three held entries and stored them
    (three records, version 0 to 3: what this call would leave): that is
    not this call having run. Taken for it, a later checkpoint's snapshot
    covered records still stored, which a replay merged twice."""
    ns, key, ids = await _held(async_redis_client, namespace, 3)
    shard = ns.shard(0)
    tk = key.encode()
    await async_redis_client.hset(shard.recs(tk), mapping={i: b"record" for i in ids})
    await async_redis_client.hset(shard.turn(tk), "ver", 3)
    assert await _call(async_redis_client, ns, _turn(key, ids)) == -1
    assert (await async_redis_client.xpending(shard.updates, GROUP))["pending"] == 3
    assert b"state" not in await async_redis_client.hgetall(shard.recs(tk))


async def test_another_holder_a_moved_version_a_cancel_or_an_end_refuse(
    async_redis_client: Any, namespace: str
) -> None:
    ns, key, ids = await _held(async_redis_client, namespace, 2)
    shard = ns.shard(0)
    tk = key.encode()
    assert await _call(async_redis_client, ns, _turn(key, ids), consumer="c2") == -1
    await async_redis_client.hset(shard.turn(tk), "ver", 1)
    assert await _call(async_redis_client, ns, _turn(key, ids)) == -1
    await async_redis_client.hset(shard.turn(tk), "ver", 0)
    await async_redis_client.set(shard.cancel("t1"), "stop")
    assert await _call(async_redis_client, ns, _turn(key, ids)) == 3
    await async_redis_client.delete(shard.cancel("t1"))
    await async_redis_client.hset(shard.done(tk), "status", "completed")
    assert await _call(async_redis_client, ns, _turn(key, ids)) == 0
    assert (await async_redis_client.xpending(shard.updates, GROUP))["pending"] == 2

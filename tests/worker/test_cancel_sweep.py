"""The cancel sweep reads every active turn's cancel key within
``CANCEL_CYCLE_S`` whatever their number: its slice grows with the shard's
active turns, so a cancel SET by a plain client is seen in a bounded number
of sweeps (docs/contract.md §6: terminal event within 1 s), still one call per shard
per sweep; and it reads whether each key exists, never its value."""

from __future__ import annotations

from typing import Any

from support.turn_reference import simple_turn
from support.worker_harness import Harness

from processor.wire.ids import TurnKey
from processor.worker.sweeping import CANCEL_CYCLE_S, cancel_slice
from processor.worker.worker import Worker


def test_slice_is_the_configured_size_until_the_turns_need_more() -> None:
    assert cancel_slice(0, 1000, 0.1) == 1000
    assert cancel_slice(4000, 1000, 0.1) == 1000  # 5 sweeps of 1,000 go round 4,000
    assert cancel_slice(100_000, 1000, 0.1) == 20_000  # 5 sweeps of 20,000
    assert cancel_slice(100_001, 1000, 0.1) == 20_001  # rounded up, never short
    assert cancel_slice(7, 1, CANCEL_CYCLE_S * 2) == 7  # a slow sweep reads them all


async def _read_all(harness: Harness, consumer: str) -> list[Any]:
    shard = harness.shards[0]
    reply = await harness.client.xreadgroup(harness.group, consumer, {shard.updates: ">"},
                                            count=10_000)
    return [entry for _stream, entries in reply for entry in entries]


async def test_a_cancel_is_seen_within_one_cycle_of_sweeps(redis_url: str,
                                                           namespace: str) -> None:
    turns = 100
    configured, interval = 5, 0.1
    async with Harness(redis_url, namespace, cancel_slice=configured,
                       sweep_interval=interval) as harness:
        shard = harness.shards[0]
        worker = Worker(harness.client, harness.worker_config(consumer="w"))
        await worker.ensure_groups()
        # 100 open turns (one update each, no end), applied.
        await harness.add(e for i in range(turns) for e in simple_turn(f"open-{i}", 1)[:-1])
        await worker.stored.store(shard, await _read_all(harness, "w"), {})
        members = await harness.client.zrange(shard.active, 0, -1)
        assert len(members) == turns
        # Cancel the turn the rotating slices reach last.
        last = TurnKey.decode(members[-1].decode())
        await harness.cancel(last.response_id)

        # One sweep learns the active count; then a cycle's worth of sweeps
        # (CANCEL_CYCLE_S / interval) must reach every turn. With fixed slices
        # of 5 this would take 20 sweeps.
        sweeps = 1 + int(CANCEL_CYCLE_S / interval)
        for _ in range(sweeps):
            await worker.sweeper.sweep(shard)
        done = await harness.client.hget(shard.done(last.encode()), "status")
        assert done == b"cancelled"
        outputs = await harness.outputs()
        merged = {t.key: t.merged[0]["status"] for t in outputs.turns.values() if t.merged}
        assert merged == {last: "cancelled"}  # the others stay open


async def test_the_sweep_never_reads_a_cancel_reason(make_redis_server: Any) -> None:
    """Anyone may set a cancel key to a value of any size: ten 4 MiB reasons
    on open turns made every sweep read 40 MiB (an MGET of the values), and a
    worker under a memory cap failed every sweep. The sweep reads only whether
    each key exists: redis-server sends the worker next to nothing."""
    server = make_redis_server()
    async with Harness(server.url, "huge") as harness:
        shard = harness.shards[0]
        worker = Worker(harness.client, harness.worker_config(consumer="w", hold_turns=False))
        await worker.ensure_groups()
        await harness.add(e for i in range(12) for e in simple_turn(f"open-{i}", 1)[:-1])
        await worker.stored.store(shard, await _read_all(harness, "w"), {})
        for i in range(10):
            await harness.client.set(shard.cancel(f"open-{i}"), "x" * (4 << 20))

        async def sent() -> int:
            return int((await harness.client.info("stats"))["total_net_output_bytes"])

        before = await sent()
        await worker.sweeper.sweep(shard)
        assert await sent() - before < 256 << 10
        outputs = await harness.outputs()
    cancelled = {t.key.response_id for t in outputs.turns.values()
                 if t.merged and t.merged[0]["status"] == "cancelled"}
    assert cancelled == {f"open-{i}" for i in range(10)}


async def _commands(client: Any, name: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


async def test_an_idle_sweep_costs_redis_a_few_commands_not_one_per_turn(
        make_redis_server: Any) -> None:
    """With 1,000 open turns and no cancel, a sweep that read each turn's cancel
    key with its own EXISTS cost Redis 1,000 commands (commands run inside a
    script count in INFO commandstats): 2 workers' sweeps of 1,000 idle turns
    made about 7,000 a second. The keys of a slice are counted with one
    multi-key EXISTS per chunk; a cancelled turn in any chunk is still found,
    the first and the last alike."""
    server = make_redis_server()
    turns = 1200  # more than one chunk (cancelled_turns.lua: CHUNK)
    async with Harness(server.url, "idle", cancel_slice=turns) as harness:
        shard = harness.shards[0]
        worker = Worker(harness.client, harness.worker_config(consumer="w", hold_turns=False))
        await worker.ensure_groups()
        await harness.add(e for i in range(turns) for e in simple_turn(f"open-{i}", 1)[:-1])
        await worker.stored.store(shard, await _read_all(harness, "w"), {})
        assert await harness.client.zcard(shard.active) == turns

        await worker.sweeper.sweep(shard)  # learns the active count
        before = await _commands(harness.client, "exists")
        await worker.sweeper.sweep(shard)
        # (3 chunks of cancel keys, and sweep_shard's look at the closing turns)
        assert await _commands(harness.client, "exists") - before <= 4

        members = [TurnKey.decode(m.decode())
                   for m in await harness.client.zrange(shard.active, 0, -1)]
        picked = {members[0].response_id, members[499].response_id, members[500].response_id,
                  members[-1].response_id}
        for rid in picked:
            await harness.cancel(rid)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    cancelled = {t.key.response_id for t in outputs.turns.values()
                 if t.merged and t.merged[0]["status"] == "cancelled"}
    assert cancelled == picked


async def test_the_sweep_names_each_turns_cancel_key_as_the_producers_do(
        redis_url: str, namespace: str) -> None:
    """sweep_shard.lua names the cancel keys and turn hashes of its slice
    itself (from the shard's tag and each active member, not as KEYS): every
    id a producer may send, its attempt included, must give the key a plain
    ``SET`` (Shard.cancel) wrote, and a turn whose key is not set must not
    be cancelled by a neighbour's."""
    ids = ["a:b:c", "12:x", "{other:0}", "ünïcödé", "x" * 300, "7", "plain"]
    cancel = {"a:b:c", "12:x", "{other:0}", "ünïcödé", "x" * 300}
    async with Harness(redis_url, namespace) as harness:
        shard = harness.shards[0]
        worker = Worker(harness.client, harness.worker_config(consumer="w", hold_turns=False))
        await worker.ensure_groups()
        entries = [e for rid in ids for e in simple_turn(rid, 1)[:-1]]
        entries.append({**simple_turn("attempted", 1)[0], "attempt_id": "try:2"})
        await harness.add(entries)
        await worker.stored.store(shard, await _read_all(harness, "w"), {})
        assert await harness.client.zcard(shard.active) == len(ids) + 1
        for rid in [*cancel, "attempted"]:
            await harness.cancel(rid)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    status = {t.key: t.merged[0]["status"] for t in outputs.turns.values() if t.merged}
    assert status == {**{TurnKey(rid, ""): "cancelled" for rid in cancel},
                      TurnKey("attempted", "try:2"): "cancelled"}

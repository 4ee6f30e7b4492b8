"""Compaction of a turn's stored records (``compact_turn.lua``, settle.py).

A long turn keeps a bounded number of records in Redis: the worker folds the
records below the shard's watermark into one snapshot once the turn has
``compact_threshold`` of them. Compacting never changes the output (same
bytes as ``processor merge``), and a compaction that races another one, a
finalise or an apply changes nothing it should not.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import pytest
from support.strategies import random_turn
from support.turn_reference import (
    compare_with_offline,
    entry_fields,
    interleave,
    offline_results,
    simple_turn,
)
from support.worker_harness import Harness

import processor.worker.stored.storing
from processor.engine.compaction import plan_compaction
from processor.engine.lifecycle import Limits
from processor.engine.records import STATE, encode_stored
from processor.engine.replay import replay_render
from processor.ingest.decode import decode_entry, entry_size
from processor.scripts import Scripts
from processor.scripts.stored_calls import build_compact, build_finalise
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.worker.worker import Worker

_unpack = msgspec.msgpack.Decoder()

# --------------------------------------------------------------------------- pure


def _stored(entries: list[dict[str, Any]]) -> tuple[TurnKey, dict[str, bytes]]:
    """The ``recs`` hash apply_entries would hold for these entries (ids 1-0, 2-0, ...)."""
    recs: dict[str, bytes] = {}
    key = None
    for i, entry in enumerate(entries, 1):
        fields = entry_fields(entry)
        key, record = decode_entry(fields)
        recs[f"{i}-0"] = encode_stored(entry_size(fields), record)
    assert key is not None
    return key, recs


def _compact_in_place(key: TurnKey, recs: dict[str, bytes], watermark: str | None,
                      limits: Limits) -> int:
    """What a successful ``compact_turn`` does to the hash; returns records folded."""
    plan = plan_compaction(key, recs, watermark, limits)
    if plan is None:
        return 0
    for entry_id in plan.folded:
        del recs[entry_id]
    recs[STATE] = plan.state
    return len(plan.folded)


@pytest.mark.parametrize("seed", range(12))
def test_compacting_anywhere_gives_the_same_outputs(seed: int) -> None:
    rng = random.Random(seed)
    entries = random_turn(rng, f"c{seed}", max_messages=rng.choice((8, 40, 120)))
    if seed % 3 == 0:  # entries after the end: the replay dead-letters them
        entries += random_turn(rng, f"c{seed}", max_messages=4)
    # Some turns cross the update limit part-way (turn_limit).
    limits = Limits(max_turn_updates=len(entries) // 2) if seed % 4 == 1 else Limits()
    key, plain = _stored(entries)
    offline = offline_results(entries, limits=limits)[key]
    compacted = dict(plain)
    folded = 0
    for _ in range(rng.randint(1, 6)):
        cut = rng.randint(1, len(entries) + 1)
        folded += _compact_in_place(key, compacted, f"{cut}-0", limits)
    folded += _compact_in_place(key, compacted, None, limits)  # as far as it goes
    assert folded > 0 and STATE in compacted
    for reason in ("closing", "cancel", "timeout"):
        want = replay_render(key, {}, plain, reason, limits, 1000)
        got = replay_render(key, {}, compacted, reason, limits, 1000)
        assert want is not None and got == want, reason
    merged_fields = _unpack.decode(want.outputs)[0] if want else []
    response = merged_fields[merged_fields.index("response") + 1]
    assert response == offline.response


def test_a_snapshot_never_covers_the_end() -> None:
    entries = simple_turn("e", 10)
    key, recs = _stored(entries)
    limits = Limits()
    plan = plan_compaction(key, recs, None, limits)
    assert plan is not None and plan.folded == [f"{i}-0" for i in range(1, 11)]
    assert plan_compaction(key, recs, "5-0", limits, minimum=5) is None  # 4 below the mark
    _compact_in_place(key, recs, None, limits)
    assert set(recs) == {STATE, "11-0"}  # the end stays a record
    assert plan_compaction(key, recs, None, limits) is None


# --------------------------------------------------------------------------- live


THRESHOLD = 256
BATCH = 100


async def test_long_turns_keep_few_records(redis_url: str, namespace: str) -> None:
    long_text = simple_turn("long-10k", 10_000)
    multi = random_turn(random.Random(5), "multi-agent", max_messages=6000)
    arrival = interleave([long_text, multi], random.Random(1))
    offline = offline_results(arrival)
    seen: dict[str, list[int]] = {"long-10k": [], "multi-agent": []}
    snapshots = 0

    # Stored turns: a held turn stores no records until it spills.
    async with Harness(redis_url, namespace, batch=BATCH, compact_threshold=THRESHOLD,
                       hold_turns=False) as harness:
        await harness.start_workers(2)
        shard = harness.shards[0]

        async def sample() -> None:
            nonlocal snapshots
            while True:
                for rid in seen:
                    recs = shard.recs(TurnKey(rid, "").encode())
                    seen[rid].append(await harness.client.hlen(recs))
                    snapshots += bool(await harness.client.hexists(recs, STATE))
                await asyncio.sleep(0.005)

        sampler = asyncio.create_task(sample())
        await harness.add(arrival, chunk=500)
        await harness.wait_merged(2, timeout=120)
        await harness.wait_drained()
        sampler.cancel()
        outputs = await harness.outputs()
        leftover = await harness.state_keys()

    compare_with_offline(outputs, offline, "compacted")
    assert outputs.dlq == [] and leftover == []
    # Records stored at any time: the threshold, plus the retry step (half of
    # it) and what two workers' batches add while one compacts, about 585 when
    # every compaction is taken at once (401 seen on a quiet machine). A
    # compaction refused because a batch holds the watermark back is retried a
    # half-threshold later, so a loaded machine may need one or two more
    # steps: the bound allows that, and is still far from the turn's length
    # (10,001 and 5,092 entries), which is what it would be without compaction.
    bound = 3 * THRESHOLD + 2 * BATCH
    for rid, lengths in seen.items():
        assert len(lengths) > 10, rid  # sampled all along (46+ seen under heavy load)
        assert max(lengths) <= bound, (rid, max(lengths))
    assert snapshots > 0


async def _read(harness: Harness, shard: Shard, consumer: str, count: int) -> list[Any]:
    reply = await harness.client.xreadgroup(harness.group, consumer, {shard.updates: ">"},
                                            count=count)
    return [entry for _stream, entries in reply for entry in entries]


async def test_racing_compactions_finalise_and_apply(redis_url: str, namespace: str) -> None:
    entries = random_turn(random.Random(3), "race", max_messages=120)
    updates, end = entries[:-1], entries[-1]
    offline = offline_results(entries)
    key = TurnKey("race", "")
    limits = Limits()
    async with Harness(redis_url, namespace, compact_threshold=0) as harness:
        shard = harness.shards[0]
        tk = key.encode()
        worker = Worker(harness.client, harness.worker_config(consumer="w"))
        await worker.ensure_groups()
        scripts = Scripts(harness.client)
        opts = worker.options

        async def recs() -> dict[Any, Any]:
            return await harness.client.hgetall(shard.recs(tk))

        async def commit(plan: Any) -> int:
            call = build_compact(shard, key, plan, opts)
            return int(await scripts.compact_turn(keys=call.keys, args=call.args))

        # The first half, applied; then one entry a ghost consumer holds
        # (pending: the watermark), then the rest but the end, applied.
        half = len(updates) // 2
        await harness.add(updates[:half])
        await worker.stored.store(shard, await _read(harness, shard, "w", 10_000), {})
        await harness.add(updates[half:half + 1])
        ghost = await _read(harness, shard, "ghost", 1)
        watermark = ghost[0][0].decode()
        await harness.add(updates[half + 1:])
        await worker.stored.store(shard, await _read(harness, shard, "w", 10_000), {})
        before = await recs()
        assert len(before) == len(updates) - 1

        # Past the watermark: not yet, and nothing changed.
        beyond = plan_compaction(key, before, None, limits)
        assert beyond is not None and await commit(beyond) == 2
        assert await recs() == before
        # Two compactions planned from the same read: one wins.
        short = plan_compaction(key, before, watermark, limits, minimum=1)
        assert short is not None and short.folded
        other = plan_compaction(key, before, watermark, limits)
        assert other is not None
        assert await commit(short) == 1
        assert await commit(other) == -1
        after = await recs()
        assert STATE.encode() in after and len(after) == len(before) - len(short.folded) + 1

        # A plan read before the ghost's entry is applied, committed after:
        # the records at or below its cover changed, so it is refused.
        stale = plan_compaction(key, after, None, limits)
        assert stale is not None
        await worker.stored.store(shard, ghost, {})  # as a reclaim would
        assert await commit(stale) == -1
        fresh = plan_compaction(key, await recs(), None, limits)
        assert fresh is not None and fresh.expected == short.cover
        assert await commit(fresh) == 1

        # The end applied; a finalise that read the turn before a compaction
        # publishes after it (same output), and a compaction after it is a no-op.
        await harness.add([end])
        worker.finaliser.finalise = _no_finalise  # type: ignore[method-assign]
        await worker.stored.store(shard, await _read(harness, shard, "w", 10), {})
        turn_hash = await harness.client.hgetall(shard.turn(tk))
        read = await recs()
        assert plan_compaction(key, read, None, limits) is None  # nothing left to fold
        outcome = replay_render(key, turn_hash, read, "closing", limits, 0)
        assert outcome is not None
        late = plan_compaction(key, read, None, limits)
        assert late is None
        call = build_finalise(shard, [(key, turn_hash[b"ver"].decode(), outcome)], opts)
        assert await scripts.finalise_turns(keys=call.keys, args=call.args) == [1]
        assert await commit(fresh) == 0
        outputs = await harness.outputs()
        leftover = await harness.state_keys()

    compare_with_offline(outputs, offline, "raced")
    assert leftover == []


async def _no_finalise(*_args: object) -> None:
    return None


async def test_finalise_from_a_read_before_compaction(redis_url: str, namespace: str) -> None:
    """Compaction leaves ``ver`` alone: a finalise that read the uncompacted
    records publishes after the swap, with the same bytes."""
    entries = random_turn(random.Random(11), "pre", max_messages=200)
    offline = offline_results(entries)
    key, limits = TurnKey("pre", ""), Limits()
    async with Harness(redis_url, namespace, compact_threshold=0) as harness:
        shard = harness.shards[0]
        tk = key.encode()
        worker = Worker(harness.client, harness.worker_config(consumer="w"))
        worker.finaliser.finalise = _no_finalise  # type: ignore[method-assign]
        await worker.ensure_groups()
        scripts = Scripts(harness.client)
        await harness.add(entries)
        await worker.stored.store(shard, await _read(harness, shard, "w", 10_000), {})
        turn_hash = await harness.client.hgetall(shard.turn(tk))
        read = await harness.client.hgetall(shard.recs(tk))
        plan = plan_compaction(key, read, None, limits)
        assert plan is not None
        call = build_compact(shard, key, plan, worker.options)
        assert await scripts.compact_turn(keys=call.keys, args=call.args) == 1
        outcome = replay_render(key, turn_hash, read, "closing", limits, 0)
        assert outcome is not None
        call = build_finalise(shard, [(key, turn_hash[b"ver"].decode(), outcome)],
                              worker.options)
        assert await scripts.finalise_turns(keys=call.keys, args=call.args) == [1]
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    compare_with_offline(outputs, offline, "finalised from a pre-compaction read")


async def test_workers_race_compactions_on_shared_turns(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three workers, tiny batches and a tiny threshold on the same turns:
    compactions race each other, applies and finalises all the time."""
    rng = random.Random(21)
    turns = [random_turn(rng, f"shared-{i}", max_messages=60) for i in range(40)]
    arrival = interleave(turns, random.Random(22))
    offline = offline_results(arrival)
    answers: list[int] = []
    real = processor.worker.stored.storing.compact_turns

    async def counting(*args: Any) -> dict[TurnKey, int]:
        found = await real(*args)
        answers.extend(found.values())
        return found

    monkeypatch.setattr(processor.worker.stored.storing, "compact_turns", counting)
    async with Harness(redis_url, namespace, shards=2, batch=7, compact_threshold=8,
                       hold_turns=False) as harness:  # (stored turns: they have records)
        await harness.start_workers(3)
        for start in range(0, len(arrival), 300):
            await harness.add(arrival[start:start + 300])
            await asyncio.sleep(0.02)
        await harness.wait_merged(len(offline), timeout=120)
        await harness.wait_drained()
        outputs = await harness.outputs()
        leftover = await harness.state_keys()
    compare_with_offline(outputs, offline, "racing compactions")
    assert outputs.dlq == [] and leftover == []
    assert answers.count(1) > 10, answers


CRASH_FLAGS = {"reclaim_idle_ms": 500, "batch": 50, "log_level": "info", "compact_threshold": 16}


async def test_sigkill_with_compaction_on(redis_url: str, namespace: str, tmp_path) -> None:
    """``processor run`` workers compacting all the time are SIGKILLed
    mid-batch (mid-compaction too, by chance): every turn is still merged
    exactly once, equal to ``processor merge``; nothing is dead-lettered."""
    rng = random.Random(31)
    turns = [random_turn(rng, f"kc-{i:03d}", max_messages=100) for i in range(80)]
    arrival = interleave(turns, random.Random(32))
    offline = offline_results(arrival)
    snapshots = 0
    async with Harness(redis_url, namespace, shards=2, log_dir=tmp_path) as harness:
        for _ in range(3):
            harness.spawn(**CRASH_FLAGS)
        await harness.wait_started(harness.procs)

        async def produce() -> None:
            for start in range(0, len(arrival), 200):
                await harness.add(arrival[start:start + 200])
                await asyncio.sleep(0.05)

        async def count_snapshots() -> None:
            nonlocal snapshots
            while True:
                for shard in harness.shards:
                    async for recs in harness.client.scan_iter(match=f"{shard.tag}:recs:*"):
                        snapshots += bool(await harness.client.hexists(recs, STATE))
                await asyncio.sleep(0.05)

        producer = asyncio.create_task(produce())
        watcher = asyncio.create_task(count_snapshots())
        for _ in range(4):
            await asyncio.sleep(rng.uniform(0.1, 0.4))
            harness.kill(rng.choice(harness.procs))
            harness.spawn(**CRASH_FLAGS)
        await producer
        await harness.wait_merged(len(offline), timeout=90)
        await harness.wait_drained(timeout=60)
        watcher.cancel()
        harness.assert_workers_alive()
        outputs = await harness.outputs()
        leftover = await harness.state_keys()
    compare_with_offline(outputs, offline, "SIGKILL with compaction")
    assert outputs.merged_count == len(offline)
    assert outputs.dlq == [], outputs.dlq[:3]
    assert leftover == [], leftover
    assert snapshots > 0

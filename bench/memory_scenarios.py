"""The memory measurements of ``bench/run.py``: Redis memory per active turn
(and after the drain), and a worker's RSS over a long run. Same conventions
as ``scenarios`` (a namespace of their own on the run's redis-server,
``processor run`` workers spawned through the tests' harness)."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

import psutil
from scenarios import Ctx, spawn_workers
from workload import ROOT, Workload, forget

from processor.wire.ids import TurnKey

sys.path.insert(0, str(ROOT / "tests"))
from support.memory_runs import drain_outputs, used_memory
from support.worker_harness import Harness

# --------------------------------------------------------------------------- memory


@dataclass
class Memory:
    turns: int
    raw_bytes: int  # field names + values of the active turns' update entries
    before: int  # used_memory, worker idle, nothing stored
    active: int  # used_memory with every update applied, no turn ended
    state_bytes: int  # MEMORY USAGE of the turn and recs hashes, all turns
    started_events: int  # MEMORY USAGE of the events stream (synthesis.started)
    drained: int  # used_memory after the ends, outputs still in their streams
    cleaned: int  # used_memory after the outputs are read and the done TTL passed
    held: bool = False  # the worker held the turns (the default), else stored them


async def memory(ctx: Ctx, work: Workload, done_ttl: int = 1, hold: bool = True) -> Memory:
    """Redis memory held per active turn (every update read, none ended).

    ``hold`` (the default worker): the turns are held, their entries
    pending in the updates stream (``--hold-ms`` long enough that none is
    stored meanwhile); else (``--no-hold-turns``) every entry is stored
    as a record and acked, and the stream trimmed."""
    updates = [e for e in work.entries if e.get("kind") != "end"]
    ends = [e for e in work.entries if e.get("kind") == "end"]
    raw = sum(len(k) + len(v) for e in updates for k, v in e.items())
    client = ctx.client
    flags = {"hold_ms": 3_600_000} if hold else {"hold_turns": False}
    async with Harness(ctx.url, "mem", log_dir=ctx.log_dir, done_ttl=done_ttl) as harness:
        subs = spawn_workers(harness, 1, done_ttl=done_ttl, **flags)
        shard = harness.shards[0]
        try:
            await harness.wait_started(subs, timeout=120)
            before = await used_memory(client)
            await harness.add(updates, chunk=5000)
            if hold:
                await _wait_held(client, shard, harness.group, len(updates), len(work.turns))
            else:
                await harness.wait_applied(timeout=600)
            active = await used_memory(client)
            state = 0
            for key_fn in (shard.turn, shard.recs):
                for rid in work.turns:
                    key = key_fn(TurnKey(rid, "").encode())
                    state += await client.memory_usage(key, samples=0) or 0
            events = await client.memory_usage(shard.events, samples=0) or 0
            await harness.add(ends)
            await harness.wait_merged(len(work.turns), timeout=600)
            await harness.wait_drained(timeout=600)
            drained = await used_memory(client)
            await drain_outputs(harness, done_ttl)
            cleaned = await used_memory(client)
        finally:
            for sub in list(harness.procs):
                harness.terminate(sub)
        await forget(client, "{mem:*")
    return Memory(len(work.turns), raw, before, active, state, events, drained, cleaned, hold)


async def _wait_held(client: Any, shard: Any, group: str, entries: int, turns: int,
                     timeout: float = 600) -> None:
    """Until every entry is pending (delivered, none acked: held) and every
    turn is active. (Pending, not lag: Redis 6.2 reports no lag.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        [info] = await client.xinfo_groups(shard.updates)
        if info["pending"] == entries and await client.zcard(shard.active) == turns:
            await asyncio.sleep(0.5)  # (the last batch's entries fed to its turns)
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the turns were not all held in time")


# --------------------------------------------------------------------------- worker RSS


@dataclass
class RssRun:
    updates: int
    seconds: float
    points: list[tuple[int, int, int]]  # (updates processed, worker RSS, Redis used_memory)


async def worker_rss(ctx: Ctx, rounds: list[Workload], backlog: int = 60_000,
                     every: float = 0.5) -> RssRun:
    """One worker over every round's entries, fed so the stream never holds
    more than ``backlog`` entries; samples the worker's RSS as it goes."""
    entries = [e for work in rounds for e in work.entries]
    updates = sum(work.updates for work in rounds)
    update_at = []  # updates among the first i entries
    n = 0
    for e in entries:
        n += e.get("kind") != "end"
        update_at.append(n)
    client = ctx.client
    async with Harness(ctx.url, "rss", log_dir=ctx.log_dir, done_ttl=60) as harness:
        subs = spawn_workers(harness, 1, done_ttl=60)
        shard = harness.shards[0]
        points: list[tuple[int, int, int]] = []
        try:
            await harness.wait_started(subs, timeout=120)
            proc = psutil.Process(subs[0].proc.pid)
            started = time.perf_counter()
            fed = 0
            next_sample = 0.0
            while True:
                harness.assert_workers_alive()
                waiting = await client.xlen(shard.updates)
                processed = fed - waiting
                now = time.perf_counter()
                if now >= next_sample:
                    done_updates = update_at[processed - 1] if processed else 0
                    points.append((done_updates, proc.memory_info().rss,
                                   await used_memory(client)))
                    next_sample = now + every
                if processed >= len(entries):
                    break
                if fed < len(entries) and waiting < backlog // 2:
                    chunk = entries[fed:fed + backlog // 2]
                    await harness.add(chunk, chunk=5000)
                    fed += len(chunk)
                else:
                    await asyncio.sleep(0.05)
            await harness.wait_drained(timeout=600)
            seconds = time.perf_counter() - started
            points.append((updates, proc.memory_info().rss, await used_memory(client)))
        finally:
            for sub in list(harness.procs):
                harness.terminate(sub)
        await forget(client, "{rss:*")
    return RssRun(updates, seconds, points)

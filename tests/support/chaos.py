"""The chaos soak: random multi-agent turns through ``processor run`` workers
while workers are SIGKILLed, Redis restarts and connections are cut.

Its plan (turns, endings, markers, arrival order) is in tests/support/chaos_plan.py,
its checks of the outputs in tests/support/chaos_checks.py.
Used by tests/chaos/test_chaos.py (short form in CI), tests/redis_io/test_cluster.py (on a
Redis Cluster) and bench/chaos_soak.py (the long form recorded in
docs/reliability.md).

The producer writes turns a window at a time (about ``window`` turns open at
once, entries interleaved), with some turns cancelled part-way, some ending
with a producer ``error`` and some never ending (silent producers, which end
as ``turn_timeout``). Meanwhile the chaos task SIGKILLs a random worker every
``kill_every`` seconds and starts a new one, restarts Redis once and kills
the workers' connections once (``CLIENT KILL``).

**Where a cancel cut the turn.** A cancelled or timed-out turn's response is
the merge of the entries the workers had applied when the cancel or the
timeout was seen. Which ones that was is decided by a race (a killed
worker's entries may still be pending while later ones are applied), so the
test makes it observable: every update carries a marker key of its own in
its ``additional_properties``, and the merged response's
``additional_properties`` is the union of the markers of the updates it
merged. The expected response is then ``processor merge`` of exactly those
entries followed by the offline ``cancel`` line (docs/contract.md §8) (or by nothing,
for a timeout): the comparison stays byte for byte, and the markers also
prove which entries were merged, dropped or dead-lettered (none twice, none
lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio

from processor.wire.ids import TurnKey
from support.chaos_checks import ChaosChecks, Figures
from support.chaos_plan import Action, ChaosConfig, PlannedTurn, arrival, plan_turns
from support.worker_harness import Harness, SubprocessWorker

PRODUCER_NAME = "chaos-producer"  # the CLIENT KILL spares the producer's connections


def idle_cpus(window: float = 0.25) -> float:
    """How many CPUs were idle over the last ``window`` seconds (``/proc/stat``;
    elsewhere, the CPUs less the 1-minute load average)."""
    def times() -> list[int]:
        with open("/proc/stat") as stat:
            return [int(n) for n in stat.readline().split()[1:]]

    cpus = os.cpu_count() or 1
    try:
        first = times()
        time.sleep(window)
        second = times()
    except OSError:
        return cpus - os.getloadavg()[0]
    spent = [b - a for a, b in zip(first, second, strict=False)]
    idle = spent[3] + (spent[4] if len(spent) > 4 else 0)  # idle + iowait
    return cpus * idle / max(1, sum(spent))


def burners_needed(cpu_load: int) -> int:
    """How many busy loops make the CPUs as busy as ``cpu_load`` asks: none
    once the machine is already busy (the rest of the test suite running
    beside the soak, which then competes with the workers as a burner
    would). A burner there only slowed every other test down (a core each
    for the whole soak). Measured now (``idle_cpus``), not from the load
    average, which lags by a minute: at the start of a suite it still said
    idle, and the soaks, started first, burned a core each beside it."""
    if not cpu_load:
        return 0
    return max(0, min(cpu_load, round(idle_cpus())))


@dataclass
class ChaosRun(ChaosChecks):
    """One soak. ``restart`` kills and restarts the Redis server (or a node);
    ``admin_urls`` are the nodes whose worker connections ``CLIENT KILL`` cuts."""

    url: str
    namespace: str
    cfg: ChaosConfig
    admin_urls: list[str]
    restart: Callable[[], Awaitable[None]] | None = None
    cluster: bool = False
    log_dir: Any = None
    figures: Figures = field(default_factory=Figures)
    problems: list[str] = field(default_factory=list)
    _all_procs: list[SubprocessWorker] = field(default_factory=list)
    _progress: float = 0.0
    _gate: asyncio.Lock = field(default_factory=asyncio.Lock)

    # ------------------------------------------------------------ running

    def _flags(self) -> dict[str, Any]:
        cfg = self.cfg
        flags = {"reclaim_idle_ms": cfg.reclaim_idle_ms, "batch": cfg.batch,
                 "turn_timeout": cfg.turn_timeout, "log_level": "info"}
        if not cfg.hold_turns:
            return {**flags, "hold_turns": False}  # (--no-hold-turns)
        return {**flags, "hold_ms": cfg.hold_ms}

    def _spawn(self, harness: Harness) -> SubprocessWorker:
        sub = harness.spawn(**self._flags())
        self._all_procs.append(sub)
        return sub

    async def run(self) -> Figures:
        cfg, fig = self.cfg, self.figures
        turns = plan_turns(cfg)
        actions = arrival(turns, cfg.window, random.Random(cfg.seed + 1))
        fig.turns = len(turns)
        fig.planned = Counter(t.plan for t in turns)
        started = time.monotonic()
        async with Harness(self.url, self.namespace, shards=cfg.shards, log_dir=self.log_dir,
                           cluster=self.cluster) as harness:
            old = harness.client
            harness.client = harness.connect(client_name=PRODUCER_NAME)
            await old.aclose()
            for _ in range(cfg.workers):
                self._spawn(harness)
            await harness.wait_started(harness.procs, timeout=60)
            ids: dict[tuple[int, int], tuple[int, str]] = {}
            producing = asyncio.create_task(self._produce(harness, turns, actions, ids))
            chaos = asyncio.create_task(self._chaos(harness, producing))
            burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                       for _ in range(burners_needed(cfg.cpu_load))]
            try:
                await producing
                fig.seconds_producing = time.monotonic() - started
                await chaos
                await harness.wait_merged(len(turns), timeout=120 + 2 * cfg.turn_timeout)
                await harness.wait_drained(timeout=120)
                await asyncio.sleep(0.5)  # entries dropped after a terminal event settle
                harness.assert_workers_alive()
            finally:
                for burner in burners:
                    burner.kill()
                    burner.wait()
                for task in (producing, chaos):
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            fig.seconds_total = time.monotonic() - started
            outputs = await harness.outputs()
            fig.leftover_keys = len(await harness.state_keys())
            done_dropped = await self._done_dropped(harness, turns)
            for sub in list(harness.procs):
                code = harness.terminate(sub)
                if code != 0:
                    self.problems.append(f"{sub.consumer} exited {code} on SIGTERM")
        self._logs()
        self._check(turns, ids, outputs, done_dropped)
        return fig

    async def _produce(
        self, harness: Harness, turns: list[PlannedTurn], actions: list[Action],
        ids: dict[tuple[int, int], tuple[int, str]],
    ) -> None:
        cfg, fig = self.cfg, self.figures
        batch: list[tuple[int, int]] = []
        pace = cfg.produce_seconds * cfg.chunk / max(1, len(actions))

        async def flush() -> None:
            if not batch:
                return
            entries = [turns[t].entries[i] for t, i in batch]
            async with self._gate:
                got = await harness.add(entries, chunk=len(entries))
            for (t, i), entry_id in zip(batch, got, strict=True):
                ids[(t, i)] = (harness.shard_of(turns[t].entries[i]).index, entry_id)
            fig.entries_sent += len(batch)
            fig.updates_sent += sum("update" in turns[t].entries[i] for t, i in batch)
            batch.clear()
            await asyncio.sleep(pace)

        for n, (what, t, i) in enumerate(actions):
            if what == "cancel":
                await flush()
                async with self._gate:
                    await harness.cancel(turns[t].rid, reason="chaos")
            else:
                batch.append((t, i))
                if len(batch) >= cfg.chunk:
                    await flush()
            self._progress = n / len(actions)
        await flush()
        self._progress = 1.0

    async def _chaos(self, harness: Harness, producing: asyncio.Task[None]) -> None:
        """Kill a worker every ~kill_every s until production is over (plus two
        more kills), restart Redis at 35 % and cut connections at 65 %."""
        cfg = self.cfg
        rng = random.Random(cfg.seed + 2)
        restarted = not (cfg.restart_redis and self.restart is not None)
        cut = not cfg.client_kill
        tail_kills = 2
        while tail_kills > 0:
            await asyncio.sleep(cfg.kill_every * rng.uniform(0.5, 1.5))
            await self._kill_one(harness, rng.choice(harness.procs))
            self._spawn(harness)
            if not restarted and self._progress >= 0.35:
                restarted = True
                await self._restart_redis(harness)
            if not cut and self._progress >= 0.65:
                cut = True
                await harness.wait_started(harness.procs, timeout=60)  # all connected
                await self._client_kill()
            if producing.done():
                tail_kills -= 1

    async def _kill_one(self, harness: Harness, victim: SubprocessWorker) -> None:
        """SIGKILL ``victim``, preferably while it holds entries it read but has
        not applied yet (frozen with SIGSTOP until its pending list shows some,
        for up to ~0.5 s): those must be reclaimed by the others."""
        fig = self.figures
        for _ in range(25):
            victim.proc.send_signal(signal.SIGSTOP)
            if await self._holds_entries(harness, victim.consumer):
                fig.kills_holding_entries += 1
                break
            victim.proc.send_signal(signal.SIGCONT)
            await asyncio.sleep(0.02)
        harness.kill(victim)
        fig.worker_kills += 1

    async def _holds_entries(self, harness: Harness, consumer: str) -> bool:
        for shard in harness.shards:
            with contextlib.suppress(redis.ResponseError):
                if await harness.client.xpending_range(
                    shard.updates, harness.group, min="-", max="+", count=1,
                    consumername=consumer,
                ):
                    return True
        return False

    async def _restart_redis(self, harness: Harness) -> None:
        assert self.restart is not None
        async with self._gate:  # the producer waits: its XADDs are not retried blindly
            await self.restart()
            # Pooled connections are dead: start afresh rather than retry a write.
            with contextlib.suppress(Exception):
                await harness.client.connection_pool.disconnect()
            for _ in range(100):
                try:
                    await harness.client.ping()
                    break
                except Exception:
                    await asyncio.sleep(0.1)
        self.figures.redis_restarts += 1

    async def _client_kill(self) -> None:
        for url in self.admin_urls:
            admin = redis.asyncio.Redis.from_url(url, decode_responses=True)
            try:
                for client in await admin.client_list(_type="normal"):
                    if client.get("name") == PRODUCER_NAME:
                        continue
                    # SKIPME (the default) spares this admin connection.
                    killed = await admin.execute_command("CLIENT", "KILL", "ID", client["id"])
                    self.figures.client_kills += int(killed)
            finally:
                await admin.aclose()

    async def _done_dropped(self, harness: Harness, turns: list[PlannedTurn]) -> dict[str, int]:
        """Entries dropped after the terminal event (counted on the done marker)."""
        out: dict[str, int] = {}
        for turn in turns:
            if turn.cancel_at is None:
                continue
            key = TurnKey(turn.rid)
            shard = harness.ns.shard_for(turn.rid)
            value = await harness.client.hget(shard.done(key.encode()), "dropped")
            out[turn.rid] = int(value or 0)
        return out

    def _logs(self) -> None:
        for sub in self._all_procs:
            for line in sub.log().splitlines():
                if '"reclaimed entries"' in line:
                    self.figures.reclaim_logs += 1
                if '"spilled held turns"' in line:
                    self.figures.spill_logs += 1
                    self.figures.spills[json.loads(line).get("why", "?")] += 1
                if '"stopped cleanly"' in line:
                    settled = json.loads(line).get("turns_settled", {})
                    self.figures.held_published += settled.get("held", 0)
                if '"level": "error"' in line:
                    self.figures.error_logs += 1
                    if len(self.problems) < 20:
                        self.problems.append(f"{sub.consumer} logged an error: {line[:200]} "
                                             f"... {line[-800:]}")

"""Cancellation latency and idle cost, on a private redis-server and workers.

Starts a redis-server and ``--workers`` ``processor run`` processes on
``--shards`` shards (2 and 2), opens ``--turns`` turns (one update each, so
every one is active and none ends by itself: the turn timeout is 600 s),
then, while a producer trickles updates into random turns, cancels
``--cancels`` of them at random moments over a window (``--windows``: a
burst within 1 s) with a plain ``SET`` of the cancellation key (as
``redis-cli`` would: no nudge, nothing else). It does so on turns *held*
(right after they opened: younger than ``--hold-ms``, in the workers'
memory), *checkpointed* (older than ``--hold-ms``: their merge stored as a
snapshot, their entries acked, still held) and *stored* (on workers with
``--no-hold-turns``, a record per entry), ``--runs``
times each, on fresh workers each time, and measures the time from the SET
to the turn's terminal ``synthesis`` event (the event's stream entry id is
Redis's clock at the XADD, read on the same host as the SET); the worst
run's p99 is what the target judges.

Then the idle cost: ``INFO commandstats`` read twice, ``--idle`` seconds
apart, with no input at all, after the first run (no active turn before it,
the turns left active after it) and on fresh workers with 1,000 and 10,000
open idle turns (``--idle-turns``): Redis calls per second.

    python bench/cancel_bench.py [--turns 1000] [--cancels 200] [--workers 2] [--shards 2]
                                 [--windows 1] [--ages held,checkpointed,stored] [--runs 3]
                                 [--idle 10] [--idle-turns 1000,10000] [--agui] [--no-write]

Writes its section of docs/benchmarks.md between the cancel-bench markers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio
from measures import idle_rates, percentile
from report import write_section

from processor.embedded import EmbeddedRedis
from processor.wire.defaults import GROUP
from processor.wire.ids import shard_of
from processor.wire.keys import Namespace

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "cancel-bench"  # (its markers in docs/benchmarks.md: write_section)
NAMESPACE = "cbench"
TARGET_MS = 250  # p99 of every run, at every age (issue 34)
IDLE_TARGET = 200  # Redis calls/s with 1,000 open idle turns
COMMAND = "python bench/cancel_bench.py"


@dataclass
class Run:
    """One burst: the turns' age (held, checkpointed, stored), its window, which run."""

    age: str
    window: float
    index: int
    figures: dict[str, Any]


def _update(text: str) -> str:
    return json.dumps({"type": "agent_response_update", "role": "assistant", "message_id": "m",
                       "contents": [{"type": "text", "text": text}]})


def spawn_workers(url: str, args: argparse.Namespace,
                  hold: bool = True) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(args.workers):
        cmd = [sys.executable, "-m", "processor.cli", "run", "--redis-url", url,
               "--namespace", NAMESPACE, "--shards", str(args.shards), "--consumer", f"cb{i}",
               "--turn-timeout", "600", "--hold-ms", str(args.hold_ms),
               "--log-level", "warning"]
        if args.agui:
            cmd.append("--agui")
        if not hold:
            cmd.append("--no-hold-turns")
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)}))
    return procs


async def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"cancel_bench: timed out waiting for {what}")
        await asyncio.sleep(0.05)


#: Commands listed by name in the idle table (the busiest); the rest are summed.
TOP_COMMANDS = 6


class Terminals:
    """Follows the events streams: the terminal events' (entry ms, status)."""

    def __init__(self, client: Any, streams: list[str]) -> None:
        self.client = client
        self.positions = {s: "$" for s in streams}
        self.seen: dict[str, list[tuple[int, str]]] = {}
        self.stop = False

    async def run(self) -> None:
        while not self.stop:
            reply = await self.client.xread(self.positions, block=100, count=1000)
            for stream, entries in reply or []:
                for entry_id, fields in entries:
                    self.positions[stream.decode()] = entry_id.decode()
                    if fields[b"type"] == b"synthesis":
                        event = json.loads(fields[b"event"])
                        ms = int(entry_id.split(b"-")[0])
                        self.seen.setdefault(event["response_id"], []).append(
                            (ms, event["status"]))


class Workers:
    """A private redis-server and ``args.workers`` workers on it, their
    groups created; ``close`` stops both."""

    def __init__(self, args: argparse.Namespace, hold: bool = True) -> None:
        self.args = args
        self.server = EmbeddedRedis().start()
        self.client = redis.asyncio.Redis.from_url(self.server.url)
        self.ns = Namespace(NAMESPACE, args.shards)
        self.procs = spawn_workers(self.server.url, args, hold)

    async def ready(self) -> None:
        async def groups_ready() -> bool:
            try:
                return all([await self.client.xinfo_groups(s.updates) for s in self.ns.all()])
            except redis.ResponseError:
                return False

        await wait_until(groups_ready, 60, "the workers' consumer groups")
        await asyncio.sleep(1)

    async def open(self, rids: list[str]) -> None:
        """One update of each turn, then until every one is active."""
        for i in range(0, len(rids), 5000):
            async with self.client.pipeline(transaction=False) as pipe:
                for rid in rids[i:i + 5000]:
                    pipe.xadd(self.ns.shard_for(rid).updates,
                              {"response_id": rid, "update": _update("hello ")})
                await pipe.execute()

        async def all_active() -> bool:
            return sum([await self.client.zcard(s.active) for s in self.ns.all()]) == len(rids)

        await wait_until(all_active, 120, f"{len(rids)} active turns")

    async def active(self) -> int:
        return sum([await self.client.zcard(s.active) for s in self.ns.all()])

    async def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
        await self.client.aclose()
        self.server.close()


def _rids(n: int) -> list[str]:
    return [f"turn-{i:05d}" for i in range(n)]


async def burst(args: argparse.Namespace, window: float, age: str,
                seed: int, idle: bool) -> dict[str, Any]:
    """Fresh workers, ``--turns`` turns opened, then (``checkpointed``: once
    they are older than ``--hold-ms``; ``stored``: on workers that store
    every entry, --no-hold-turns) ``--cancels`` of them cancelled at random
    moments over ``window`` seconds while a producer trickles updates into
    random turns; each cancel's latency (ms), and with ``idle`` the idle
    call rates before and after."""
    run = Workers(args, hold=age != "stored")
    try:
        await run.ready()
        baseline = await idle_rates(run.client, args.idle) if idle else {}
        rng = random.Random(seed)
        rids = _rids(args.turns)
        opened = time.monotonic()
        await run.open(rids)
        if age == "checkpointed":  # every turn checkpointed (its entries acked), still held
            await asyncio.sleep(max(0.0, opened + args.hold_ms / 1000 + 1.5 - time.monotonic()))
        elif age == "held" and time.monotonic() - opened + window > args.hold_ms / 1000 * 0.6:
            raise SystemExit("cancel_bench: the turns took too long to open to be cancelled "
                             "while held")
        latencies = await _cancel(run, args, rng, rids, window)
        still_active = await run.active()
        after: dict[str, float] = {}
        if idle:
            await asyncio.sleep(1)
            after = await idle_rates(run.client, args.idle)
        return {"version": run.server.version, "latencies": latencies, "baseline": baseline,
                "idle": after, "active": still_active}
    finally:
        await run.close()


async def _cancel(run: Workers, args: argparse.Namespace, rng: random.Random,
                  rids: list[str], window: float) -> list[float]:
    ns, url = run.ns, run.server.url
    terminals = Terminals(redis.asyncio.Redis.from_url(url), [s.events for s in ns.all()])
    reader = asyncio.create_task(terminals.run())
    await asyncio.sleep(0.3)  # the reader is blocked on "$"
    victims = rng.sample(rids, args.cancels)
    moments = sorted(rng.uniform(0, window) for _ in victims)
    trickling = True

    async def trickle() -> None:
        producer = redis.asyncio.Redis.from_url(url)
        while trickling:
            rid = rng.choice(rids)
            await producer.xadd(ns.shard_for(rid).updates,
                                {"response_id": rid, "update": _update("more ")})
            await asyncio.sleep(1 / args.trickle)
        await producer.aclose()

    trickler = asyncio.create_task(trickle())
    canceller = redis.asyncio.Redis.from_url(url)
    set_ms: dict[str, float] = {}
    start = time.monotonic()
    for rid, moment in zip(victims, moments, strict=True):
        await asyncio.sleep(max(0.0, start + moment - time.monotonic()))
        key = ns.shard(shard_of(rid, args.shards)).cancel(rid)
        set_ms[rid] = time.time() * 1000
        await canceller.set(key, "bench", ex=3600)
    await canceller.aclose()

    async def all_seen() -> bool:
        return all(rid in terminals.seen for rid in victims)

    await wait_until(all_seen, 60, "every cancelled turn's terminal event")
    trickling = False
    await trickler
    await asyncio.sleep(1)
    terminals.stop = True
    await reader
    await terminals.client.aclose()

    bad = {rid: terminals.seen[rid] for rid in victims
           if len(terminals.seen[rid]) != 1 or terminals.seen[rid][0][1] != "cancelled"}
    if bad:
        raise SystemExit(f"cancel_bench: wrong terminal events: {list(bad.items())[:5]}")
    others = [rid for rid in terminals.seen if rid not in set_ms]
    if others:
        raise SystemExit(f"cancel_bench: turns ended that were not cancelled: {others[:5]}")
    return [terminals.seen[rid][0][0] - set_ms[rid] for rid in victims]


async def idle_only(args: argparse.Namespace, turns: int) -> dict[str, float]:
    """Redis calls per second with ``turns`` open idle turns and no input."""
    run = Workers(args)
    try:
        await run.ready()
        opened = time.monotonic()
        await run.open(_rids(turns))
        # Once every turn is older than --hold-ms and checkpointed (a one-off
        # cost per turn, not an idle one): every entry acked.
        await asyncio.sleep(max(1.0, opened + args.hold_ms / 1000 + 1.5 - time.monotonic()))

        async def all_acked() -> bool:
            return all([(await run.client.xpending(s.updates, GROUP))["pending"] == 0
                        for s in run.ns.all()])

        await wait_until(all_acked, 300, "every held turn checkpointed")
        await asyncio.sleep(1)
        return await idle_rates(run.client, args.idle)
    finally:
        await run.close()


def _idle_verdict(turns: int, rate: float) -> str:
    """The idle target is for 1,000 open turns (none for the other counts)."""
    if turns != 1000:
        return "-"
    return "met" if rate <= IDLE_TARGET else "**not met**"


def report(args: argparse.Namespace, runs: list[Run], idles: dict[int, dict[str, float]],
           load: tuple[float, ...]) -> str:
    figures = runs[0].figures
    lines = []
    worst: dict[str, float] = {}
    for run in runs:
        lat = run.figures["latencies"]
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        worst[run.age] = max(worst.get(run.age, 0.0), p99)
        lines.append(f"| {run.age} | {run.window:g} s | {run.index} | {len(lat)} | {p50:.0f} ms "
                     f"| {p99:.0f} ms | {max(lat):.0f} ms |")
    table = "\n".join(lines)
    verdicts = "; ".join(f"{age}: worst p99 {p99:.0f} ms, "
                         f"{'met' if p99 <= TARGET_MS else '**not met**'}"
                         for age, p99 in worst.items())
    idle, base = figures["idle"], figures["baseline"]
    commands = sorted(set(idle) | set(base), key=lambda k: -idle.get(k, 0))
    top, rest = commands[:TOP_COMMANDS], commands[TOP_COMMANDS:]
    rows = "\n".join(f"| `{k}` | {base.get(k, 0):.1f} | {idle.get(k, 0):.1f} |" for k in top)
    if rest:
        rows += (f"\n| {len(rest)} others | {sum(base.get(k, 0) for k in rest):.1f} | "
                 f"{sum(idle.get(k, 0) for k in rest):.1f} |")
    totals = "\n".join(
        f"| {n:,} | {sum(rates.values()):,.0f} | "
        + ", ".join(f"`{k}` {v:,.0f}" for k, v in sorted(rates.items(), key=lambda kv: -kv[1])[:4])
        + f" | {_idle_verdict(n, sum(rates.values()))} |"
        for n, rates in idles.items())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip() or "?"
    return f"""## Cancellation: SET to terminal event, and idle cost

Measured at commit `{head}` with `{COMMAND}{' --agui' if args.agui else ''}` \
(redis-server {figures['version']}, {args.workers} `processor run` workers\
{' with `--agui`' if args.agui else ''}, {args.shards} shard(s), default `--sweep-interval` \
0.1 s and `--hold-ms` {args.hold_ms}). {args.turns:,} active turns (one update each); \
{args.cancels} of them cancelled by a plain `SET` of the cancellation key at random moments \
over the window while a producer trickled {args.trickle:g} updates/s into random turns, on \
fresh workers for each run: *held*, right after the turns opened (younger than `--hold-ms`, \
held in the workers' memory); *checkpointed*, once they are older than `--hold-ms` (their \
merge stored as a snapshot and their entries acked, still held); *stored*, on workers that \
store every entry (`--no-hold-turns`). Latency = the terminal event's stream entry time \
minus the time just before the SET.

| turns | window | run | cancels | p50 | p99 | max |
|---|---:|---:|---:|---:|---:|---:|
{table}

Target p99 <= {TARGET_MS} ms in every run (contract: 1 s): {verdicts}. Every cancelled turn \
had exactly one terminal event, `cancelled`; no other turn ended.

Redis calls per second with no input at all (`INFO commandstats` deltas over {args.idle:g} s; \
commands run inside scripts are counted too), on fresh workers with that many turns opened \
and left open (target: at most {IDLE_TARGET} for 1,000):

| open idle turns | calls/s | the busiest | target |
|---:|---:|---|---|
{totals}

And by command, with no active turn and with the {figures['active']} turns left active \
after the first run's cancels:

| command | 0 active turns | {figures['active']} active turns |
|---|---:|---:|
{rows}

Each sweep makes one script call (`evalsha`) per shard: `sweep_shard` (closing turns, \
timeouts, and whether the cancel keys of a slice of the active turns exist: 1,000, more \
when a shard has over 5,000 active turns, see docs/design.md), never their values: one \
multi-key `exists` per 500 turns, one per turn only in a chunk that has a cancel. The idle \
rates are measured once every turn is older than `--hold-ms` and checkpointed (every entry \
acked): the checkpoint is a one-off cost per turn.

The machine (2 logical CPUs) was shared with other jobs during the run (load average \
{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start): figures are noisy. \
Python {platform.python_version()}, {platform.platform()}."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--cancels", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--windows", default="1",
                        help="seconds the cancels span, runs for each (comma-separated)")
    parser.add_argument("--ages", default="held,checkpointed,stored",
                        help="cancel the turns while held, once checkpointed (older than "
                             "--hold-ms), or on workers storing every entry (comma-separated)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each age and window")
    parser.add_argument("--hold-ms", type=int, default=5000, help="the workers' --hold-ms")
    parser.add_argument("--trickle", type=float, default=100.0, help="updates/s meanwhile")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle measurement")
    parser.add_argument("--idle-turns", default="1000,10000",
                        help="open idle turns of each idle measurement (comma-separated)")
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--agui", action="store_true", help="workers run with --agui")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    load = os.getloadavg()
    runs = []
    for age in args.ages.split(","):
        for window in (float(w) for w in args.windows.split(",")):
            for index in range(1, args.runs + 1):
                figures = asyncio.run(burst(args, window, age,
                                            args.seed + index, idle=not runs))
                run = Run(age, window, index, figures)
                lat = figures["latencies"]
                print(f"{age} {window:g} s run {index}: p50 {percentile(lat, 50):.0f} ms, "
                      f"p99 {percentile(lat, 99):.0f} ms, max {max(lat):.0f} ms", flush=True)
                runs.append(run)
    idles = {}
    for n in (int(x) for x in args.idle_turns.split(",") if x):
        idles[n] = asyncio.run(idle_only(args, n))
        print(f"idle, {n:,} open turns: {sum(idles[n].values()):,.0f} Redis calls/s", flush=True)
    section = report(args, runs, idles, load)
    print(section)
    if not args.no_write:
        write_section(DOC, SECTION, section)
        print(f"\nwritten to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

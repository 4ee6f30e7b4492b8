"""Cancellation latency and idle cost, on a private redis-server and workers.

Starts a redis-server and ``--workers`` ``processor run`` processes, opens
``--turns`` turns (one update each, so every one is active and none ends by
itself: the turn timeout is 600 s), then, while a producer trickles updates
into random turns, cancels ``--cancels`` of them at random moments over
``--window`` seconds with a plain ``SET`` of the cancellation key (as
``redis-cli`` would: no nudge, nothing else); once spread over 5 s and once
as a burst within 1 s (``--windows 5,1``), each on fresh workers. For each it measures the time
from the SET to the turn's terminal ``synthesis`` event (the event's stream
entry id is Redis's clock at the XADD, read on the same host as the SET).

Then, with no traffic and the remaining turns still active, it reads
``INFO commandstats`` twice, ``--idle`` seconds apart, and reports the calls
per second the workers make; the same reading with no active turn at all
comes first, as the baseline.

    python bench/cancel_bench.py [--turns 1000] [--cancels 200] [--workers 2]
                                 [--shards 1] [--windows 5,1] [--agui] [--idle 10] [--no-write]

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
from pathlib import Path
from typing import Any

import redis.asyncio
from measures import idle_rates, percentile
from report import write_section

from processor.embedded import EmbeddedRedis
from processor.wire.ids import shard_of
from processor.wire.keys import Namespace

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "cancel-bench"  # (its markers in docs/benchmarks.md: write_section)
NAMESPACE = "cbench"


def _update(text: str) -> str:
    return json.dumps({"type": "agent_response_update", "role": "assistant", "message_id": "m",
                       "contents": [{"type": "text", "text": text}]})


def spawn_workers(url: str, args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(args.workers):
        cmd = [sys.executable, "-m", "processor.cli", "run", "--redis-url", url,
               "--namespace", NAMESPACE, "--shards", str(args.shards), "--consumer", f"cb{i}",
               "--turn-timeout", "600", "--log-level", "warning"]
        if args.agui:
            cmd.append("--agui")
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


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = EmbeddedRedis().start()
    procs: list[subprocess.Popen[bytes]] = []
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        ns = Namespace(NAMESPACE, args.shards)
        procs = spawn_workers(server.url, args)

        async def groups_ready() -> bool:
            try:
                return all([await client.xinfo_groups(s.updates) for s in ns.all()])
            except redis.ResponseError:
                return False

        await wait_until(groups_ready, 60, "the workers' consumer groups")
        await asyncio.sleep(1)
        baseline = await idle_rates(client, args.idle)

        rng = random.Random(args.seed)
        rids = [f"turn-{i:05d}" for i in range(args.turns)]
        async with client.pipeline(transaction=False) as pipe:
            for rid in rids:
                pipe.xadd(ns.shard_for(rid).updates, {"response_id": rid,
                                                      "update": _update("hello ")})
            await pipe.execute()

        async def all_active() -> bool:
            return sum([await client.zcard(s.active) for s in ns.all()]) == args.turns

        await wait_until(all_active, 120, f"{args.turns} active turns")

        terminals = Terminals(redis.asyncio.Redis.from_url(server.url),
                              [s.events for s in ns.all()])
        reader = asyncio.create_task(terminals.run())
        await asyncio.sleep(0.3)  # the reader is blocked on "$"
        victims = rng.sample(rids, args.cancels)
        moments = sorted(rng.uniform(0, args.window) for _ in victims)
        trickling = True

        async def trickle() -> None:
            producer = redis.asyncio.Redis.from_url(server.url)
            while trickling:
                rid = rng.choice(rids)
                await producer.xadd(ns.shard_for(rid).updates,
                                    {"response_id": rid, "update": _update("more ")})
                await asyncio.sleep(1 / args.trickle)
            await producer.aclose()

        trickler = asyncio.create_task(trickle())
        canceller = redis.asyncio.Redis.from_url(server.url)
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
        latencies = [terminals.seen[rid][0][0] - set_ms[rid] for rid in victims]

        still_active = sum([await client.zcard(s.active) for s in ns.all()])
        await asyncio.sleep(1)
        idle = await idle_rates(client, args.idle)
        return {"version": server.version, "latencies": latencies, "baseline": baseline,
                "idle": idle, "active": still_active}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
        await client.aclose()
        server.close()


def report(args: argparse.Namespace, runs: list[tuple[float, dict[str, Any]]],
           load: tuple[float, ...]) -> str:
    figures = runs[0][1]
    lines = []
    for window, run_figures in runs:
        lat = run_figures["latencies"]
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        verdict = "met" if p99 < 250 else "NOT met"
        lines.append(f"| {window:g} s | {len(lat)} | {p50:.0f} ms | {p99:.0f} ms | "
                     f"{max(lat):.0f} ms | {verdict} |")
    table = "\n".join(lines)
    idle, base = figures["idle"], figures["baseline"]
    commands = sorted(set(idle) | set(base), key=lambda k: -idle.get(k, 0))
    top, rest = commands[:TOP_COMMANDS], commands[TOP_COMMANDS:]
    rows = "\n".join(f"| `{k}` | {base.get(k, 0):.1f} | {idle.get(k, 0):.1f} |" for k in top)
    if rest:
        rows += (f"\n| {len(rest)} others | {sum(base.get(k, 0) for k in rest):.1f} | "
                 f"{sum(idle.get(k, 0) for k in rest):.1f} |")
    evals = idle.get("evalsha", 0.0)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip() or "?"
    return f"""## Cancellation: SET to terminal event, and idle cost

Measured at commit `{head}` with `python bench/cancel_bench.py{' --agui' if args.agui else ''}` \
(redis-server {figures['version']}, {args.workers} `processor run` workers\
{' with `--agui`' if args.agui else ''}, {args.shards} shard(s), default `--sweep-interval` \
0.1 s). {args.turns:,} active turns; {args.cancels} of them cancelled by a plain `SET` of the \
cancellation key at random moments over the window (fresh workers for each window) while a \
producer trickled {args.trickle:g} updates/s into random turns. Latency = the terminal event's \
stream entry time minus the time just before the SET.

| window | cancels | p50 | p99 | max | target p99 < 250 ms (contract: 1 s) |
|---:|---:|---:|---:|---:|---|
{table}

Every cancelled turn had exactly one terminal event, `cancelled`; no other turn ended.

Redis calls per second while idle (`INFO commandstats` deltas over {args.idle:g} s; commands \
run inside scripts are counted too), with no active turn and with the {figures['active']} \
turns left active:

| command | 0 active turns | {figures['active']} active turns |
|---|---:|---:|
{rows}

Each sweep makes two script calls (`evalsha`) per shard: `sweep_shard` (closing turns, \
timeouts) and `cancelled_turns`, which reads whether each cancel key of a slice of the active \
turns exists (1,000, more when a shard has over 5,000 active turns, see docs/design.md), never \
its value: {evals:.1f} calls/s for {figures['active']} active turns, and it does not grow \
with the number of active turns (two calls per shard per sweep per worker).

The machine (2 logical CPUs) was shared with other jobs during the run (load average \
{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start): figures are noisy. \
Python {platform.python_version()}, {platform.platform()}."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--cancels", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--windows", default="5,1",
                        help="seconds the cancels span, one run each (comma-separated)")
    parser.add_argument("--trickle", type=float, default=100.0, help="updates/s meanwhile")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle measurement")
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--agui", action="store_true", help="workers run with --agui")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    load = os.getloadavg()
    runs = []
    for window in (float(w) for w in args.windows.split(",")):
        args.window = window
        runs.append((window, asyncio.run(run(args))))
    section = report(args, runs, load)
    print(section)
    if not args.no_write:
        write_section(DOC, SECTION, section)
        print(f"\nwritten to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

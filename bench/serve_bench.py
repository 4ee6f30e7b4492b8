"""``processor serve`` under load: many open SSE clients, on a private
redis-server with ``processor run`` workers (live progress on, the default).

    python bench/serve_bench.py [--clients 1000] [--turns 200] [--workers 1]
                                [--seconds 20] [--fractions 0.5,0.25,0.1]
                                [--rate R] [--burst 3000] [--burst-rate 500]
                                [--burst-only]
                                [--idle 10] [--no-write]
                                [--format native|agui|ai-sdk]

1. Calibrate, unless ``--rate`` is given: the workers' throughput alone
   on fresh turns (``--calibrate`` updates over ``--turns`` turns, XADDed
   at once; from the first XADD to the last merged entry, on Redis's
   clock), for reference.
2. Start one ``processor serve`` (tokens on) and open ``--turns`` turns (one
   update each); once they are held past ``--hold-ms`` (stored, as under
   the load), the workers' throughput on them: ``--calibrate`` updates
   XADDed at once round-robin, then one stamped update per turn, to the
   last one's chunk event. The paces are shares of this one. Then
   ``--clients`` SSE clients spread evenly over the turns.
3. Load: a producer process paces text updates round-robin over the turns
   at each of ``--fractions`` of the calibrated throughput in turn, for
   ``--seconds`` each (after a 2 s warm-up); each delta carries ``time.time_ns()`` taken just before
   its XADD (the clock is the machine's, shared by every process and Redis),
   and each client notes when its chunk event arrives: p50/p99/max from
   XADD to arrival, over every (delta, client) pair of the updates sent in
   the window (waiting until every one has arrived); and, read from the
   events stream afterwards, XADD to the chunk event's entry (the worker's
   part of it: the entry id is Redis's clock).
4. Burst: while a producer paces ``--burst-rate`` updates/s over the turns,
   ``--burst`` more clients open a stream at the same moment (a replica
   restart or a network blip makes every browser reconnect at once),
   spread over the running turns, on top of the open ones: each join's
   time to its response headers and first event (p50/p99/max), the answers
   other than 200 (``EventSource`` gives up for good on one), the waits
   for a Redis slot (serve's ``processor_serve_redis_wait_seconds``) and the
   Redis calls the burst made (``INFO commandstats`` deltas). Its own
   section of docs/benchmarks.md; ``--burst-only`` runs it alone (no
   calibration, load or idle phases).
5. Idle: the producer and the workers stop (the turns stay running, so the
   streams stay open); serve's process CPU time (``/proc/<pid>/stat``) and
   Redis calls (``INFO commandstats`` deltas, less this script's INFO) over
   ``--idle`` s, with every client open, then with a tenth of them: the
   totals stay the same, so the cost per open client falls as clients come
   (one reader per shard fans out to every stream).

A client that the server drops as too slow (docs/serve.md, "Scaling and
limits") reconnects with its last id, as ``EventSource`` does; drops are
counted. Everything shares the machine's cores: the clients, the producer,
the workers, redis-server and serve.

``--format``: what the clients read, the native event stream (default),
its AG-UI form (``/events?format=agui``) or the AI SDK's UI message
stream (``/stream``; a reconnect there is a fresh join, not a resume).
The burst's joins are native streams whatever the format.

Writes its sections of docs/benchmarks.md between the serve-bench markers
(``serve-bench-<format>`` for the other formats) and the serve-burst ones
(replacing them) unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio
from measures import idle_rates, percentile
from report import write_section
from serve_load import (
    NAMESPACE,
    PATHS,
    SECRET,
    WARMUP,
    Bench,
    Client,
    burst,
    calibrate,
    calibrate_running,
    cpu_seconds,
    produce,
    stamps,
    update,
    wait_until,
)
from serve_report import burst_section, section

from processor.embedded import EmbeddedRedis
from processor.wire.defaults import HOLD_MS
from processor.wire.keys import Namespace

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "serve-bench"  # (its markers in docs/benchmarks.md: write_section)
BURST_SECTION = "serve-burst"


# --------------------------------------------------------------------------- run


def spawn_workers(url: str, args: argparse.Namespace, log: Any) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(
        [sys.executable, "-m", "processor.cli", "run", "--redis-url", url, "--namespace",
         NAMESPACE, "--shards", "1", "--consumer", f"sb{i}", "--turn-timeout",
         "600", "--log-level", "warning"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}) for i in range(args.workers)]


async def load(args: argparse.Namespace, bench: Bench, client: Any, ns: Namespace,
               serve_pid: int, url: str, rate: float) -> dict[str, Any]:
    """Pace updates at ``rate`` for a warm-up and ``--seconds``; the latency of
    every update stamped in the window, at each client (waiting until every
    one has arrived) and in the events stream."""
    bench.arrivals.clear()
    drops0 = bench.drops
    producer = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--produce", url, "--turns", str(args.turns),
        "--rate", str(rate), "--seconds", str(args.seconds + WARMUP),
        stdout=asyncio.subprocess.PIPE, cwd=ROOT)
    await asyncio.sleep(WARMUP)
    cpu0, own0, window = cpu_seconds(serve_pid), time.process_time(), [time.time_ns(), 0]
    await asyncio.sleep(args.seconds)
    window[1] = time.time_ns()
    cpu = cpu_seconds(serve_pid) - cpu0, time.process_time() - own0
    printed, _ = await producer.communicate()
    produced = json.loads(printed.decode().strip().splitlines()[-1])
    # Until no delta has arrived for 2 s: every one sent is at its clients.
    count, quiet = -1, 0.0
    while quiet < 2.0:
        await asyncio.sleep(0.5)
        quiet = quiet + 0.5 if len(bench.arrivals) == count else 0.0
        count = len(bench.arrivals)
    samples = [(arrived - stamp) / 1e6 for stamp, arrived in bench.arrivals
               if window[0] <= stamp <= window[1]]
    sent = produced["sent"] * args.seconds / (args.seconds + WARMUP)
    figures = {"rate": rate, "achieved": produced["sent"] / produced["seconds"],
               "samples": samples, "expected": round(sent * args.clients / args.turns),
               "published": await publish_delays(client, ns, window),
               "serve_cpu": cpu[0] / args.seconds, "client_cpu": cpu[1] / args.seconds,
               "drops": bench.drops - drops0}
    print(f"{rate:,.0f}/s: p50 {percentile(samples, 50):.1f} ms, "
          f"p99 {percentile(samples, 99):.1f} ms", flush=True)
    return figures


async def publish_delays(client: Any, ns: Namespace, window: list[int]) -> list[float]:
    """XADD to the chunk event's entry in the events stream (the worker's
    part of the latency; the entry id is Redis's clock, on this machine), ms,
    for the updates stamped within ``window``; read after the load."""
    stream, start, out = ns.shard(0).events, f"{window[0] // 1_000_000}-0", []
    while True:
        entries = await client.xrange(stream, min=start, max="+", count=5000)
        for entry_id, fields in entries:
            if fields.get(b"type") == b"synthesis.chunk":
                for stamp in stamps(fields[b"event"]):
                    if window[0] <= stamp <= window[1]:
                        out.append(int(entry_id.split(b"-")[0]) - stamp / 1e6)
        if len(entries) < 5000:
            return out
        start = "(" + entries[-1][0].decode()


async def idle_figures(client: Any, serve_pid: int, seconds: float) -> dict[str, Any]:
    cpu0 = cpu_seconds(serve_pid)
    calls = await idle_rates(client, seconds)
    cpu1 = cpu_seconds(serve_pid)
    return {"cpu": (cpu1 - cpu0) / seconds, "calls": calls, "total": sum(calls.values())}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = EmbeddedRedis().start()
    client = redis.asyncio.Redis.from_url(server.url)
    log_dir = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    logs = open(log_dir / "workers.log", "wb")  # noqa: SIM115 (closed in finally)
    workers: list[subprocess.Popen[bytes]] = []
    serve: subprocess.Popen[bytes] | None = None
    bench = Bench()
    try:
        ns = Namespace(NAMESPACE, 1)
        workers = spawn_workers(server.url, args, logs)

        async def group_ready() -> bool:
            try:
                return bool(await client.xinfo_groups(ns.shard(0).updates))
            except redis.ResponseError:
                return False

        await wait_until(group_ready, 60, "the workers' consumer group")
        fractions = [float(f) for f in args.fractions.split(",")]
        throughput = 0.0 if args.rate or args.burst_only else await calibrate(client, ns, args)
        running = 0.0
        print(f"workers alone on fresh turns: {throughput:,.0f} updates/s", flush=True)

        serve_log = log_dir / "serve.log"
        with open(serve_log, "wb") as out:
            serve = subprocess.Popen(
                [sys.executable, "-m", "processor.cli", "serve", "--redis-url", server.url,
                 "--namespace", NAMESPACE, "--host", "127.0.0.1", "--port", "0",
                 "--log-level", "info"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "PROCESSOR_TOKEN_SECRET": SECRET})
        port = 0
        deadline = time.monotonic() + 30
        while not port:
            for line in serve_log.read_text(errors="replace").splitlines():
                if '"msg": "serving"' in line:
                    port = int(json.loads(line)["port"])
            if serve.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("serve_bench: processor serve did not start:\n"
                                 + serve_log.read_text(errors="replace"))
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{port}"

        async def ready() -> bool:
            with contextlib.suppress(aiohttp.ClientError):
                async with aiohttp.ClientSession() as probe, \
                        probe.get(f"{url}/readyz") as answer:
                    return answer.status == 200
            return False

        await wait_until(ready, 30, "processor serve to be ready")

        rids = [f"turn-{i:04d}" for i in range(args.turns)]
        async with client.pipeline(transaction=False) as pipe:
            for rid in rids:
                pipe.xadd(ns.shard(0).updates, {"response_id": rid, "update": update("hi ")})
            await pipe.execute()

        async def all_active() -> bool:
            return bool(int(await client.zcard(ns.shard(0).active)) >= args.turns)

        await wait_until(all_active, 120, f"{args.turns} running turns")
        if not args.rate and not args.burst_only:
            await asyncio.sleep(HOLD_MS / 1000 + 1)  # (stored from here on, as under the load)
            running = await calibrate_running(client, ns, args, rids)
            print(f"workers alone on the running turns: {running:,.0f} updates/s", flush=True)

        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=30)
        session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        clients = [Client(bench, rids[i % args.turns], PATHS[args.format])
                   for i in range(args.clients)]
        for c in clients:
            c.task = asyncio.create_task(c.run(session, url))
            await asyncio.sleep(0)

        async def all_open() -> bool:
            if bench.errors:
                raise SystemExit(f"serve_bench: {bench.errors[:3]}")
            return bool(bench.opened >= args.clients)

        await wait_until(all_open, 120, f"{args.clients} open streams")
        print(f"{bench.opened} streams open", flush=True)

        loads = [] if args.burst_only else \
            [await load(args, bench, client, ns, serve.pid, server.url, running * f)
             for f in fractions] if not args.rate else \
            [await load(args, bench, client, ns, serve.pid, server.url, args.rate)]
        bursts = []
        if args.burst:
            producer = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--produce", server.url, "--turns", str(args.turns),
                "--rate", str(args.burst_rate), "--seconds", "600",
                stdout=asyncio.subprocess.DEVNULL, cwd=ROOT) if args.burst_rate else None
            await asyncio.sleep(WARMUP)
            bursts.append(await burst(url, client, rids, args.burst, serve.pid))
            bursts[-1]["rate"] = args.burst_rate
            if producer is not None:
                producer.terminate()
                await producer.wait()
        if args.burst_only:
            bench.closing = True
            for c in clients:
                assert c.task is not None
                c.task.cancel()
            await asyncio.gather(*(c.task for c in clients if c.task), return_exceptions=True)
            await session.close()
            return {"version": server.version, "throughput": 0.0, "running": 0.0,
                    "loads": [], "bursts": bursts, "idle": []}

        # Idle: nothing writes; the turns stay running, the streams open.
        for proc in workers:
            proc.terminate()
        for proc in workers:
            proc.wait(30)
        await asyncio.sleep(2)
        idle_all = await idle_figures(client, serve.pid, args.idle)
        idle_all["clients"] = bench.opened
        keep = max(1, args.clients // 10)
        bench.closing = True  # (no reconnects from here on)
        for c in clients[keep:]:
            assert c.task is not None
            c.task.cancel()
        await asyncio.gather(*(c.task for c in clients[keep:] if c.task),
                             return_exceptions=True)
        await asyncio.sleep(3)  # the server notices the closed streams
        idle_few = await idle_figures(client, serve.pid, args.idle)
        idle_few["clients"] = bench.opened
        for c in clients[:keep]:
            assert c.task is not None
            c.task.cancel()
        await asyncio.gather(*(c.task for c in clients[:keep] if c.task),
                             return_exceptions=True)
        await session.close()
        return {"version": server.version, "throughput": throughput, "running": running,
                "loads": loads, "bursts": bursts,
                "idle": [idle_all, idle_few]}
    finally:
        if serve is not None and serve.poll() is None:
            serve.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                serve.wait(15)
        for proc in workers:
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(15)
        logs.close()
        await client.aclose()
        server.close()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--fractions", default="0.5,0.25,0.1",
                        help="of the workers' throughput alone to pace the updates at, "
                        "one load phase each (default 0.5,0.25,0.1)")
    parser.add_argument("--rate", type=float, default=0,
                        help="updates/s to pace at, one phase (skips the calibration)")
    parser.add_argument("--calibrate", type=int, default=40000,
                        help="updates the calibration sends")
    parser.add_argument("--burst", type=int, default=3000,
                        help="streams opened at the same moment after the loads (0: none)")
    parser.add_argument("--burst-rate", type=float, default=500,
                        help="updates/s a producer paces during the burst (0: none)")
    parser.add_argument("--burst-only", action="store_true",
                        help="no calibration, load or idle phases: the burst alone, written "
                        "to its own section")
    parser.add_argument("--idle", type=float, default=10)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--format", choices=sorted(PATHS), default="native",
                        help="what the clients read (default: the native event stream)")
    parser.add_argument("--produce", metavar="URL", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.produce:
        asyncio.run(produce(args.produce, args.turns, args.rate, args.seconds))
        return 0
    load = os.getloadavg()
    r = asyncio.run(run(args))
    name = SECTION if args.format == "native" else f"{SECTION}-{args.format}"
    bodies = [] if args.burst_only else [(name, section(args, r, load))]
    if r["bursts"]:
        bodies.append((BURST_SECTION, burst_section(args, r, load)))
    for name, body in bodies:
        print(body)
        if not args.no_write:
            write_section(DOC, name, body, after=SECTION)
            print(f"wrote {name} in {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import redis.asyncio
from measures import idle_rates, percentile
from report import write_section

from processor.embedded import EmbeddedRedis
from processor.serve.tokens import issue
from processor.wire.defaults import HOLD_MS
from processor.wire.keys import Namespace

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "serve-bench"  # (its markers in docs/benchmarks.md: write_section)
BURST_SECTION = "serve-burst"
NAMESPACE = "sbench"
SECRET = "serve-bench-secret-0123456789"
#: Where each ``--format``'s clients read a turn (after ``/v1/turns/<id>``).
PATHS = {"native": "/events", "agui": "/events?format=agui", "ai-sdk": "/stream"}
#: A delta's stamp: a chunk coalesces the updates a batch merged into its
#: turn, each update's text one stamp ("t<time_ns> "), all of them counted.
MARK = re.compile(rb'"delta":"([^"]*)"')
STAMP = re.compile(rb"t(\d{19}) ")


def stamps(data: bytes) -> list[int]:
    """The stamps of the chunk deltas in ``data`` (not of a snapshot's text)."""
    return [int(stamp) for delta in MARK.findall(data) for stamp in STAMP.findall(delta)]
WARMUP = 2.0


def update(text: str) -> str:
    return json.dumps({"type": "agent_response_update", "role": "assistant", "message_id": "m",
                       "author_name": "bench", "contents": [{"type": "text", "text": text}]})


def resp(args: list[str]) -> bytes:
    """One command in the Redis protocol (an array of bulk strings)."""
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        out += [f"${len(data)}\r\n".encode(), data, b"\r\n"]
    return b"".join(out)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"serve_bench: timed out waiting for {what}")
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- producer


async def produce(url: str, turns: int, rate: float, seconds: float) -> None:
    """Paced XADDs of text updates, round-robin over the turns, each delta
    stamped with the monotonic clock just before it is written (run as a
    process of its own: ``--produce``)."""
    ns = Namespace(NAMESPACE, 1)
    stream = ns.shard(0).updates
    rids = [f"turn-{i:04d}" for i in range(turns)]
    parsed = urlparse(url)
    reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
    answered = 0

    async def replies() -> None:
        nonlocal answered
        while True:
            head = await reader.readline()
            if not head.startswith(b"$"):
                raise RuntimeError(f"XADD failed: {head!r}")
            await reader.readexactly(int(head[1:]) + 2)
            answered += 1

    reading = asyncio.create_task(replies())
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate)
        if due > sent:
            stamp = time.time_ns()
            writer.write(b"".join(
                resp(["XADD", stream, "*", "response_id", rids[i % turns],
                      "update", update(f"t{stamp} ")]) for i in range(sent, due)))
            sent = due
            await writer.drain()
        await asyncio.sleep(0.002)
    deadline = time.monotonic() + 30
    while answered < sent and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    reading.cancel()
    writer.close()
    print(json.dumps({"sent": sent, "answered": answered,
                      "seconds": time.monotonic() - started}), flush=True)


# --------------------------------------------------------------------------- clients


class Client:
    """One SSE client of one turn: notes each marked delta's arrival."""

    def __init__(self, bench: Bench, rid: str, path: str = PATHS["native"]) -> None:
        self.bench, self.rid, self.path = bench, rid, path
        self.last_id: str | None = None
        self.open = False
        self.task: asyncio.Task[None] | None = None

    async def run(self, session: aiohttp.ClientSession, url: str) -> None:
        token = issue(SECRET, self.rid, int(time.time()) + 3600)
        while not self.bench.closing:
            headers = {"Authorization": f"Bearer {token}"}
            if self.last_id is not None:
                headers["Last-Event-ID"] = self.last_id
            try:
                async with session.get(f"{url}/v1/turns/{self.rid}{self.path}",
                                       headers=headers) as response:
                    if response.status != 200:
                        if response.status != 503:  # 503: not ready yet, or Redis: retry
                            self.bench.errors.append(f"{response.status} for {self.rid}")
                            return
                        raise ConnectionError
                    self.open = True
                    self.bench.opened += 1
                    await self._read(response)
            except (aiohttp.ClientError, ConnectionError):
                pass
            finally:
                if self.open:
                    self.open = False
                    self.bench.opened -= 1
            if not self.bench.closing:
                self.bench.reconnects += 1
                await asyncio.sleep(0.2)

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        """Whole frames only (a read can end inside one): each stamp counted
        when the frame that holds it has arrived."""
        buffer = b""
        async for chunk in response.content.iter_any():
            now = time.time_ns()
            buffer += chunk
            end = buffer.rfind(b"\n\n")
            if end < 0:
                continue
            frames, buffer = buffer[:end + 2], buffer[end + 2:]
            for stamp in stamps(frames):
                self.bench.arrivals.append((stamp, now))
            if b'"dropped"' in frames:
                self.bench.drops += 1
            ids = re.findall(rb"(?:^|\n)id: (\d+)\n", frames)
            if ids:
                self.last_id = ids[-1].decode()


class Bench:
    def __init__(self) -> None:
        self.arrivals: list[tuple[int, int]] = []  # (stamp, arrival) of each delta, ns
        self.closing = False
        self.opened = 0
        self.drops = 0
        self.reconnects = 0
        self.errors: list[str] = []


# --------------------------------------------------------------------------- burst


WAIT = "processor_serve_redis_wait_seconds"


async def burst(url: str, client: Any, rids: list[str], count: int,
                serve_pid: int) -> dict[str, Any]:
    """``count`` streams opened at the same moment; each join's time to its
    headers and first event, and its status."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    go = asyncio.Event()
    tokens = {rid: issue(SECRET, rid, int(time.time()) + 3600) for rid in rids}

    async def join(session: aiohttp.ClientSession, rid: str) -> tuple[int, float, float]:
        await go.wait()
        started = time.monotonic()
        try:
            async with session.get(f"{url}/v1/turns/{rid}/events",
                                   headers={"Authorization": f"Bearer {tokens[rid]}"}) as r:
                headers = time.monotonic() - started
                if r.status != 200:
                    return r.status, headers, headers
                buffer = b""
                while (at := buffer.find(b"data:")) < 0 or buffer.find(b"\n\n", at) < 0:
                    chunk = await r.content.readany()
                    if not chunk:
                        break
                    buffer += chunk
                return 200, headers, time.monotonic() - started
        except (aiohttp.ClientError, TimeoutError) as exc:
            return -1 if not isinstance(exc, TimeoutError) else -2, 0.0, 0.0

    before = await client.info("commandstats")
    wait0 = await serve_metric(url, WAIT)
    cache0 = await serve_metric(url, "processor_serve_turn_cache_total")
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(join(session, rids[i % len(rids)])) for i in range(count)]
        await asyncio.sleep(0.5)  # every task waits on the same event
        started, cpu0, own0 = time.monotonic(), cpu_seconds(serve_pid), time.process_time()
        go.set()
        results = await asyncio.gather(*tasks)
        took = time.monotonic() - started
        cpu = (cpu_seconds(serve_pid) - cpu0) / took, (time.process_time() - own0) / took
    after = await client.info("commandstats")
    wait1 = await serve_metric(url, WAIT)
    cache1 = await serve_metric(url, "processor_serve_turn_cache_total")
    calls = {name[len("cmdstat_"):]: int(after[name]["calls"]) - int(
        before.get(name, {}).get("calls", 0)) for name in after}
    calls = {k: v for k, v in calls.items() if v and k not in ("info",)}
    ok = [r for r in results if r[0] == 200]
    statuses: dict[str, int] = {}
    for status, _, _ in results:
        if status != 200:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
    figures = {"count": count, "seconds": took, "headers": [r[1] * 1000 for r in ok],
               "first": [r[2] * 1000 for r in ok], "non_200": statuses, "calls": calls,
               "waits": wait1[f"{WAIT}_count"] - wait0[f"{WAIT}_count"],
               "wait_sum": wait1[f"{WAIT}_sum"] - wait0[f"{WAIT}_sum"],
               "cache": {k: cache1[k] - cache0.get(k, 0.0) for k in cache1},
               "serve_cpu": cpu[0], "client_cpu": cpu[1]}
    print(f"burst of {count}: headers p50 {percentile(figures['headers'] or [0], 50):.0f} ms, "
          f"p99 {percentile(figures['headers'] or [0], 99):.0f} ms, non-200 {statuses}, "
          f"cache {figures['cache']}",
          flush=True)
    return figures


async def serve_metric(url: str, name: str) -> dict[str, float]:
    """The samples of one metric of serve's /metrics, by name and labels."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as r:
        text = await r.text()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name)}


# --------------------------------------------------------------------------- run


def spawn_workers(url: str, args: argparse.Namespace, log: Any) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(
        [sys.executable, "-m", "processor.cli", "run", "--redis-url", url, "--namespace",
         NAMESPACE, "--shards", "1", "--consumer", f"sb{i}", "--turn-timeout",
         "600", "--log-level", "warning"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}) for i in range(args.workers)]


async def calibrate(client: Any, ns: Namespace, args: argparse.Namespace) -> float:
    """The workers' throughput alone, in updates/s (Redis's clock)."""
    shard = ns.shard(0)
    per_turn = args.calibrate // args.turns
    before = await client.xlen(shard.merged)
    first_id = None
    async with client.pipeline(transaction=False) as pipe:
        for _ in range(per_turn):
            for i in range(args.turns):
                pipe.xadd(shard.updates, {"response_id": f"cal-{i:04d}", "update": update("x ")})
        for i in range(args.turns):
            pipe.xadd(shard.updates, {"response_id": f"cal-{i:04d}", "kind": "end"})
        ids = await pipe.execute()
    first_id = ids[0]

    async def merged_all() -> bool:
        return bool(int(await client.xlen(shard.merged)) >= before + args.turns)

    await wait_until(merged_all, 300, "the calibration turns")
    last = await client.xrevrange(shard.merged, count=1)
    ms = int(last[0][0].split(b"-")[0]) - int(first_id.split(b"-")[0])
    return float(per_turn * args.turns / (ms / 1000))


async def calibrate_running(client: Any, ns: Namespace, args: argparse.Namespace,
                            rids: list[str]) -> float:
    """The workers' throughput alone on the load's own pattern, in updates/s
    (Redis's clock): ``--calibrate`` text updates XADDed at once round-robin
    over the running turns (held longer than --hold-ms by now, so
    checkpointed, as they are under the load), then one stamped update per turn; from the
    first XADD to the last stamped update's chunk event."""
    shard = ns.shard(0)
    per_turn = args.calibrate // len(rids)
    async with client.pipeline(transaction=False) as pipe:
        for _ in range(per_turn):
            for rid in rids:
                pipe.xadd(shard.updates, {"response_id": rid, "update": update("c ")})
        marks: set[int] = set()
        for rid in rids:
            stamp = time.time_ns()
            marks.add(stamp)
            pipe.xadd(shard.updates, {"response_id": rid, "update": update(f"t{stamp} ")})
        ids = await pipe.execute()
    first, last, start = int(ids[0].split(b"-")[0]), 0, ids[0]
    seen: set[int] = set()
    deadline = time.monotonic() + 300
    while seen != marks:
        if time.monotonic() > deadline:
            raise SystemExit("serve_bench: timed out waiting for the calibration updates")
        for entry_id, fields in await client.xrange(shard.events, min=start, max="+",
                                                    count=5000):
            start = b"(" + entry_id
            if fields.get(b"type") == b"synthesis.chunk":
                for stamp in stamps(fields[b"event"]):
                    if stamp in marks:
                        seen.add(stamp)
                        last = int(entry_id.split(b"-")[0])
        await asyncio.sleep(0.05)
    return float((per_turn + 1) * len(rids) / ((last - first) / 1000))


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


def section(args: argparse.Namespace, r: dict[str, Any], load: tuple[float, ...]) -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip() or "?"
    rows = []
    for f in r["loads"]:
        samples, pub = f["samples"] or [0.0], f["published"] or [0.0]
        share = f" ({f['rate'] / r['running']:.2f} of it)" if r["running"] else ""
        rows.append(
            f"| {f['rate']:,.0f}/s{share}, {f['achieved']:,.0f}/s sent | "
            f"{percentile(samples, 50):.1f} / {percentile(samples, 99):.1f} / "
            f"{max(samples):.1f} ms | {len(f['samples']):,} of {f['expected']:,} | "
            f"{percentile(pub, 50):.1f} / {percentile(pub, 99):.1f} ms | "
            f"{f['serve_cpu'] * 100:.0f}% | {f['client_cpu'] * 100:.0f}% | {f['drops']} |")
    idle_rows = []
    for idle in r["idle"]:
        n = max(1, idle["clients"])
        idle_rows.append(f"| {idle['clients']:,} | {idle['cpu'] * 1000:.2f} ms/s | "
                         f"{idle['cpu'] * 1e6 / n:.2f} µs/s | {idle['total']:.2f} | "
                         f"{idle['total'] / n:.4f} |")
    commands = ", ".join(f"`{k}` {v:.2f}/s" for k, v in sorted(
        r["idle"][0]["calls"].items(), key=lambda kv: -kv[1]))
    command = shlex.join(["python", "bench/serve_bench.py", *sys.argv[1:]])
    calibrated = (
        f"The worker's throughput alone (nothing else running), on the load's pattern "
        f"(`--calibrate` updates XADDed at once round-robin over the {args.turns} running "
        f"turns, held past `--hold-ms` by then and so checkpointed, as under the load; from the "
        f"first XADD to the last one's chunk event): {r['running']:,.0f} updates/s; "
        f"on fresh turns XADDed whole (held): {r['throughput']:,.0f} updates/s. The paces "
        f"below are shares of the first. " if r["running"] else "")
    title = "" if args.format == "native" else \
        f" ({args.format}: `/v1/turns/<id>{PATHS[args.format]}`)"
    return f"""## `processor serve`: open SSE clients{title}

Measured at commit `{head}` with `{command}` (redis-server {r['version']}, \
{args.workers} `processor run` worker(s) (live progress on, the default), one \
`processor serve` process with tokens on, {args.clients:,} {args.format} SSE clients over \
{args.turns} running turns, {args.clients // args.turns} per turn, all in one client \
process). {calibrated}A producer process paced text updates round-robin over the turns \
for {args.seconds:g} s after a {WARMUP:g} s warm-up, at each pace below in turn. \
Latency = the time a chunk event reached a client minus the time just before its \
update's XADD (the machine's clock), for every (update, client) pair of the updates \
sent in the window, waiting until all had arrived; the worker's part = the chunk event's \
entry time in the events stream (Redis's clock) minus the same XADD time. CPU = process CPU \
time over the window, in share of one core.

| paced | at a client p50 / p99 / max | samples | worker's part p50 / p99 | serve CPU \
| clients' CPU | dropped as slow |
|---|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

Idle (no writes, workers stopped, the turns still running so the streams stay open): serve's \
process CPU time and Redis calls per second (`INFO commandstats` deltas over {args.idle:g} s, \
this script's INFO left out), with every client open and with a tenth of them:

| open streams | serve CPU | per open stream | Redis calls/s | per open stream |
|---:|---:|---:|---:|---:|
{chr(10).join(idle_rows)}

The Redis calls do not grow with the clients: one `XREAD BLOCK` per shard in flight (the \
hub's reader, 1 s block) feeds every stream ({commands} with all open). A stream costs \
memory and a heartbeat every `--heartbeat` s, not Redis calls. A client that cannot keep up \
is dropped with its resume id once `--client-queue` events wait for it, or a write blocks \
`--write-timeout` s (`tests/serve/test_serve_stream.py::\
test_a_client_that_does_not_read_is_dropped_with_its_resume_id`); nothing is buffered \
without bound; a dropped client here resumes from its last id, as `EventSource` does.

Every process here shares the machine's 2 logical CPUs: the clients' process reading \
{args.clients:,} streams, the producer, the worker(s), redis-server and serve; load average \
{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start. \
Python {platform.python_version()}, {platform.platform()}."""


def burst_section(args: argparse.Namespace, r: dict[str, Any], load: tuple[float, ...]) -> str:
    """The burst's section of docs/benchmarks.md."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip() or "?"
    command = shlex.join(["python", "bench/serve_bench.py", *sys.argv[1:]])
    rows = []
    for b in r["bursts"]:
        heads, firsts = b["headers"] or [0.0], b["first"] or [0.0]
        non_200 = sum(b["non_200"].values())
        detail = f" ({', '.join(f'{k}: {v}' for k, v in sorted(b['non_200'].items()))})" \
            if non_200 else ""
        mean_wait = b["wait_sum"] / b["waits"] * 1000 if b["waits"] else 0.0
        calls = ", ".join(f"`{k}` {v:,}" for k, v in sorted(b["calls"].items(),
                                                            key=lambda kv: -kv[1])[:6])
        rows.append(
            f"| {b['count']:,} | {percentile(heads, 50):,.0f} / {percentile(heads, 99):,.0f} / "
            f"{max(heads):,.0f} ms | {percentile(firsts, 50):,.0f} / "
            f"{percentile(firsts, 99):,.0f} ms | {non_200}{detail} | {mean_wait:,.0f} ms "
            f"over {b['waits']:,.0f} | {b['seconds']:.1f} s | {b['serve_cpu'] * 100:.0f}% | "
            f"{b['client_cpu'] * 100:.0f}% | {calls} |")
    paced = f"a producer pacing {r['bursts'][0]['rate']:,.0f} text updates/s round-robin over " \
        "the turns (from 2 s before the burst to its end)" if r["bursts"][0]["rate"] else \
        "nothing written meanwhile"
    after = "after the load phases above" if r["loads"] else \
        "with no load phases before it (`--burst-only`)"
    return f"""## `processor serve`: a burst of joins

Measured at commit `{head}` with `{command}` (redis-server {r['version']}, \
{args.workers} `processor run` worker(s), one `processor serve` process with tokens on and \
its default options, {args.clients:,} SSE clients already open over {args.turns} running \
turns, {after}; {paced}). `--burst` more clients open a stream at the same moment, spread \
over the running turns: what a replica restart or a network blip brings, every browser \
reconnecting at once; each is a fresh join (a `snapshot` first). Join = the time to the \
response's headers (the turn's state and past are read by then); first event = to the \
`snapshot`; non-200: answers other than 200 (`EventSource` gives up for good on one; issue 33 saw \
2,574 of 3,000 get 503 before joins waited for a Redis connection); wait = serve's \
`processor_serve_redis_wait_seconds` (a request waits for one of `--redis-connections` slots \
instead of failing); CPU = process CPU time over the burst, in share of one core; Redis \
calls = `INFO commandstats` deltas over the burst, the workers' \
included (serve's per-turn cache shares one read of a turn's past among its joins; a \
running turn's state is read per join).

| clients | join p50 / p99 / max | first event p50 / p99 | non-200 | mean wait for a slot \
| all answered in | serve CPU | clients' CPU | Redis calls |
|---:|---:|---:|---:|---:|---:|---:|---:|---|
{chr(10).join(rows)}

Every process shares the machine's 2 logical CPUs (the clients' process, the producer, the \
worker(s), redis-server and serve); load average {load[0]:.2f} / {load[1]:.2f} / \
{load[2]:.2f} at the start. Python {platform.python_version()}, {platform.platform()}."""


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

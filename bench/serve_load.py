"""What ``bench/serve_bench.py`` puts on ``processor serve`` and its workers:
the producer (a process of its own, ``serve_bench.py --produce``) pacing
stamped text updates round-robin over the turns, the calibrations (the
workers' throughput alone, on fresh turns and on the running ones), the SSE
clients that note each stamp's arrival, and the burst of joins opened at
the same moment; with what the run shares with them (the namespace, the
token secret, the stamps, the clocks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
from measures import percentile

from processor.serve.tokens import issue
from processor.wire.keys import Namespace

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


# --------------------------------------------------------------------------- calibration


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

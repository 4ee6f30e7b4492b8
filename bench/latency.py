"""The latency run of ``bench/run.py``: a paced producer and one worker, and
the time from a turn's ``end`` entry to its ``merged`` entry."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from scenarios import Ctx, spawn_workers
from support.worker_harness import Harness
from workload import Workload, forget


@dataclass
class Latency:
    rate: float  # updates/s offered
    achieved: float  # updates/s the producer kept up
    samples: list[float]  # ms, one per turn, after the warm-up turns


async def latency(ctx: Ctx, work: Workload, rate: float, warmup: int = 100,
                  **flags: Any) -> Latency:
    """A paced producer at ``rate`` updates/s and one worker: time from sending
    a turn's ``end`` entry to reading its merged entry (both clocks here).

    The producer writes XADD commands encoded before the clock starts
    (``RawProducer``): this process shares the machine's two cores with
    the worker and redis-server, and redis-py's per-command packing took
    about 40% of a core at 9,000 updates/s, CPU a producer on its own
    machine would not take from the worker."""
    client = ctx.client
    async with Harness(ctx.url, "lat", log_dir=ctx.log_dir) as harness:
        subs = spawn_workers(harness, 1, **flags)  # e.g. hold_turns=False: --no-hold-turns
        shard = harness.shards[0]
        sent: dict[bytes, float] = {}
        got: dict[bytes, float] = {}
        producer = await RawProducer.connect(ctx.url, shard.updates, work.entries)
        try:
            await harness.wait_started(subs, timeout=120)
            reader = asyncio.create_task(_read_merged(harness.connect(), shard.merged,
                                                      len(work.turns), got))
            per_second = rate * work.size / work.updates  # entries, ends included
            started = time.perf_counter()
            done = 0
            while done < work.size:
                await asyncio.sleep(0.002)
                due = min(work.size, int((time.perf_counter() - started) * per_second))
                if due <= done:
                    continue
                now = time.perf_counter()
                producer.send(done, due)
                for fields in work.entries[done:due]:
                    if fields.get("kind") == "end":
                        sent[fields["response_id"].encode()] = now
                done = due
            achieved = work.updates / (time.perf_counter() - started)
            await producer.close()
            await asyncio.wait_for(reader, 600)
        finally:
            for sub in list(harness.procs):
                harness.terminate(sub)
        await forget(client, "{lat:*")
    order = [rid.encode() for rid in work.turns][warmup:]
    samples = [1000 * (got[rid] - sent[rid]) for rid in order]
    return Latency(rate, achieved, samples)


class RawProducer:
    """XADDs written as RESP bytes encoded up front, on a connection of their
    own; a task reads the replies and checks each is an entry id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 commands: list[bytes]) -> None:
        self.writer, self.commands = writer, commands
        self.sent = self.answered = 0
        self.replies = asyncio.create_task(self._replies(reader))

    @classmethod
    async def connect(cls, url: str, stream: str, entries: list[dict[str, str]]) -> RawProducer:
        parsed = urlparse(url)
        reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
        return cls(reader, writer, [_resp(["XADD", stream, "*", *_flat(e)]) for e in entries])

    def send(self, start: int, end: int) -> None:
        self.writer.write(b"".join(self.commands[start:end]))
        self.sent += end - start

    async def close(self, timeout: float = 60) -> None:
        """Wait for a reply to every XADD sent, then hang up."""
        await self.writer.drain()
        deadline = time.perf_counter() + timeout
        while self.answered < self.sent:
            if self.replies.done():  # a reply that was not an entry id, or a closed socket
                self.replies.result()
                raise RuntimeError("the connection closed before every XADD was answered")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{self.sent - self.answered} XADDs unanswered")
            await asyncio.sleep(0.01)
        self.replies.cancel()
        self.writer.close()

    async def _replies(self, reader: asyncio.StreamReader) -> None:
        while True:
            head = await reader.readline()
            if not head.startswith(b"$"):
                raise RuntimeError(f"XADD failed: {head!r}")
            await reader.readexactly(int(head[1:]) + 2)
            self.answered += 1


def _flat(fields: dict[str, str]) -> list[str]:
    return [part for pair in fields.items() for part in pair]


def _resp(args: list[str]) -> bytes:
    """One command in the Redis protocol (an array of bulk strings)."""
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        out += [f"${len(data)}\r\n".encode(), data, b"\r\n"]
    return b"".join(out)


async def _read_merged(client: Any, stream: str, count: int, got: dict[bytes, float]) -> None:
    last = "0-0"
    while len(got) < count:
        reply = await client.xread({stream: last}, count=1000, block=1000)
        now = time.perf_counter()
        for _name, entries in reply or []:
            for entry_id, fields in entries:
                got[fields[b"response_id"]] = now
                last = entry_id
    await client.aclose()


def median_round(rounds: list[Latency]) -> Latency:
    """The round whose p99 is the median of the rounds' (the lower middle one
    of an even count)."""
    ordered = sorted(rounds, key=lambda lat: percentile(lat.samples, 99))
    return ordered[(len(ordered) - 1) // 2]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]

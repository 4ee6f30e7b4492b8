"""The end-to-end measurements of ``bench/run.py``, one coroutine each.

Every run gets its own namespace on the same redis-server. Throughput runs
start their consumers first (idle, groups created), then fill the stream with
one server-side ``COPY`` of the template (:mod:`workload`): the clock starts
at the ``COPY`` (Redis time) and stops at the Redis time of the last output
(the stream id of the last merged entry, or the drain's own reading), so
consumer start-up and producer speed are outside every figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import workload
from workload import ROOT, Workload, copy_into, id_ms

from processor.embedded.ports import free_port
from processor.ids import TurnKey

sys.path.insert(0, str(ROOT / "tests"))
import scrape
from memory_runs import drain_outputs, used_memory
from worker_harness import Harness

BENCH = Path(__file__).resolve().parent


@dataclass
class Ctx:
    """What every run needs: the server, a client on it, where logs go."""

    url: str
    client: Any
    server_pid: int
    log_dir: Path
    template: str = "bench:template"


@dataclass
class Throughput:
    name: str
    updates: int
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by process kind
    profile: str = ""  # py-spy raw output file, when profiled
    turns: int = 0
    # Turns the workers published from their own copy of the merge (mirror)
    # and from the records read back from Redis (replay): processor only.
    settled: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.updates / self.seconds


class Consumer:
    """A bench consumer process (drain, peer) that prints ``ready`` once its
    consumer group exists. A thread reads its output all along (a full pipe
    would block the process on its next log line); lines are kept for errors."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()
        with self._seen:
            self.lines.append("")  # end of output
            self._seen.notify_all()

    def _wait(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._seen:
            while True:
                for line in self.lines[seen:]:
                    if line == "":
                        raise RuntimeError(f"{self.proc.args} exited:\n"
                                           + "".join(self.lines[-20:]))
                    if line.startswith(prefix):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {prefix!r} from {self.proc.args}")
                self._seen.wait(left)

    async def line(self, prefix: str, timeout: float) -> str:
        return await asyncio.to_thread(self._wait, prefix, timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reader.join(5)


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


class CpuMeter:
    """CPU seconds used by the consumers and by redis-server during a run."""

    def __init__(self, consumers: list[int], server: int) -> None:
        self.pids = {"consumers": consumers, "redis": [server]}
        self.start = {k: _cpu(v) for k, v in self.pids.items()}

    def read(self) -> dict[str, float]:
        return {k: _cpu(v) - self.start[k] for k, v in self.pids.items()}


async def wait_len(client: Any, key: str, count: int, timeout: float, alive: Any) -> None:
    deadline = time.monotonic() + timeout
    while await client.xlen(key) < count:
        alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {key} has {await client.xlen(key)} of {count}")
        await asyncio.sleep(0.02)


async def last_id_ms(client: Any, key: str) -> int:
    last = await client.xrevrange(key, count=1)
    return id_ms(last[0][0])


async def forget(client: Any, pattern: str) -> None:
    """Delete a finished run's keys, so the next run starts from the same memory."""
    keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
    for start in range(0, len(keys), 1000):
        await client.unlink(*keys[start:start + 1000])


# --------------------------------------------------------------------------- the limit


async def drain(ctx: Ctx, work: Workload) -> Throughput:
    client, stream = ctx.client, "{drain:0}:updates"
    proc = Consumer([str(BENCH / "drain.py"), ctx.url, stream, str(work.size)])
    try:
        await proc.line("ready", 60)
        meter = CpuMeter([proc.proc.pid], ctx.server_pid)
        start = await copy_into(client, ctx.template, stream)
        done = int((await proc.line("done", 600)).split()[1])
        return Throughput("drain", work.updates, (done - start) / 1000, meter.read())
    finally:
        proc.stop()
        await client.delete(stream)


async def _merging_consumer(ctx: Ctx, work: Workload, name: str, script: str,
                            prefix: str, *extra: str) -> Throughput:
    """A bench consumer process that publishes one entry per turn to
    ``{prefix:0}:merged``, timed from the ``COPY`` to its last merged entry."""
    client, stream, merged = ctx.client, f"{{{prefix}:0}}:updates", f"{{{prefix}:0}}:merged"
    proc = Consumer([str(BENCH / script), ctx.url, stream, merged, *extra])
    try:
        await proc.line("ready", 60)
        meter = CpuMeter([proc.proc.pid], ctx.server_pid)
        start = await copy_into(client, ctx.template, stream)

        def alive() -> None:
            if proc.proc.poll() is not None:
                raise RuntimeError(f"{name} exited:\n" + "".join(proc.lines[-20:]))

        await wait_len(client, merged, len(work.turns), 3600, alive)
        end = await last_id_ms(client, merged)
        return Throughput(name, work.updates, (end - start) / 1000, meter.read())
    finally:
        proc.stop()
        await forget(client, f"{{{prefix}:0}}*")
        await forget(client, f"{prefix}:*")


async def ceiling(ctx: Ctx, work: Workload) -> Throughput:
    """processor's decode and merge with every turn in memory (bench/ceiling.py)."""
    return await _merging_consumer(ctx, work, "in-memory ceiling", "ceiling.py", "ceiling",
                                   "{ceiling:0}:events")


# --------------------------------------------------------------------------- the peer


async def faststream(ctx: Ctx, work: Workload) -> Throughput:
    return await _merging_consumer(ctx, work, "FastStream", "peer_faststream.py", "peer")


# --------------------------------------------------------------------------- processor


def spawn_workers(harness: Harness, n: int, **options: Any) -> list[Any]:
    return [harness.spawn(None, "--log-level", "info", **options) for _ in range(n)]


async def profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling one worker (raw collapsed stacks, 250 Hz, without pausing it)."""
    spy = subprocess.Popen(["py-spy", "record", "--format", "raw", "--rate", "250",
                            "--nonblocking", "--output", str(out), "--pid", str(pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    await asyncio.sleep(1.0)  # py-spy attaches
    if spy.poll() is not None:
        raise RuntimeError("py-spy failed: " + (spy.stderr.read().decode() if spy.stderr else ""))
    return spy


async def processor(
    ctx: Ctx, work: Workload, workers: int, profile: Path | None = None,
    flags: tuple[str, ...] = (), shards: int = 1, launcher: tuple[str, ...] = (),
) -> Throughput:
    """``workers`` ``processor run`` processes (with extra ``flags``, started
    through ``launcher``, e.g. pyinstrument) on the stream, or on ``shards``
    shards of it (templates :func:`shard_template`)."""
    client, ns = ctx.client, f"e2e{workers}s{shards}"
    turns = [len(part.turns) for part in work.split(shards)] if shards > 1 else [len(work.turns)]
    async with Harness(ctx.url, ns, shards, log_dir=ctx.log_dir) as harness:
        ports = [free_port() for _ in range(workers)]
        subs = [harness.spawn(None, "--log-level", "info", *flags, metrics_port=port,
                              launcher=launcher)
                for port in ports]
        try:
            await harness.wait_started(subs, timeout=120)
            # Each worker takes its shards at its first beat (at start): let
            # every worker see the others before the stream fills.
            await asyncio.sleep(1.5 if workers > 1 and shards > 1 else 0)
            spy = await profiler(subs[0].proc.pid, profile) if profile else None
            meter = CpuMeter([s.proc.pid for s in subs], ctx.server_pid)
            copied = []  # (the clock starts when the first shard's copy is in)
            for shard in harness.shards:
                template = ctx.template if shards == 1 else shard_template(ctx, shards, shard.index)
                copied.append(await copy_into(client, template, shard.updates))
            start = copied[0]
            end = 0
            for shard, count in zip(harness.shards, turns, strict=True):
                await wait_len(client, shard.merged, count, 3600, harness.assert_workers_alive)
                end = max(end, await last_id_ms(client, shard.merged))
            cpu = meter.read()
            settled = await settled_by_source(ports)
            if spy is not None:
                spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
                spy.wait(60)
            dead = sum([await client.xlen(shard.dlq) for shard in harness.shards])
            if dead:
                raise RuntimeError(f"{dead} entries dead-lettered in a clean run")
        finally:
            for sub in list(harness.procs):
                harness.terminate(sub)
        await forget(client, f"{{{ns}:*")
    label = f"processor, {workers} worker" + ("s" if workers > 1 else "")
    if workers > 1 or shards > 1:
        label += f", {shards} shard" + ("s" if shards > 1 else "")
    return Throughput(label, work.updates, (end - start) / 1000, cpu, str(profile or ""),
                      len(work.turns), settled)


def shard_template(ctx: Ctx, shards: int, index: int) -> str:
    """The template stream of shard ``index`` of ``shards`` (``make_shard_templates``)."""
    return f"{ctx.template}:s{shards}:{index}"


async def make_shard_templates(ctx: Ctx, work: Workload, shards: int) -> None:
    for index, part in enumerate(work.split(shards)):
        await workload.make_template(ctx.client, shard_template(ctx, shards, index), part,
                                     ["processor"])


def pyinstrument_launcher(out: Path) -> tuple[str, ...]:
    """``python -m pyinstrument`` writing a text call tree to ``out`` when
    the worker exits (SIGTERM: it drains and returns): wall-clock samples
    every ms, the event loop's callbacks and the coroutine steps they run."""
    return ("-m", "pyinstrument", "--renderer", "text", "--no-color", "--outfile", str(out),
            "--interval", "0.001", "-p", "processor_options.filter_threshold=0.01")


async def settled_by_source(ports: list[int]) -> dict[str, float]:
    """``processor_turns_settled_total`` by source, summed over the workers."""
    total: dict[str, float] = {}
    for port in ports:
        page = await scrape.scrape(port)
        for source, n in page.by_label("processor_turns_settled_total", "source").items():
            total[source] = total.get(source, 0) + n
    return total


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


async def memory(ctx: Ctx, work: Workload, done_ttl: int = 1) -> Memory:
    """Redis memory held per active turn (every update applied, none ended)."""
    updates = [e for e in work.entries if e.get("kind") != "end"]
    ends = [e for e in work.entries if e.get("kind") == "end"]
    raw = sum(len(k) + len(v) for e in updates for k, v in e.items())
    client = ctx.client
    async with Harness(ctx.url, "mem", log_dir=ctx.log_dir, done_ttl=done_ttl) as harness:
        subs = spawn_workers(harness, 1, done_ttl=done_ttl)
        shard = harness.shards[0]
        try:
            await harness.wait_started(subs, timeout=120)
            before = await used_memory(client)
            await harness.add(updates, chunk=5000)
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
    return Memory(len(work.turns), raw, before, active, state, events, drained, cleaned)


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


__all__ = ["Ctx", "Memory", "RssRun", "Throughput", "workload"]

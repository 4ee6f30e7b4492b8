"""The end-to-end measurements of ``bench/run.py``, one coroutine each.

Every run gets its own namespace on the same redis-server. Throughput runs
start their consumers first (idle, groups created), then fill the stream with
one server-side ``COPY`` of the template (``workload``): the clock starts
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import workload
from workload import ROOT, Workload, copy_into, forget, id_ms

from processor.embedded.ports import free_port

sys.path.insert(0, str(ROOT / "tests"))
from support import scrape
from support.worker_harness import Harness

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
    # Turns the workers published from their own merge (held, or their mirror)
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


# --------------------------------------------------------------------------- the limit


#: How a run's input gets in: given the update streams of its shards, it
#: fills them and returns the Redis time (ms) the clock starts at. By
#: default a ``COPY`` of the template (``copied``); the paced runs
#: (``live_turns``) produce instead.
Feed = Callable[[list[str]], Awaitable[int]]


def copied(ctx: Ctx, shards: int = 1) -> Feed:
    """The feed of the throughput runs: each shard's stream a ``COPY`` of its
    template, the clock starting when the first is in."""

    async def feed(streams: list[str]) -> int:
        copied = []
        for index, stream in enumerate(streams):
            template = ctx.template if shards == 1 else shard_template(ctx, shards, index)
            copied.append(await copy_into(ctx.client, template, stream))
        return copied[0]

    return feed


async def drain(ctx: Ctx, work: Workload, feed: Feed | None = None) -> Throughput:
    client, stream = ctx.client, "{drain:0}:updates"
    proc = Consumer([str(BENCH / "drain.py"), ctx.url, stream, str(work.size)])
    try:
        await proc.line("ready", 60)
        meter = CpuMeter([proc.proc.pid], ctx.server_pid)
        start = await (feed or copied(ctx))([stream])
        done = int((await proc.line("done", 3600)).split()[1])
        return Throughput("drain", work.updates, (done - start) / 1000, meter.read())
    finally:
        proc.stop()
        await client.delete(stream)


async def _merging_consumer(ctx: Ctx, work: Workload, name: str, script: str,
                            prefix: str, *extra: str, feed: Feed | None = None) -> Throughput:
    """A bench consumer process that publishes one entry per turn to
    ``{prefix:0}:merged``, timed from the ``COPY`` (or ``feed``'s first
    entry) to its last merged entry."""
    client, stream, merged = ctx.client, f"{{{prefix}:0}}:updates", f"{{{prefix}:0}}:merged"
    proc = Consumer([str(BENCH / script), ctx.url, stream, merged, *extra])
    try:
        await proc.line("ready", 60)
        meter = CpuMeter([proc.proc.pid], ctx.server_pid)
        start = await (feed or copied(ctx))([stream])

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


async def faststream(ctx: Ctx, work: Workload, feed: Feed | None = None) -> Throughput:
    return await _merging_consumer(ctx, work, "FastStream", "peer_faststream.py", "peer",
                                   feed=feed)


# --------------------------------------------------------------------------- processor


def spawn_workers(harness: Harness, n: int, **options: Any) -> list[Any]:
    """``n`` workers; ``options`` become flags as ``Harness.spawn`` makes them
    (``done_ttl=1`` -> ``--done-ttl 1``, ``hold_turns=False`` -> ``--no-hold-turns``)."""
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
    feed: Feed | None = None, label: str = "",
) -> Throughput:
    """``workers`` ``processor run`` processes (with extra ``flags``, started
    through ``launcher``, e.g. pyinstrument) on the stream, or on ``shards``
    shards of it (templates ``shard_template``), filled by ``feed``
    (default: ``copied``); ``label`` names the row (default: from the
    flags)."""
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
            start = await (feed or copied(ctx, shards))([s.updates for s in harness.shards])
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
    return Throughput(label or _label(workers, shards, flags), work.updates,
                      (end - start) / 1000, cpu, str(profile or ""), len(work.turns), settled)


def _label(workers: int, shards: int, flags: tuple[str, ...]) -> str:
    """A processor row's name, from its workers, shards and flags."""
    label = f"processor, {workers} worker" + ("s" if workers > 1 else "")
    if workers > 1 or shards > 1:
        label += f", {shards} shard" + ("s" if shards > 1 else "")
    if "--no-hold-turns" in flags:  # the stored path: a record of every entry in Redis
        label += ", stored turns"
    if "--no-progress" in flags:  # no live progress events, no live log
        label += ", no live progress"
    return label


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


__all__ = ["Ctx", "Throughput", "workload"]

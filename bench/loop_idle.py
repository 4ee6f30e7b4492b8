"""How long one worker's event loop waits on Redis.

Runs one ``Worker`` in this process over the
end-to-end workload (``--turns`` turns, a server-side ``COPY`` of a
pre-filled stream, as ``bench/run.py`` does) and prints, per round, the
throughput, the wall and CPU seconds, and the seconds its event loop spent
blocked in ``select`` with nothing to run: the time that better overlap of
the worker's Python with redis-server's scripts could win at most. Starts
its own redis-server::

    python bench/loop_idle.py [--turns 3000] [--rounds 3] [--free-decode-merge]
        [--no-hold-turns] [--drain] [--gen0 N] [--live UPDATES] [--hold-ms MS]
        [--no-progress] [--sweep-interval S] [--commandstats]

The worker holds turns, as by default; with ``--no-hold-turns`` it stores
every entry (the stored path). A diagnostic for trying a change to the
shard loop (compare the idle seconds, which move less with the machine's
load than the throughput), not a figure of ``docs/benchmarks.md``'s
tables. ``--free-decode-merge`` bounds what a faster decode and merge
could give: every entry's decoding is looked up in a table built before
the clock starts (a held turn's waiting updates too), and ``Turn.fold``
skips updates (the responses come out empty; everything else, the
scripts, the records stored with ``--no-hold-turns``, the worker's copies
and the outputs, runs as usual).
``--drain`` also times, each round before the worker, a drain of the same
stream in this process (``bench/drain.py``'s loop: XREADGROUP COUNT 500,
XACK per batch) and prints the worker's ratio to it: with
``--free-decode-merge``, how close to the limit a worker could come if
decoding and merging cost nothing. The worker runs with ``processor
run``'s collector settings (``host.run.tune_gc``; ``--gen0`` sets another
generation-0 threshold), and each round also prints the seconds the cyclic
garbage collector ran (a ``gc.callbacks`` hook) and its passes per generation.
``--commandstats`` also prints redis-server's time per update, per command
(``INFO commandstats``) and per script (its slow log, kept whole for the
round): a script's time includes the commands it calls.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import selectors
import time
from typing import Any

import live_turns
import redis.asyncio
import workload
from drain import drain_group
from measures import print_commandstats, print_scripts

from processor.embedded import EmbeddedRedis
from processor.engine import merge
from processor.host.run import tune_gc
from processor.ingest.decode import decode_stream_entry
from processor.redis_io.connections import fast_stream_reads
from processor.scripts import stored_calls
from processor.wire.keys import Namespace
from processor.worker.held import batch as held_batch
from processor.worker.held import holds
from processor.worker.worker import Worker, WorkerConfig

TEMPLATE = "loop_idle:template"


class IdleClock:
    """Seconds the event loop's selector spent blocked, since the last ``reset``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._select = selectors.EpollSelector.select

    def install(self) -> None:
        clock, select = self, self._select

        def timed(selector: selectors.EpollSelector, timeout: float | None = None) -> Any:
            started = time.perf_counter()
            try:
                return select(selector, timeout)
            finally:
                clock.seconds += time.perf_counter() - started

        selectors.EpollSelector.select = timed  # type: ignore[method-assign]

    def reset(self) -> None:
        self.seconds = 0.0


class GcClock:
    """Seconds the cyclic garbage collector ran and its passes per generation,
    since the last ``reset``."""

    def __init__(self) -> None:
        self.seconds, self.passes, self._started = 0.0, [0, 0, 0], 0.0
        gc.callbacks.append(self._on_pass)

    def _on_pass(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.passes[info["generation"]] += 1

    def reset(self) -> None:
        self.seconds, self.passes = 0.0, [0, 0, 0]


async def one_round(client: Any, url: str, work: workload.Workload, index: int,
                    idle: IdleClock, hold: bool = False, batch: int = 500,
                    hold_ms: int | None = None,
                    progress: bool = True,
                    sweep_interval: float | None = None,
                    commandstats: bool = False) -> tuple[float, float, float]:
    """Wall, CPU and idle seconds of one worker over the whole stream."""
    namespace = f"loop_idle{index}"
    shard = next(iter(Namespace(namespace, 1).all()))
    # The worker's own client, as `processor run` makes it (connections.connect:
    # its own reply parsing, which the drain's client must not get).
    own = redis.asyncio.Redis.from_url(url)
    fast_stream_reads(own)
    more: dict[str, Any] = {"progress": progress}
    if hold_ms is not None:
        more["hold_ms"] = hold_ms
    if sweep_interval is not None:
        more["sweep_interval"] = sweep_interval
    worker = Worker(own, WorkerConfig(namespace=namespace, hold_turns=hold, batch=batch, **more))
    task = asyncio.create_task(worker.run())
    await worker.ready.wait()
    await asyncio.sleep(0.3)  # its first idle reads are under way
    idle.reset()
    if commandstats:
        await client.config_resetstat()
        await client.config_set("slowlog-log-slower-than", 0)
        await client.config_set("slowlog-max-len", 1000000)
        await client.slowlog_reset()
    cpu, wall = time.process_time(), time.perf_counter()
    await client.copy(TEMPLATE, shard.updates, replace=True)
    while await client.xlen(shard.merged) < len(work.turns):
        await asyncio.sleep(0.005)
    result = time.perf_counter() - wall, time.process_time() - cpu, idle.seconds
    if commandstats:
        print_commandstats(await client.info("commandstats"), work.updates)
        await client.config_set("slowlog-log-slower-than", 10000)
        print_scripts(await client.slowlog_get(1000000), work.updates)
    worker.stop()
    await task
    await own.aclose()
    await workload.forget(client, "{" + namespace + ":*")
    return result


async def drain_round(client: Any, work: workload.Workload, index: int) -> float:
    """Seconds to drain a copy of the stream (bench/drain.py's loop, in this process)."""
    stream, group = f"loop_idle_drain{index}", "drain"
    await client.copy(TEMPLATE, stream, replace=True)
    await client.xgroup_create(stream, group, id="0")
    wall = time.perf_counter()
    await drain_group(client, stream, group, work.size)
    seconds = time.perf_counter() - wall
    await client.unlink(stream)
    return seconds


def free_decode_merge(work: workload.Workload) -> None:
    """Make decoding a dict lookup and merging an update nothing (see the docstring)."""
    table: dict[bytes, Any] = {}
    for entry in work.entries:
        fields = {k.encode(): v.encode() for k, v in entry.items()}
        table[_lookup_key(fields)] = decode_stream_entry(fields)

    def decoded(fields: dict[bytes, bytes], max_entry_bytes: int = 0) -> Any:
        return table[_lookup_key(fields)]

    def decoded_plain(texts: list[bytes]) -> list[Any]:  # a held turn's waiting updates
        return [table[text][1].update for text in texts]

    stored_calls.decode_stream_entry = decoded  # type: ignore[assignment]
    held_batch.decode_stream_entry = decoded  # type: ignore[assignment]
    holds.decode_stream_entry = decoded  # type: ignore[assignment]
    holds.decode_plain = decoded_plain  # type: ignore[assignment]
    merge.Turn.fold = lambda turn, update: None  # type: ignore[method-assign,assignment]


def _lookup_key(fields: dict[bytes, bytes]) -> bytes:
    update = fields.get(b"update")
    return update if update is not None else fields[b"response_id"] + b"|" + fields[b"kind"]


async def main(turns: int, rounds: int, free: bool, hold: bool, drain: bool,
               gen0: int | None, batch: int, live: int = 0, hold_ms: int | None = None,
               progress: bool = True, sweep_interval: float | None = None,
               commandstats: bool = False) -> None:
    idle = IdleClock()
    idle.install()
    with EmbeddedRedis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        work = live_turns.round_robin(turns, live) if live else workload.build(turns)
        await workload.make_template(client, TEMPLATE, work, [WorkerConfig().group])
        if free:
            free_decode_merge(work)
        tune_gc()
        if gen0 is not None:
            gc.set_threshold(gen0, *gc.get_threshold()[1:])
        collector = GcClock()
        for index in range(rounds):
            drained = await drain_round(client, work, index) if drain else 0.0
            collector.reset()
            wall, cpu, waited = await one_round(client, server.url, work, index, idle, hold,
                                                  batch, hold_ms, progress, sweep_interval,
                                                  commandstats)
            versus = (f"  drain {work.updates / drained:,.0f} updates/s, worker / drain "
                      f"{drained / wall:.2f}" if drain else "")
            print(f"{work.updates / wall:9,.0f} updates/s  wall {wall:.2f} s  "
                  f"CPU {cpu:.2f} s  loop idle {waited:.2f} s  GC {collector.seconds:.3f} s "
                  f"(passes {'/'.join(map(str, collector.passes))}){versus}", flush=True)
        await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--free-decode-merge", action="store_true",
                        help="decoding a table lookup, merging an update nothing")
    parser.add_argument("--no-hold-turns", action="store_true",
                        help="the worker stores every entry (the stored path)")
    parser.add_argument("--drain", action="store_true",
                        help="also time a drain of the stream each round, and the ratio")
    parser.add_argument("--gen0", type=int,
                        help="generation-0 threshold instead of the worker's")
    parser.add_argument("--live", type=int, default=0, metavar="UPDATES",
                        help="the many-live-turns workload instead (bench/live_turns.py): "
                             "--turns turns of this many text updates, round-robin")
    parser.add_argument("--hold-ms", type=int,
                        help="the worker's --hold-ms (default: processor run's)")
    parser.add_argument("--no-progress", action="store_true",
                        help="the worker without live progress (--no-progress)")
    parser.add_argument("--sweep-interval", type=float,
                        help="the worker's --sweep-interval (default: processor run's)")
    parser.add_argument("--batch", type=int, default=500,
                        help="the worker's --batch (XREADGROUP COUNT); the drain keeps 500")
    parser.add_argument("--commandstats", action="store_true",
                        help="also print redis-server's time per command, per update")
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.rounds, args.free_decode_merge, not args.no_hold_turns,
                     args.drain, args.gen0, args.batch, args.live, args.hold_ms,
                     not args.no_progress, args.sweep_interval, args.commandstats))

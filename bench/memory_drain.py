"""Memory after a drain: does a worker leave anything behind in Redis?

Starts a private redis-server, runs workers over ``--updates`` updates
(default 100,000; plain text turns of ``--per-turn`` updates), waits until
every turn is merged and drained, then does what a downstream reader and
time do: deletes the output streams it read (as a consumer that trims them
would) and waits for the finished turns' ``done`` markers to expire (the
workers run with a short ``--done-ttl``). It prints ``INFO memory``
``used_memory`` before the run (warmed up), at its peak and after the drain.

    python bench/memory_drain.py [--updates N] [--per-turn K] [--workers W]
                                 [--shards S] [--done-ttl SECONDS]

tests/worker/test_worker_memory.py runs the same code with fewer updates.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "tests")]

from support.memory_runs import memory_drain  # noqa: E402
from support.worker_harness import Harness  # noqa: E402

from processor.embedded import EmbeddedRedis  # noqa: E402


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.3f} MiB"


async def main(args: argparse.Namespace) -> int:
    server = EmbeddedRedis().start()
    try:
        namespace = f"bench{uuid.uuid4().hex[:6]}"
        async with Harness(server.url, namespace, shards=args.shards,
                           done_ttl=args.done_ttl) as harness:
            await harness.start_workers(args.workers)
            started = time.perf_counter()
            figures = await memory_drain(harness, args.updates, args.per_turn, args.done_ttl)
            elapsed = time.perf_counter() - started
        print(f"redis-server {server.version}, {args.workers} in-process worker(s), "
              f"{args.shards} shard(s)")
        print(f"updates {figures.updates}, turns {figures.turns}, {elapsed:.1f} s "
              f"(incl. the {args.done_ttl:g} s done TTL wait)")
        print(f"used_memory before {figures.before} ({_mib(figures.before)})")
        print(f"used_memory peak   {figures.peak} ({_mib(figures.peak)})")
        print(f"used_memory after  {figures.after} ({_mib(figures.after)})")
        print(f"growth             {figures.growth:+d} bytes ({_mib(figures.growth)})")
        ok = abs(figures.growth) < (1 << 20)
        print("within 1 MiB: " + ("yes" if ok else "NO"))
        return 0 if ok else 1
    finally:
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--per-turn", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--done-ttl", type=int, default=1)
    sys.exit(asyncio.run(main(parser.parse_args())))

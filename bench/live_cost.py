"""Live progress on against off (``--no-progress``), one worker, CPU to the
hundredth of a second: the ``bench/run.py --quick`` stream (6,000 turns),
the two workers alternating ``--rounds`` times on it (``processor run``
processes, as ``bench/run.py`` starts them); prints each run, then the
medians (rate, worker and redis-server CPU seconds, per update) and the
ratio of the median rates::

    python bench/live_cost.py [--turns 6000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

import redis.asyncio
import scenarios
import workload
from scenarios import Ctx, Throughput

from processor.embedded import EmbeddedRedis


async def measure(turns: int, rounds: int) -> None:
    with EmbeddedRedis() as server, tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        client = redis.asyncio.Redis.from_url(server.url)
        ctx = Ctx(server.url, client, server.pid or 0, Path(tmp))
        work = workload.build(turns)
        await workload.make_template(client, ctx.template, work, ["processor"])
        rows: dict[str, list[Throughput]] = {"on": [], "off": []}
        for _ in range(rounds):
            for name, flags in (("on", ()), ("off", ("--no-progress",))):
                run = await scenarios.processor(ctx, work, 1, flags=flags)
                rows[name].append(run)
                print(f"{name:>3}: {run.rate:>9,.0f} updates/s, worker "
                      f"{run.cpu['consumers']:.2f} s, redis {run.cpu['redis']:.2f} s CPU",
                      flush=True)
        for name, runs in rows.items():
            worker = statistics.median(r.cpu["consumers"] for r in runs)
            redis_cpu = statistics.median(r.cpu["redis"] for r in runs)
            print(f"{name:>3} median: {statistics.median(r.rate for r in runs):,.0f} updates/s, "
                  f"worker {worker:.2f} s ({worker / work.updates * 1e6:.2f} us/update), "
                  f"redis {redis_cpu:.2f} s ({redis_cpu / work.updates * 1e6:.2f} us/update)")
        on, off = (statistics.median(r.rate for r in rows[n]) for n in ("on", "off"))
        print(f"on/off {on / off:.2f} (median rates)")
        await client.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=6000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    asyncio.run(measure(args.turns, args.rounds))


if __name__ == "__main__":
    main()

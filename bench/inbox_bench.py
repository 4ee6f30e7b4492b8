"""The least-privilege producer's path (``Producer(inbox=True)``) against the
trusted one (``XADD``), end to end, on a private redis-server and workers.

For each path, on a namespace of its own with fresh ``processor run``
workers: a throughput run (``--turns`` turns of ``--updates`` text deltas
and an end, sent by ``--senders`` concurrent producers through
``processor.client.Producer``, from the first send until every turn is
merged) and a latency run (``--latency-turns`` turns started at ``--rate``
turns/s, each sending its updates back to back; latency = the merged
entry's stream time minus the producer's clock just before it sent the
turn's ``end``: the send, the inbox's admission, the read, the merge and the
publish). Then Redis calls per second of the idle workers (``INFO
commandstats`` deltas over ``--idle`` s): what admitting the inboxes costs a
namespace whose producers do not use them.

    python bench/inbox_bench.py [--turns 2000] [--updates 10] [--senders 32]
                                [--latency-turns 400] [--rate 40] [--workers 1]
                                [--shards 1] [--idle 10] [--no-write]

Writes its section of docs/benchmarks.md between the inbox-bench markers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import redis.asyncio
from measures import idle_rates, percentile
from report import write_section

from processor.client import Producer
from processor.embedded import EmbeddedRedis
from processor.wire.keys import Namespace

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "inbox-bench"  # (its markers in docs/benchmarks.md: write_section)
MODES = {"stream": False, "inbox": True}  # name -> Producer(inbox=...)

#: Commands listed by name in the idle table (the busiest); the rest are summed.
TOP_COMMANDS = 6


def update(i: int) -> dict[str, Any]:
    return {"type": "agent_response_update", "role": "assistant", "message_id": "m",
            "contents": [{"type": "text", "text": f"word{i} "}]}


def spawn_workers(url: str, namespace: str, args: argparse.Namespace) -> list[psutil.Popen]:
    return [psutil.Popen([sys.executable, "-m", "processor.cli", "run", "--redis-url", url,
                          "--namespace", namespace, "--shards", str(args.shards),
                          "--consumer", f"{namespace}-{i}", "--log-level", "warning"],
                         cwd=ROOT, stdout=subprocess.DEVNULL,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
            for i in range(args.workers)]


def cpu(procs: list[psutil.Popen]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in procs)


async def redis_cpu(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"inbox_bench: timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def merged_count(client: Any, ns: Namespace) -> int:
    return sum([await client.xlen(s.merged) for s in ns.all()])


async def send_turn(producer: Producer, rid: str, updates: int) -> float:
    """Send one turn; returns the wall clock (ms) just before its end was sent."""
    for i in range(updates):
        await producer.send(rid, update(i))
    before_end = time.time() * 1000
    await producer.end(rid)
    return before_end


async def throughput(client: Any, producer: Producer, ns: Namespace, prefix: str,
                     args: argparse.Namespace, workers: list[psutil.Popen]) -> dict[str, float]:
    queue = [f"{prefix}-t{i:05d}" for i in range(args.turns)]
    base = await merged_count(client, ns)

    async def sender() -> None:
        while queue:
            await send_turn(producer, queue.pop(), args.updates)

    cpu0, rcpu0, own0 = cpu(workers), await redis_cpu(client), time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(args.senders)))
    sent = time.perf_counter() - start

    async def merged() -> bool:
        return await merged_count(client, ns) >= base + args.turns

    await wait_until(merged, 300, "every turn merged")
    seconds = time.perf_counter() - start
    entries = args.turns * (args.updates + 1)
    return {"entries": entries, "seconds": seconds, "rate": entries / seconds,
            "sent_rate": entries / sent, "workers_cpu": cpu(workers) - cpu0,
            "redis_cpu": await redis_cpu(client) - rcpu0,
            "producer_cpu": time.process_time() - own0}


async def latency(client: Any, producer: Producer, ns: Namespace, prefix: str,
                  args: argparse.Namespace) -> list[float]:
    positions = {}
    for shard in ns.all():
        last = await client.xrevrange(shard.merged, count=1)
        positions[shard.merged] = last[0][0].decode() if last else "0-0"
    ends: dict[str, float] = {}
    rids = [f"{prefix}-l{i:05d}" for i in range(args.latency_turns)]

    async def one(rid: str) -> None:
        ends[rid] = await send_turn(producer, rid, args.updates)

    tasks = []
    start = time.monotonic()
    for n, rid in enumerate(rids):
        await asyncio.sleep(max(0.0, start + n / args.rate - time.monotonic()))
        tasks.append(asyncio.create_task(one(rid)))
    await asyncio.gather(*tasks)
    merged_ms: dict[str, int] = {}
    deadline = time.monotonic() + 120
    while len(merged_ms) < len(rids):
        if time.monotonic() > deadline:
            raise SystemExit("inbox_bench: timed out waiting for the latency run's turns")
        reply = await client.xread(positions, count=1000, block=200)
        for stream, entries in reply or []:
            for entry_id, fields in entries:
                positions[stream.decode()] = entry_id.decode()
                merged_ms[fields[b"response_id"].decode()] = int(entry_id.split(b"-")[0])
    return [merged_ms[rid] - ends[rid] for rid in rids]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = EmbeddedRedis().start()
    client = redis.asyncio.Redis.from_url(server.url)
    figures: dict[str, Any] = {"version": server.version}
    try:
        for mode, inbox in MODES.items():
            ns = Namespace(f"ib-{mode}", args.shards)
            workers = spawn_workers(server.url, ns.name, args)
            try:
                async def groups_ready(ns: Namespace = ns) -> bool:
                    try:
                        return all([await client.xinfo_groups(s.updates) for s in ns.all()])
                    except redis.ResponseError:
                        return False

                await wait_until(groups_ready, 60, "the workers' consumer groups")
                await asyncio.sleep(1)
                producer = Producer(client, ns.name, args.shards, inbox=inbox)
                await send_turn(producer, f"{mode}-warmup", args.updates)  # loads the function
                figures[mode] = await throughput(client, producer, ns, mode, args, workers)
                figures[mode]["latencies"] = await latency(client, producer, ns, mode, args)
                if mode == "inbox":
                    await asyncio.sleep(1)
                    figures["idle"] = await idle_rates(client, args.idle)
            finally:
                for proc in workers:
                    proc.terminate()
                for proc in workers:
                    with contextlib.suppress(psutil.TimeoutExpired):
                        proc.wait(15)
        return figures
    finally:
        await client.aclose()
        server.close()


def report(args: argparse.Namespace, figures: dict[str, Any], load: tuple[float, ...]) -> str:
    rows = []
    for mode in MODES:
        f = figures[mode]
        lat = f["latencies"]
        rows.append(
            f"| {'`inbox=True` (producer)' if mode == 'inbox' else 'XADD (producer-trusted)'} | "
            f"{f['rate']:,.0f} | {f['workers_cpu']:.1f} s | {f['redis_cpu']:.1f} s | "
            f"{f['producer_cpu']:.1f} s | {percentile(lat, 50):.1f} ms | "
            f"{percentile(lat, 90):.1f} ms | {percentile(lat, 99):.1f} ms | {max(lat):.1f} ms |")
    idle = figures["idle"]
    per_shard = args.workers * args.shards
    # The busiest commands by name; the inbox's own (blpop) always; the rest summed.
    ordered = sorted(idle.items(), key=lambda kv: -kv[1])
    shown = [kv for i, kv in enumerate(ordered) if i < TOP_COMMANDS or kv[0] == "blpop"]
    rest = [v for k, v in ordered[TOP_COMMANDS:] if k != "blpop"]
    idle_rows = "\n".join(f"| `{k}` | {v:.2f} |" for k, v in shown)
    if rest:
        idle_rows += f"\n| {len(rest)} others | {sum(rest):.2f} |"
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip() or "?"
    return f"""## The inbox: least-privilege producers, end to end

Measured at commit `{head}` with `python bench/inbox_bench.py` (redis-server \
{figures['version']}, {args.workers} `processor run` worker(s), {args.shards} shard(s), \
default settings), each path on a namespace of its own with fresh workers. Throughput: \
{args.turns:,} turns of {args.updates} text deltas and an end \
({figures['inbox']['entries']:,} entries), sent through `processor.client.Producer` by \
{args.senders} concurrent producers in the bench process, from the first send until every \
turn is merged; CPU seconds of the workers, of redis-server and of the producers' process over \
that run. Latency: {args.latency_turns} more turns started at {args.rate:g} turns/s, from \
just before the producer sends a turn's `end` to its merged entry's stream time (the send, \
the admission from the inbox, the worker's read, merge and publish).

| path | entries/s | workers CPU | redis CPU | producers CPU | p50 | p90 | p99 | max |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

The producers' round trips are the same on both paths (one `FCALL` per entry: an `RPUSH` \
instead of an `XADD`). What the inbox adds is the admission: each ring of the bell wakes the \
worker's `BLPOP`, and one `admit_inbox` call moves every entry waiting (up to 500 per call: \
`LINDEX`, `XADD`, `LPOP` each), then the shard loop's `XREADGROUP` wakes as for an `XADD`. \
With entries arriving one at a time, as here, that is one more wake-up and round trip of the \
worker and one more script call per entry, which is where the extra worker and Redis CPU and \
latency come from; entries that arrive while an admission runs share the next call.

What admitting the inboxes costs while no producer uses them: Redis calls per second of the \
idle worker(s) (`INFO commandstats` deltas over {args.idle:g} s, commands inside scripts \
counted), {per_shard} shard(s) read in all:

| command | calls/s |
|---|---:|
{idle_rows}

Per shard a worker reads, the inbox adds one `BLPOP` of the bell that waits 1 s (so one call \
per second, holding one pooled connection meanwhile) and, every 30 such waits, one \
`admit_inbox` call that finds the inbox empty (`LINDEX`, `LLEN`, `DEL` of the absent bell); \
the rest is the sweep and read loop every worker runs anyway.

The machine (2 logical CPUs) was shared with other jobs during the run (load average \
{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start): figures are noisy. \
Python {platform.python_version()}, {platform.platform()}."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--updates", type=int, default=10, help="text deltas per turn")
    parser.add_argument("--senders", type=int, default=32, help="concurrent producers")
    parser.add_argument("--latency-turns", type=int, default=400)
    parser.add_argument("--rate", type=float, default=40.0, help="turns/s of the latency run")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle measurement")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    load = os.getloadavg()
    section = report(args, asyncio.run(run(args)), load)
    print(section)
    if not args.no_write:
        write_section(DOC, SECTION, section)
        print(f"\nwritten to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

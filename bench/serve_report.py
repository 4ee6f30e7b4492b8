"""``bench/serve_bench.py``'s sections of docs/benchmarks.md: the open SSE
clients' (``section``: the load phases' latency and the idle costs, one
section per ``--format``) and the burst of joins' (``burst_section``);
``serve_bench.main`` writes them between their markers.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from measures import percentile
from serve_load import PATHS, WARMUP

ROOT = Path(__file__).resolve().parent.parent


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

"""Cancels asked by a least-privilege user, and what a huge cancel value costs.

Starts a redis-server 7 with the shipped ACL file (deploy/redis/users.acl,
a generated password per user, ``default`` as the administrator) and
``--workers`` ``processor run`` processes as the ``processor`` user; opens
``--turns`` turns (one update each, turn timeout 600 s), then cancels
``--cancels`` of them one after another, ``--gap`` seconds apart, with
``Producer.cancel`` as the ``serve`` user: the ``cancel_turn`` function
publishes the request, a worker sets the key, the call returns once the key
exists. Measured: the call's time, and from just before the call to the
terminal ``synthesis`` event (its stream entry time, Redis's clock on this
host).

Then an administrator ``SET``s a ``--big-mb`` MB cancel value (not UTF-8
at its start) on one more active turn, and the bench reads Redis's
``total_net_output_bytes`` before the SET and once the turn's terminal
event is out: what Redis sent meanwhile to everyone (the workers' sweeps and
finalise, this bench's reads), against the value's size.

    python bench/cancel_request_bench.py [--turns 300] [--cancels 200] [--workers 2]
                                         [--gap 0.01] [--big-mb 100] [--no-write]

Writes its section of docs/benchmarks.md between the cancel-request-bench markers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio
from measures import percentile
from report import write_section

from processor.client import Producer
from processor.embedded import EmbeddedRedis, redis_server_version
from processor.wire.keys import Namespace

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "cancel-request-bench"
NAMESPACE = "agent"  # the namespace the shipped ACL file is written for
ACL = ROOT / "deploy" / "redis" / "users.acl"
SERVER = Path("/usr/bin/redis-server")


def _update(text: str) -> str:
    return json.dumps({"type": "agent_response_update", "role": "assistant", "message_id": "m",
                       "contents": [{"type": "text", "text": text}]})


def rendered_acl(passwords: dict[str, str], admin: str) -> str:
    """The shipped file with a password per user; ``default`` the administrator."""
    out = []
    for line in ACL.read_text().splitlines():
        if not line.strip():
            continue
        user = line.split()[1]
        out.append(f"user default on >{admin} ~* &* +@all" if user == "default"
                   else f"{line} >{passwords[user]}")
    return "\n".join(out) + "\n"


async def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"cancel_request_bench: timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def terminal_ms(client: Any, ns: Namespace, rid: str, newest: int = 2000) -> tuple[int, str]:
    """The stream time and status of ``rid``'s terminal event, once it is out
    (looked for among the ``newest`` events)."""
    stream = ns.shard_for(rid).events
    while True:
        for entry_id, fields in await client.xrevrange(stream, count=newest):
            if fields.get(b"response_id") == rid.encode() and fields[b"type"] == b"synthesis":
                return int(entry_id.split(b"-")[0]), json.loads(fields[b"event"])["status"]
        await asyncio.sleep(0.01)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if not SERVER.exists() or int(redis_server_version(SERVER).split(".")[0]) < 7:
        raise SystemExit("cancel_request_bench: needs redis-server 7.0+ at /usr/bin/redis-server")
    users = ("processor", "producer", "producer-trusted", "keda", "serve")
    passwords = {u: secrets.token_hex(8) for u in users}
    admin = secrets.token_hex(8)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "users.acl").write_text(rendered_acl(passwords, admin))
    server = EmbeddedRedis(binary=SERVER, args=["--aclfile", str(tmp / "users.acl")],
                           password=admin).start()
    base = f"{server.host}:{server.port}"
    procs: list[subprocess.Popen[bytes]] = []
    client = redis.asyncio.Redis.from_url(server.url)
    serve = redis.asyncio.Redis.from_url(f"redis://serve:{passwords['serve']}@{base}")
    try:
        ns = Namespace(NAMESPACE, 1)
        for i in range(args.workers):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "processor.cli", "run", "--redis-url",
                 f"redis://processor:{passwords['processor']}@{base}", "--namespace", NAMESPACE,
                 "--shards", "1", "--consumer", f"crb{i}", "--turn-timeout", "600",
                 "--log-level", "warning"],
                cwd=ROOT, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)}))

        async def subscribed() -> bool:
            return int((await client.pubsub_numsub(ns.cancels))[0][1]) >= args.workers

        await wait_until(subscribed, 60, "the workers' subscriptions")
        rids = [f"turn-{i:05d}" for i in range(args.turns)]
        async with client.pipeline(transaction=False) as pipe:
            for rid in [*rids, "big"]:
                pipe.xadd(ns.shard_for(rid).updates, {"response_id": rid,
                                                      "update": _update("hello ")})
            await pipe.execute()

        async def all_active() -> bool:
            return int(await client.zcard(ns.shard(0).active)) == args.turns + 1

        await wait_until(all_active, 120, "every turn active")
        producer = Producer(serve, NAMESPACE)
        calls, ends = [], []
        for rid in rids[:args.cancels]:
            before = time.time() * 1000
            t0 = time.monotonic()
            outcome = await producer.cancel(rid, reason="user pressed stop")
            calls.append((time.monotonic() - t0) * 1000)
            if outcome != "asked":
                raise SystemExit(f"cancel_request_bench: {rid}: {outcome}, not asked")
            ms, status = await terminal_ms(client, ns, rid)
            if status != "cancelled":
                raise SystemExit(f"cancel_request_bench: {rid} ended {status}")
            ends.append(ms - before)
            await asyncio.sleep(args.gap)

        big = b"\xff" + b"z" * (args.big_mb << 20)
        sent = int((await client.info("stats"))["total_net_output_bytes"])
        await client.set(ns.shard_for("big").cancel("big"), big, ex=600)
        await terminal_ms(client, ns, "big", newest=3)  # (a small read: it is the newest)
        sent = int((await client.info("stats"))["total_net_output_bytes"]) - sent
        reason = None
        for _id, fields in await client.xrevrange(ns.shard(0).events, count=50):
            if fields.get(b"response_id") == b"big" and fields[b"type"] == b"synthesis":
                reason = json.loads(fields[b"event"])["cancel_reason"]
        return {"version": server.version, "calls": calls, "ends": ends, "sent": sent,
                "big": len(big), "reason_chars": len(reason or "")}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
        await serve.aclose()
        await client.aclose()
        server.close()


def report(args: argparse.Namespace, figures: dict[str, Any], load: tuple[float, ...]) -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip() or "?"
    rows = []
    for name, values in (("`Producer.cancel` returns (the key is set)", figures["calls"]),
                         ("call to terminal event", figures["ends"])):
        rows.append(f"| {name} | {percentile(values, 50):.1f} ms | "
                    f"{percentile(values, 99):.1f} ms | {max(values):.1f} ms |")
    table = "\n".join(rows)
    return f"""## Cancellation asked by a least-privilege user, and a huge cancel value

Measured at commit `{head}` with `python bench/cancel_request_bench.py` (redis-server \
{figures['version']} with the shipped ACL file, {args.workers} `processor run` workers as \
`processor`, 1 shard). {args.turns + 1} active turns; {len(figures['calls'])} of them \
cancelled one after another ({args.gap:g} s apart) with `Producer.cancel` as the `serve` \
user, which may not set cancel keys: `cancel_turn` publishes the request on \
`{{agent:0}}:cancels`, a worker sets the key, the call returns once it exists \
(docs/contract.md §6).

| | p50 | p99 | max |
|---|---:|---:|---:|
{table}

An administrator's plain `SET` of a {figures['big'] / (1 << 20):.0f} MB cancel value (not \
UTF-8 at its start) on another active turn: Redis sent {figures['sent']:,} bytes in all from \
just before the SET until the turn's terminal event was out (the workers' sweeps and finalise, \
this bench's reads): the worker reads at most the value's first 1 KiB (`GETRANGE`), and the \
terminal event's `cancel_reason` has {figures['reason_chars']} characters.

The machine (2 logical CPUs) was shared with other jobs during the run (load average \
{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start): figures are noisy. \
Python {platform.python_version()}, {platform.platform()}."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--cancels", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between cancels")
    parser.add_argument("--big-mb", type=int, default=100, help="the administrator's value")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    if not 0 < args.cancels <= args.turns:
        parser.error("--cancels must be 1 to --turns")
    load = os.getloadavg()
    section = report(args, asyncio.run(run(args)), load)
    print(section)
    if not args.no_write:
        write_section(DOC, SECTION, section, after="cancel-bench")
        print(f"\nwritten to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

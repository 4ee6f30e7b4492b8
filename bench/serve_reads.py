"""What one client looping on one turn costs Redis through ``processor serve``.

    python bench/serve_reads.py [--events 10000] [--event-bytes 2000]
                                [--updates 20000] [--update-bytes 1000]
                                [--requests 50] [--code DIR] [--no-write]

On a private redis-server, a namespace holding two turns written as the
workers write them (docs/serve.md, "Joining and resuming"):

- ``finished``: ``--events`` chunk events of ``--event-bytes`` each in the
  shard's events stream, its terminal event, merged entry and done marker;
- ``running``: a live log of ``--updates`` updates of ``--update-bytes``
  each (entries of 20), the turn in the shard's active set.

One ``processor serve`` process (tokens on, its default options) is started
from ``--code`` (default: this checkout; give another checkout to measure
it the same way). Then, one request at a time, ``--requests`` times each:
resumes of ``finished`` from ``Last-Event-ID: 0`` (read to the end), fresh
joins of ``running`` (to the first event), GETs of ``running``. For each:
the bytes Redis sent (``total_net_output_bytes``), the stream reads it ran
(``XRANGE`` + ``XREVRANGE``, ``INFO commandstats``), the time per request
(p50), serve's CPU (share of one core) and its RSS afterwards.

Writes its section of docs/benchmarks.md (serve-reads markers) unless
``--no-write`` or ``--code`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio
from measures import percentile
from report import write_section

from processor.embedded import EmbeddedRedis
from processor.scripts import meta
from processor.serve.tokens import issue
from processor.wire.ids import TurnKey
from processor.wire.keys import DEFAULT_GROUP, Namespace

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "serve-reads"
NAMESPACE = "sreads"
SECRET = "serve-reads-secret-0123456789"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def chunk(seq: int, text: str) -> str:
    return json.dumps({"type": "synthesis.chunk", "seq": seq, "response_id": "x",
                       "message_id": "m", "delta": text, "replace": False})


async def write_turns(client: Any, args: argparse.Namespace) -> None:
    """The two turns, as the workers leave them."""
    await meta.create(client, NAMESPACE, 1, DEFAULT_GROUP)
    ns = Namespace(NAMESPACE, 1)
    shard = ns.shard(0)
    text = "x" * args.event_bytes
    async with client.pipeline(transaction=False) as pipe:
        for seq in range(1, args.events + 1):
            pipe.xadd(shard.events, {"response_id": "finished", "type": "synthesis.chunk",
                                     "event": chunk(seq, text)})
        await pipe.execute()
    last = args.events + 1
    terminal_id = await client.xadd(shard.events, {
        "response_id": "finished", "type": "synthesis",
        "event": json.dumps({"type": "synthesis", "seq": last, "status": "completed"})})
    response = json.dumps({"type": "agent_response", "messages": [{"type": "message",
                           "role": "assistant", "contents": [{"type": "text",
                                                              "text": "done"}]}]})
    merged_id = await client.xadd(shard.merged, {
        "response_id": "finished", "status": "completed", "response": response,
        "meta": json.dumps({"response_id": "finished"})})
    tk = TurnKey("finished").encode()
    await client.hset(shard.done(tk), mapping={"status": "completed", "merged_id": merged_id,
                                               "terminal_id": terminal_id})
    running = TurnKey("running").encode()
    update = {"type": "agent_response_update", "role": "assistant", "message_id": "m",
              "author_name": "bench", "contents": [{"type": "text",
                                                    "text": "y" * args.update_bytes}]}
    async with client.pipeline(transaction=False) as pipe:
        for seq in range(1, args.updates // 20 + 1):
            pipe.xadd(shard.live(running), {
                "seq": seq, "events": json.dumps([json.loads(chunk(seq, "y" * 20))]),
                "updates": json.dumps([update] * 20)})
        await pipe.execute()
    await client.zadd(shard.active, {running: time.time() * 1000})


async def measure(url: str, client: Any, pid: int, name: str, path: str,
                  headers: dict[str, str], requests: int, whole: bool) -> dict[str, Any]:
    before_stats = await client.info("stats")
    before_calls = await client.info("commandstats")
    cpu0, times = cpu_seconds(pid), []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, timeout=timeout) as session:
        started = time.monotonic()
        for _ in range(requests):
            t0 = time.monotonic()
            async with session.get(path, headers=headers) as response:
                assert response.status in (200, 202), (name, response.status)
                if whole:
                    await response.read()
                else:
                    buffer = b""
                    while b"data:" not in buffer:
                        more = await response.content.readany()
                        if not more:
                            break
                        buffer += more
            times.append((time.monotonic() - t0) * 1000)
        took = time.monotonic() - started
    after_stats = await client.info("stats")
    after_calls = await client.info("commandstats")

    def calls(stats: dict[str, Any]) -> int:
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0))
                   for c in ("xrange", "xrevrange"))

    sent = after_stats["total_net_output_bytes"] - before_stats["total_net_output_bytes"]
    figures = {"name": name, "requests": requests, "bytes": sent,
               "reads": calls(after_calls) - calls(before_calls),
               "p50": percentile(times, 50), "cpu": (cpu_seconds(pid) - cpu0) / took,
               "rss": rss_mb(pid), "seconds": took}
    print(f"{name}: {sent / 1e6:,.1f} MB from Redis, {figures['reads']} stream reads, "
          f"p50 {figures['p50']:,.1f} ms, serve RSS {figures['rss']:,.0f} MB", flush=True)
    return figures


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = EmbeddedRedis().start()
    client = redis.asyncio.Redis.from_url(server.url)
    log_dir = Path(tempfile.mkdtemp(prefix="serve-reads-"))
    serve = None
    try:
        await write_turns(client, args)
        serve_log = log_dir / "serve.log"
        code = Path(args.code or ROOT).resolve()
        with open(serve_log, "wb") as out:
            serve = subprocess.Popen(
                [sys.executable, "-m", "processor.cli", "serve", "--redis-url", server.url,
                 "--namespace", NAMESPACE, "--host", "127.0.0.1", "--port", "0"],
                cwd=code, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(code), "PROCESSOR_TOKEN_SECRET": SECRET})
        port = 0
        deadline = time.monotonic() + 30
        while not port:
            for line in serve_log.read_text(errors="replace").splitlines():
                if '"msg": "serving"' in line:
                    port = int(json.loads(line)["port"])
            if serve.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("serve_reads: processor serve did not start:\n"
                                 + serve_log.read_text(errors="replace"))
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        await asyncio.sleep(1)  # (its readers positioned)
        rss0 = rss_mb(serve.pid)

        def auth(rid: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {issue(SECRET, rid, int(time.time()) + 3600)}"}

        rows = [
            await measure(url, client, serve.pid, "resume `finished` from `Last-Event-ID: 0`",
                          "/v1/turns/finished/events", {**auth("finished"),
                                                        "Last-Event-ID": "0"},
                          args.requests, whole=True),
            await measure(url, client, serve.pid, "fresh join of `running`",
                          "/v1/turns/running/events", auth("running"), args.requests,
                          whole=False),
            await measure(url, client, serve.pid, "`GET` of `running`", "/v1/turns/running",
                          auth("running"), args.requests, whole=True),
        ]
        return {"version": server.version, "rows": rows, "rss0": rss0, "code": str(code)}
    finally:
        if serve is not None and serve.poll() is None:
            serve.terminate()
            serve.wait(15)
        await client.aclose()
        server.close()


def section(args: argparse.Namespace, r: dict[str, Any]) -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip() or "?"
    command = shlex.join(["python", "bench/serve_reads.py", *sys.argv[1:]])
    rows = "\n".join(
        f"| {f['name']} | {f['bytes'] / f['requests'] / 1e6:,.2f} MB | "
        f"{f['reads'] / f['requests']:,.2f} | {f['p50']:,.1f} ms | {f['cpu'] * 100:.0f}% | "
        f"{f['rss']:,.0f} MB |" for f in r["rows"])
    load = os.getloadavg()
    return f"""## `processor serve`: one client looping on one turn

Measured at commit `{head}` with `{command}` (redis-server {r['version']}, one \
`processor serve` process with tokens on and its default options). Two turns written as the \
workers write them: a finished one with {args.events:,} chunk events of \
{args.event_bytes:,} bytes in the shard's events stream, and a running one whose live log \
holds {args.updates:,} updates of {args.update_bytes:,} bytes. One client, \
{args.requests} requests of each kind in a row; per request: the bytes Redis sent, the \
stream reads (`XRANGE` + `XREVRANGE`) it ran, the time (p50); serve's CPU over the row (share \
of one core) and its RSS after it ({r['rss0']:,.0f} MB at the start).

| requests | from Redis per request | stream reads per request | time p50 | serve CPU \
| serve RSS after |
|---|---:|---:|---:|---:|---:|
{rows}

Before the per-turn cache and the read budget (issue 33, on the commit before them), each \
such request read the turn again: a resume of a finished turn read back up to 10,000 \
entries, about 21 MB, and a join or GET of a running turn with 20,000 updates of 1 KB \
re-read and re-merged 20 MB. Load average {load[0]:.2f} at the end; Python \
{platform.python_version()}."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--event-bytes", type=int, default=2000)
    parser.add_argument("--updates", type=int, default=20000)
    parser.add_argument("--update-bytes", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--code", help="the checkout whose processor serve runs")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    r = asyncio.run(run(args))
    body = section(args, r)
    print(body)
    if not args.no_write and not args.code:
        write_section(DOC, SECTION, body, after="serve-burst")
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

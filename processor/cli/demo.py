"""``processor demo``: two workers and a simulated producer on an embedded Redis.

The producer streams three turns the way Agent Framework agents would: a
handoff between two agents with a tool call (their updates interleaved), a
turn the user cancels half-way, and a turn whose model fails. The demo then
prints each merged response and the events a UI would have seen.

It also serves the turns as ``processor serve`` does (in this process, on
``--port``, any free one by default, with a fresh token secret) and prints
the watch page's URL of the handoff before streaming it at ``--pace``
seconds per update, so the page shows it live; or, with ``--serve-url`` (and ``--redis-url`` and the
server's ``PROCESSOR_TOKEN_SECRET``), the page on a server already running
on namespace ``demo``. After the turns end, on a terminal, it keeps serving
the pages until Ctrl-C (and says so), so that a page opened late still
shows the turns; otherwise (a pipe, CI) it exits at once. ``--linger
SECONDS`` serves them that long instead, either way (0: exit at once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from processor.client import Producer
from processor.engine.lifecycle import Limits
from processor.host.run import start_embedded
from processor.redis_io.connections import connect
from processor.redis_io.options import RedisOptions
from processor.redis_io.replies import as_text
from processor.wire.keys import Namespace
from processor.wire.stream_ids import id_order
from processor.worker.worker import Worker, WorkerConfig

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

NAMESPACE = "demo"
#: One shard per worker: each reads its shard alone, so it holds its turns and
#: is the one voice of their live progress (two workers on one shard share it:
#: every turn stored, and live deltas of a turn two workers store stop).
SHARDS = 2


def _update(text: str | None = None, *, kind: str = "text", **fields: Any) -> dict[str, Any]:
    content: dict[str, Any] = {"type": kind}
    if text is not None:
        content["text"] = text
    content.update(fields.pop("content", {}))
    return {"type": "agent_response_update", "contents": [content], "role": "assistant", **fields}


def _alice(text: str | None = None, **kw: Any) -> dict[str, Any]:
    return _update(text, response_id="run-alice", author_name="alice", agent_id="triage", **kw)


def _bob(text: str, **kw: Any) -> dict[str, Any]:
    return _update(
        text, response_id="run-bob", author_name="bob", agent_id="billing", message_id="bob-1", **kw
    )


HANDOFF: list[dict[str, Any]] = [
    _alice("The user asks about an invoice; ", kind="text_reasoning"),
    _alice("billing should handle it.", kind="text_reasoning"),
    _alice(
        kind="function_call",
        message_id="al-1",
        content={"call_id": "c1", "name": "handoff_to_billing", "arguments": '{"reason": '},
    ),
    _alice(
        kind="function_call",
        message_id="al-1",
        content={"call_id": "c1", "arguments": '"invoice"}'},
    ),
    {
        **_alice(
            kind="function_result",
            message_id="al-2",
            content={"call_id": "c1", "result": "transferred"},
        ),
        "role": "tool",
        "author_name": None,
    },
    _bob("Hi, I'm Bob from billing. "),
    _alice("Handing you to Bob now.", message_id="al-3"),
    _bob("Your invoice #42 was paid on May 3."),
    _update(
        kind="usage",
        content={"usage_details": {"input_token_count": 120, "output_token_count": 38}},
        finish_reason="stop",
    ),
]


async def _produce(producer: Producer, pace: float) -> None:
    for update in HANDOFF:
        await producer.send("demo-handoff", update, ids={"thread_id": "thread-1"})
        await asyncio.sleep(pace)
    await producer.end("demo-handoff")
    for word in ("Let ", "me ", "write ", "a "):
        await producer.send("demo-cancel", _update(word, message_id="m1"))
    await asyncio.sleep(0.3)
    await producer.cancel("demo-cancel", reason="user pressed stop")
    await producer.send("demo-error", _update("Thinking about ", message_id="m1"))
    await producer.error("demo-error", "model quota exceeded", code="429")


async def _wait_merged(client: RedisClient, count: int, timeout: float = 10.0) -> list[Any]:
    shards = Namespace(NAMESPACE, SHARDS).all()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries: list[Any] = []
        for shard in shards:
            entries += cast(list[Any], await client.xrange(shard.merged))
        if len(entries) >= count:
            return sorted(entries, key=lambda e: id_order(as_text(e[0])))
        await asyncio.sleep(0.05)
    raise TimeoutError(f"only {len(entries)} of {count} turns merged in {timeout:g}s")


def _print_turn(fields: dict[bytes, bytes], events: list[dict[str, Any]]) -> None:
    response = json.loads(fields[b"response"])
    rid = fields[b"response_id"].decode()
    print(f"\n== {rid}: {fields[b'status'].decode()}")
    for message in response["messages"]:
        who = message.get("author_name") or message["role"]
        parts = []
        for c in message["contents"]:
            if c["type"] in ("text", "text_reasoning"):
                parts.append(("(thinking) " if c["type"] == "text_reasoning" else "") + c["text"])
            elif c["type"] == "function_call":
                parts.append(f"call {c['name']}({c['arguments']})")
            elif c["type"] == "function_result":
                parts.append(f"result {c['result']!r}")
        print(f"   [{message['message_id']}] {who:>6}: {' | '.join(parts)}")
    if response.get("usage_details"):
        print(f"   usage: {response['usage_details']}")
    mine = [e for e in events if e["response_id"] == rid]
    print("   events: " + ", ".join(f"{e['seq']}:{e['type']}" for e in mine))
    final = mine[-1]
    if final.get("error"):
        print(f"   error: {final['error']['code']}: {final['error']['message']}")
    if final.get("cancel_reason"):
        print(f"   cancel reason: {final['cancel_reason']}")


@dataclass
class Options:
    redis_url: str | None = None  # None: an embedded redis-server
    serve_url: str | None = None  # a processor serve already running on this Redis
    token_secret: str | None = None  # that server's
    port: int = 0  # of the serve the demo starts (0: any free port)
    pace: float = 0.5  # seconds between the handoff's updates
    # Seconds the pages stay served after the turns end (None: until Ctrl-C).
    linger: float | None = 0.0


class _Serve:
    """``processor serve`` in this process, on the demo's Redis."""

    def __init__(self, runner: Any, server: Any, url: str, secret: str) -> None:
        self.runner, self.server, self.url, self.secret = runner, server, url, secret

    @classmethod
    async def start(cls, client: RedisClient, redis_url: str, port: int) -> _Serve:
        from aiohttp import web

        from processor.serve.config import ServeConfig
        from processor.serve.run import bound_port, build

        secret = secrets.token_hex(16)
        config = ServeConfig(redis=RedisOptions(redis_url), namespace=Namespace(NAMESPACE),
                             host="127.0.0.1", port=port, token_secret=secret,
                             cors_origins=(), heartbeat=15.0, client_queue=1000,
                             write_timeout=10.0, log_level="warning")
        app, server = build(config, client)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await runner.setup()
        try:
            await web.TCPSite(runner, config.host, port).start()
        except OSError as exc:
            await runner.cleanup()
            raise _Problem(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc} "
                           "(choose another with --port, 0 for any)") from None
        server.hub.start()
        return cls(runner, server, f"http://127.0.0.1:{bound_port(runner)}", secret)

    async def close(self) -> None:
        await self.server.hub.close()
        await self.runner.cleanup()


class _Problem(Exception):
    """A start-up problem, said on one line."""


def page_url(serve_url: str, secret: str, response_id: str, ttl: int = 3600) -> str:
    """The watch page of a turn on ``serve_url``, with a token for it."""
    from processor.serve.tokens import issue

    token = issue(secret, response_id, int(time.time()) + ttl)
    return f"{serve_url.rstrip('/')}/v1/turns/{response_id}/view?token={token}"


async def _one_reader_per_shard(workers: list[Worker], timeout: float = 15) -> None:
    """Until the workers know each other and each shard has one reader
    (shard affinity, after their beats), and the reads begun before then
    are over. A turn produced earlier is read by both workers, stored
    rather than held, and publishes no live deltas (docs/serve.md)."""
    names = sorted(w.config.consumer for w in workers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(w.membership.live == names for w in workers) and all(
                sum(w.membership.sole_reader(s) for w in workers) == 1 for s in range(SHARDS)):
            await asyncio.sleep(2 * workers[0].config.block_ms / 1000)
            return
        await asyncio.sleep(0.05)


async def run_demo(options: Options | None = None) -> int:
    options = options or Options()
    server = start_embedded() if options.redis_url is None else None
    redis_url = options.redis_url or (server.url if server is not None else "")
    serve: _Serve | None = None
    workers: list[Worker] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        client = await connect(RedisOptions(redis_url))
        workers = [Worker(client, WorkerConfig(namespace=NAMESPACE, shards=SHARDS,
                                               progress=True, limits=Limits(turn_timeout=30)))
                   for _ in range(2)]
        tasks = [asyncio.create_task(w.run()) for w in workers]
        await asyncio.gather(*(w.ready.wait() for w in workers))
        await _one_reader_per_shard(workers)
        if options.serve_url is None:
            serve = await _Serve.start(client, redis_url, options.port)
            serve_url, secret = serve.url, serve.secret
        else:
            serve_url, secret = options.serve_url, options.token_secret or ""
        print(f"processor serve at {serve_url}; watch the handoff live (the page follows it "
              f"as it streams):\n  {page_url(serve_url, secret, 'demo-handoff')}", flush=True)
        print("2 workers running; producing 3 turns (handoff, cancelled, failing)...",
              flush=True)
        await _produce(Producer(client, namespace=NAMESPACE), options.pace)
        merged = await _wait_merged(client, 3)
        events = [json.loads(f[b"event"]) for shard in Namespace(NAMESPACE, SHARDS).all()
                  for _, f in await client.xrange(shard.events)]
        for _, fields in merged:
            _print_turn(fields, events)
        sys.stdout.flush()
        if serve is not None and options.linger != 0:
            await _linger(serve.url, options.linger)
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)  # (raises what a worker raised)
        tasks.clear()
        if serve is not None:
            await serve.close()
            serve = None
        await client.aclose()
        return 0
    finally:
        # Also on Ctrl-C or an error: the workers leave before their Redis goes.
        await _stop(workers, tasks)
        if serve is not None:
            await serve.close()
        if server is not None:
            server.close()


async def _linger(url: str, seconds: float | None) -> None:
    """Keep serving the pages for ``seconds``, or until Ctrl-C (None); a
    Ctrl-C here ends the wait only, and the demo stops as it does after it."""
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    try:
        if seconds is None:
            print(f"\nstill serving the pages at {url} until Ctrl-C "
                  "(--linger SECONDS: for that long instead)", flush=True)
        else:
            print(f"\nserving the pages for {seconds:g} s more (Ctrl-C ends it)", flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(interrupted.wait(), seconds)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if interrupted.is_set():
        print("\nprocessor demo: stopped", file=sys.stderr, flush=True)


async def _stop(workers: list[Worker], tasks: list[asyncio.Task[None]]) -> None:
    """Stop the workers and wait for them (at most 10 s: a Redis gone meanwhile)."""
    for w in workers:
        w.stop()
    if tasks:
        await asyncio.wait(tasks, timeout=10)
    tasks.clear()


def main(args: argparse.Namespace | None = None) -> int:
    given = vars(args) if args is not None else {}
    linger = given.get("linger")
    secret = given.get("token_secret") or os.environ.get("PROCESSOR_TOKEN_SECRET")
    options = Options(
        redis_url=given.get("redis_url"), serve_url=given.get("serve_url"),
        token_secret=secret, port=given.get("port", 0), pace=given.get("pace", 0.5),
        linger=(None if sys.stdout.isatty() else 0.0) if linger is None else linger)
    problems = []
    if options.serve_url and not options.redis_url:
        problems.append("--serve-url needs --redis-url: the Redis that server reads")
    if options.serve_url and not secret:
        problems.append("--serve-url needs the server's --token-secret (or "
                        "PROCESSOR_TOKEN_SECRET) to make the page's token")
    if options.pace < 0 or (options.linger or 0) < 0:
        problems.append("--pace and --linger must be 0 or more")
    for problem in problems:
        print(f"processor demo: {problem}", file=sys.stderr)
    if problems:
        return 2
    try:
        return asyncio.run(run_demo(options))
    except KeyboardInterrupt:  # Ctrl-C: everything it started is stopped (run_demo's finally)
        print("\nprocessor demo: stopped", file=sys.stderr, flush=True)
        return 0
    except (TimeoutError, _Problem) as exc:
        print(f"processor demo: {exc}", file=sys.stderr)
        return 1

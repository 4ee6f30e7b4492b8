"""``processor serve`` for the tests: in this process on a real port (its
app, hub and source as ``processor serve`` builds them), or as a
subprocess (replicas, restarts, the browser test); and an SSE client over
real HTTP that reads streams the way ``EventSource`` does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from processor.redis_io.connections import connect
from processor.redis_io.options import RedisOptions
from processor.serve import sse
from processor.serve.config import ServeConfig
from processor.serve.edge import Server
from processor.serve.run import bound_port, build, make_runner, make_site, pool_size
from processor.serve.tokens import issue
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace
from support.worker_harness import ROOT, Harness

SECRET = "test-secret-0123456789"


def token(response_id: str, ttl: int = 600, secret: str = SECRET) -> str:
    return issue(secret, response_id, int(time.time()) + ttl)


def bearer(response_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(response_id)}"}


def config(url: str, namespace: str, shards: int = 1, **overrides: Any) -> ServeConfig:
    base = ServeConfig(
        redis=RedisOptions(url), namespace=Namespace(namespace, shards), host="127.0.0.1",
        port=0, token_secret=SECRET, cors_origins=(), heartbeat=15.0, client_queue=1000,
        write_timeout=10.0, log_level="info",
    )
    return replace(base, **overrides)


@dataclass
class LocalServe:
    """The server's app on 127.0.0.1 in this event loop."""

    server: Server
    runner: web.AppRunner
    client: Any
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        await self.server.hub.close()
        await self.runner.cleanup()
        await self.client.aclose()


async def start_local(cfg: ServeConfig, hub_block_ms: int = 100) -> LocalServe:
    """``processor serve`` in this process. Its feed readers' ``XREAD BLOCK``
    lasts ``hub_block_ms`` (serve's own is 1 s): an entry is handed on as it
    comes either way, and closing waits for the read in flight, which took
    up to a second in every test that closes one."""
    client = await connect(cfg.redis, pool_size(cfg))
    app, server = build(cfg, client)
    server.hub.block_ms = hub_block_ms
    runner = make_runner(app)
    await runner.setup()
    await make_site(runner, cfg).start()
    server.hub.start()
    return LocalServe(server, runner, client, bound_port(runner))



@contextlib.asynccontextmanager
async def served(redis_url: str, namespace: str,
                 **worker: Any) -> AsyncIterator[tuple[Harness, LocalServe]]:
    """A worker (``Harness`` with ``worker``'s settings) and ``processor
    serve`` in this process, on ``namespace``; the server closed, then the
    worker stopped, after."""
    async with Harness(redis_url, namespace, **worker) as harness:
        await harness.start_worker()
        serve = await start_local(config(redis_url, namespace))
        try:
            yield harness, serve
        finally:
            await serve.close()

@dataclass
class ServeProcess:
    """``python -m processor.cli.main serve`` on a port of its own."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def wait_serving(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log().splitlines():
                if '"msg": "serving"' in line:
                    self.port = int(json.loads(line)["port"])
                    return
            code = self.proc.poll()
            assert code is None, f"processor serve exited with {code}:\n{self.log()}"
            assert time.monotonic() < deadline, f"processor serve never served:\n{self.log()}"
            await asyncio.sleep(0.05)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def spawn_serve(url: str, namespace: str, log_dir: Path, *extra: str, port: int = 0,
                shards: int = 1) -> ServeProcess:
    log_path = log_dir / f"serve-{namespace}-{time.monotonic_ns()}.log"
    args = [sys.executable, "-m", "processor.cli", "serve", "--redis-url", url,
            "--namespace", namespace, "--shards", str(shards), "--host", "127.0.0.1",
            "--port", str(port), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROCESSOR_TOKEN_SECRET": SECRET}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    return ServeProcess(proc, log_path, port)


@dataclass
class Stream:
    """One open event stream: its response and what has been read so far."""

    response: aiohttp.ClientResponse
    parser: sse.Parser = field(default_factory=sse.Parser)
    items: list[sse.Event | sse.Comment] = field(default_factory=list)
    closed: bool = False
    _read: int = 0  # items handed out by next()

    async def _more(self, timeout: float) -> None:
        chunk = await asyncio.wait_for(self.response.content.readany(), timeout)
        if not chunk:
            self.closed = True
        self.items += self.parser.feed(chunk)

    async def next(self, timeout: float = 30, comments: bool = False) -> sse.Event | sse.Comment:
        """The next event (or comment, when asked for); AssertionError at the end."""
        deadline = time.monotonic() + timeout
        while True:
            while self._read < len(self.items):
                item = self.items[self._read]
                self._read += 1
                if comments or isinstance(item, sse.Event):
                    return item
            assert not self.closed, "the stream ended"
            await self._more(max(0.01, deadline - time.monotonic()))

    async def events(self, count: int, timeout: float = 30) -> list[sse.Event]:
        return [await self.event(timeout) for _ in range(count)]

    async def event(self, timeout: float = 30) -> sse.Event:
        item = await self.next(timeout)
        assert isinstance(item, sse.Event)
        return item

    async def rest(self, timeout: float = 30) -> list[sse.Event]:
        """Every event until the server closes the stream."""
        out: list[sse.Event] = []
        deadline = time.monotonic() + timeout
        while True:
            while self._read < len(self.items):
                item = self.items[self._read]
                self._read += 1
                if isinstance(item, sse.Event):
                    out.append(item)
            if self.closed:
                return out
            await self._more(max(0.01, deadline - time.monotonic()))

    def close(self) -> None:
        self.response.close()


async def open_stream(session: aiohttp.ClientSession, url: str,
                      headers: dict[str, str] | None = None) -> Stream:
    response = await session.get(url, headers=headers or {},
                                 timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
    assert response.status == 200, (response.status, await response.text())
    assert response.headers["Content-Type"].startswith("text/event-stream")
    return Stream(response)


def payloads(events: Iterable[sse.Event]) -> list[dict[str, Any]]:
    return [json.loads(event.data) for event in events]


def text_update(text: str, message_id: str | None = "m1", author: str = "bob") -> dict[str, Any]:
    update: dict[str, Any] = {"contents": [{"type": "text", "text": text}], "role": "assistant",
                              "author_name": author}
    if message_id:
        update["message_id"] = message_id
    return update


def merged_text(response: dict[str, Any]) -> str:
    return "".join(c.get("text") or "" for m in response["messages"] for c in m["contents"]
                   if c["type"] == "text")


def chunk_text(data: list[dict[str, Any]], kind: str = "synthesis.chunk") -> str:
    """The deltas of the text chunks among ``data`` (decoded events), joined."""
    return "".join(d["delta"] for d in data if d["type"] == kind)


def check_stream(events: list[sse.Event], first_seq: int = 0) -> list[dict[str, Any]]:
    """The events of one turn as a stream must have them: every live event's
    id is its seq, gap-free from ``first_seq``; the merged response comes
    (without an id) just before the terminal event, which is last."""
    data = payloads(events)
    live = [(e, d) for e, d in zip(events, data, strict=True) if d["type"] != "merged"]
    assert [e.id for e, _ in live] == [str(d["seq"]) for _, d in live]
    assert [d["seq"] for _, d in live] == list(range(first_seq, first_seq + len(live)))
    assert data[-1]["type"] == "synthesis" and data[-2]["type"] == "merged"
    assert events[-2].id is None
    assert [d["type"] for d in data].count("merged") == 1
    return data


async def wait_logged(harness: Any, rid: str, count: int) -> None:
    """Until the turn's live log holds ``count`` updates (the worker published them)."""
    log = harness.ns.shard_for(rid).live(TurnKey(rid).encode())

    async def logged() -> int:
        return sum(len(json.loads(f[b"updates"])) for _, f in await harness.client.xrange(log))

    for _ in range(1500):
        if await logged() >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{rid}: {await logged()} updates logged, not {count}")


def free_port() -> int:
    """A port nothing listens on now (for a server stopped and started again on it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_followed(got: list[tuple[str | None, dict[str, Any]]], merged: dict[str, Any]) -> None:
    """What one client received across all its connections, in order (each
    event's SSE id, its data): a ``snapshot`` or ``synthesis.started`` first
    (or, joined after the end, the ``merged`` event), then every later seq
    exactly once and in order, each with its seq as id (no gap, no repeat
    across resumes); the terminal event last, the ``merged`` event (the
    exact merged response) just before it; and the text the client built,
    the snapshot's plus the deltas, is the merged text."""
    kinds = [data["type"] for _, data in got]
    assert kinds and kinds[0] in ("snapshot", "synthesis.started", "merged"), kinds[:3]
    assert kinds.count("synthesis") == 1 and kinds[-1] == "synthesis", kinds[-3:]
    assert kinds[-2] == "merged" and got[-2][1]["response"] == merged
    snapshots = [data for _, data in got if data["type"] == "snapshot"]
    assert not snapshots or (len(snapshots) == 1 and kinds[0] == "snapshot"), "one snapshot, first"
    told = [(ident, data) for ident, data in got if "seq" in data and data["type"] != "snapshot"]
    first = snapshots[0]["seq"] + 1 if snapshots else told[0][1]["seq"]
    assert [data["seq"] for _, data in told] == list(range(first, first + len(told))), \
        [data["seq"] for _, data in told]
    assert [ident for ident, _ in told] == [str(data["seq"]) for _, data in told]
    if kinds[0] == "merged":  # joined after the end: the merged response is its view
        assert set(kinds[:-1]) == {"merged"}, kinds
        return
    assert got[0][0] == str(got[0][1]["seq"]), "the first event has an id"
    assert snapshots or first == 0
    built = (merged_text(snapshots[0]["response"]) if snapshots else "") + chunk_text(
        [data for _, data in told])
    assert built == merged_text(merged)

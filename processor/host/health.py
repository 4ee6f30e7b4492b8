"""``/metrics``, ``/healthz`` and ``/readyz`` on the metrics port.

Served by prometheus_client's own WSGI app and threading WSGI server (the
standard library's ``wsgiref``) in a daemon thread, not on the worker's
event loop: a scrape never competes with the shard loops, no web framework
is needed, and ``/healthz`` still answers (503) when the loop is stuck,
which a handler running on that loop could not do.

- ``/healthz``: 200 while the loop's heartbeat (a task that stamps the time
  every second) is younger than ``stall_seconds``; 503 otherwise.
- ``/readyz``: 200 when Redis answers, every shard's consumer group
  exists and no shard's ids are exhausted or far ahead of Redis's clock,
  checked live on the worker's own client (run on its loop, with a
  deadline), and the worker did not find the namespace's state lost in
  Redis within the last minute; 503 with the first problem otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from redis.exceptions import ResponseError

from processor.redis_io.connections import is_transient
from processor.redis_io.replies import as_text
from processor.wire import stream_ids
from processor.wire.keys import Namespace
from processor.worker.metrics import Metrics
from processor.worker.sampler import find_group

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

log = logging.getLogger("processor.health")

READY_TIMEOUT = 2.0  # seconds a /readyz check may take (probes time out at 1-5 s)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds
        pass


@dataclass
class Health:
    """What the endpoints report. ``beat()`` runs on the worker's loop."""

    metrics: Metrics
    stall_seconds: float = 30.0
    ready_check: Callable[[], Any] | None = None  # async () -> str | None (problem)
    loop: asyncio.AbstractEventLoop | None = None
    last_beat: float = field(default_factory=time.monotonic)

    async def beat(self, every: float = 1.0) -> None:
        """Stamp the time every ``every`` seconds for as long as the loop runs."""
        self.loop = asyncio.get_running_loop()
        while True:
            self.last_beat = time.monotonic()
            self.metrics.heartbeat.set(time.time())
            await asyncio.sleep(every)

    def live(self) -> str | None:
        """None when alive, else why not."""
        age = time.monotonic() - self.last_beat
        if age > self.stall_seconds:
            return f"event loop stalled: no heartbeat for {age:.1f}s"
        return None

    def ready(self) -> str | None:
        """None when ready, else why not. Called from the server's thread."""
        if self.ready_check is None or self.loop is None:
            return "starting"
        try:
            future = asyncio.run_coroutine_threadsafe(self.ready_check(), self.loop)
        except RuntimeError:  # the loop has closed: the worker is exiting
            return "stopping"
        try:
            problem: str | None = future.result(READY_TIMEOUT)
            return problem
        except TimeoutError:
            future.cancel()
            return f"readiness check took over {READY_TIMEOUT:g}s (Redis or the loop is slow)"
        except Exception as exc:
            return f"readiness check failed: {type(exc).__name__}"


def groups_check(client: RedisClient, namespace: Namespace, group: str,
                 worker: Callable[[], str | None] | None = None) -> Callable[[], Any]:
    """An async readiness check: Redis answers, every shard's group exists, no
    shard's ids are exhausted or far ahead of Redis's clock (the group's
    ``last-delivered-id``, ``processor.wire.stream_ids``), and ``worker()``
    (what the worker itself reports: the namespace's state lost a moment
    ago, processor.worker.continuity) says nothing."""

    async def check() -> str | None:
        problem = worker() if worker is not None else None
        if problem:
            return problem
        try:
            now_ms = stream_ids.redis_ms(await client.time())
        except Exception as exc:
            if not is_transient(exc):
                raise
            return f"redis unreachable: {type(exc).__name__}"
        for shard in namespace.all():
            try:
                groups = await client.xinfo_groups(shard.updates)
            except ResponseError as exc:  # no such key: the stream (and group) is missing
                return f"shard {shard.index}: {exc}"
            except Exception as exc:
                if not is_transient(exc):
                    raise
                return f"redis unreachable: {type(exc).__name__}"
            info = find_group(groups, group)
            if info is None:
                return f"shard {shard.index}: consumer group {group!r} missing"
            problem = stream_ids.problem(as_text(info.get("last-delivered-id") or "0-0"), now_ms)
            if problem:
                return (f"shard {shard.index}: {shard.updates} {problem}; "
                        "run processor repair-stream")
        return None

    return check


def app(health: Health) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: /healthz, /readyz, and metrics on every other path."""
    metrics_app = make_wsgi_app(health.metrics.registry)

    def handle(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/healthz", "/readyz"):
            problem = health.live() if path == "/healthz" else health.ready()
            status = "200 OK" if problem is None else "503 Service Unavailable"
            body = (problem or "ok").encode() + b"\n"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                                    ("Content-Length", str(len(body)))])
            return [body]
        body_parts: Iterable[bytes] = metrics_app(environ, start_response)
        return body_parts

    return handle


class Server:
    """The HTTP server thread. ``port=0`` picks a free port (see ``.port``)."""

    def __init__(self, health: Health, port: int, host: str = "0.0.0.0") -> None:
        self.httpd = make_server(host, port, app(health), ThreadingWSGIServer,
                                 handler_class=_QuietHandler)
        self.port = int(self.httpd.server_port)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics",
                                       daemon=True)

    def start(self) -> Server:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

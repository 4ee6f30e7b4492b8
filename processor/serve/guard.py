"""Connections that are not in a request: how long they may wait, how many.

aiohttp closes a connection that has not sent a whole request only when
its keep-alive timeout (75 s) passes, whatever arrives meanwhile: 2,000
connections sending one header byte every 5 s all stayed open 40 s, each
holding a file descriptor. ``PendingConnections`` watches every
connection from its accept to the start of its first request, and again
between requests (keep-alive): one that has not sent a whole request's
headers within ``header_timeout`` seconds is closed, and past ``limit``
such connections the oldest is closed at once, so a slow-header attack
holds at most ``limit`` descriptors for at most ``header_timeout`` each. A
connection in a request (a stream, however long) is not counted: its
token was checked at its start.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from processor.serve.metrics import ServeMetrics

#: Seconds after which a connection with no transport yet is taken for
#: closed (one accepted just now has none until its ``connection_made``).
_UNCONNECTED_GRACE = 1.0


class PendingConnections:
    """The connections waiting for their next request's headers, oldest first."""

    def __init__(self, header_timeout: float, limit: int, metrics: ServeMetrics) -> None:
        self.header_timeout = header_timeout
        self.limit = limit
        self.metrics = metrics
        self._waiting: OrderedDict[RequestHandler, tuple[float, asyncio.TimerHandle]] = \
            OrderedDict()

    def __len__(self) -> int:
        return len(self._waiting)

    def factory(self, server: web.Server) -> Any:
        """The protocol factory for the listening socket: ``server``'s, each
        new connection counted as waiting."""

        def make() -> RequestHandler:
            handler = server()
            self._wait(handler)
            self._bound()
            return handler

        return make

    def busy(self, handler: Any) -> None:
        """A request has started on ``handler``'s connection."""
        entry = self._waiting.pop(handler, None)
        if entry is not None:
            entry[1].cancel()

    def idle(self, handler: Any) -> None:
        """A request has ended; the connection waits for its next one (keep-alive)."""
        if handler.transport is not None and handler not in self._waiting:
            self._wait(handler)

    def _wait(self, handler: RequestHandler) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.header_timeout, self._expire, handler)
        self._waiting[handler] = (time.monotonic(), timer)

    def _expire(self, handler: RequestHandler) -> None:
        if self._waiting.pop(handler, None) is not None:
            self._close(handler, "header_timeout")

    def _bound(self) -> None:
        """Close the oldest waiting connections past the limit (first
        forgetting those already closed)."""
        if len(self._waiting) <= self.limit:
            return
        now = time.monotonic()
        for handler, (since, timer) in list(self._waiting.items()):
            if handler.transport is None and now - since > _UNCONNECTED_GRACE:
                timer.cancel()
                del self._waiting[handler]
        while len(self._waiting) > self.limit:
            handler, (_, timer) = self._waiting.popitem(last=False)
            timer.cancel()
            self._close(handler, "too_many")

    def _close(self, handler: RequestHandler, reason: str) -> None:
        transport = handler.transport
        if transport is None:
            return
        self.metrics.connections_closed.labels(reason).inc()
        transport.abort()  # nothing to tell it: it has not sent a request


PENDING = web.AppKey("pending", PendingConnections)


@web.middleware
async def in_request(request: web.Request, handler: Any) -> web.StreamResponse:
    """The connection is in a request while this runs (not counted as waiting)."""
    pending = request.app[PENDING]
    protocol = request.protocol
    pending.busy(protocol)
    try:
        response: web.StreamResponse = await handler(request)
        return response
    finally:
        pending.idle(protocol)


class GuardedRunner(web.AppRunner):
    """An ``aiohttp.web.AppRunner`` whose sites accept connections
    through the app's ``PendingConnections``."""

    @property
    def server(self) -> Any:
        server = super().server
        if server is None:
            return None
        return self.app[PENDING].factory(server)

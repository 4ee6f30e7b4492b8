"""The event stream of one turn: written with a deadline, joined to its
past, followed live, and ended so that every client resumes (docs/serve.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from processor.client import joining
from processor.client.joining import Join
from processor.client.turns import Cursor, LiveEvent, MergedOutput, TurnRef
from processor.redis_io.connections import is_redis_failure
from processor.serve import formats, sse
from processor.serve.edge import Server, refusal
from processor.serve.hub import Subscription

log = logging.getLogger("processor.serve")

#: Seconds a request waits for Redis (readiness, a turn's past) before 503.
REDIS_WAIT = 5.0
#: What a reconnecting EventSource waits, in ms (its default is about 3 s).
RETRY_MS = 1000
#: The longest ``?wait=`` a UI message stream takes, in seconds.
MAX_WAIT = 60.0


class SlowClient(Exception):
    """A write to the client did not finish within the write timeout."""


class EventStream:
    """One open ``text/event-stream`` response, written with a deadline."""

    def __init__(self, server: Server, request: web.Request, turn: TurnRef,
                 cursor: Cursor, fmt: formats.Format) -> None:
        self.server = server
        self.request = request
        self.turn = turn
        self.cursor = cursor
        self.fmt = fmt
        self.merged: MergedOutput | None = None
        self.opened = False  # (counted in open_streams)
        self.response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache, no-transform",
            "X-Accel-Buffering": "no",  # nginx: pass each event on at once
        })

    async def open(self) -> None:
        await self.response.prepare(self.request)
        await self.write([sse.retry(RETRY_MS)], 0)

    async def start(self) -> None:
        """Open the response, counted as an open stream until ``run`` ends it."""
        self.server.metrics.open_streams.inc()
        self.server.metrics.streams.inc()
        self.opened = True
        await self.open()

    async def write(self, chunks: list[bytes], events: int) -> None:
        if not chunks:
            return
        try:  # asyncio.timeout, not wait_for: no task per write
            async with asyncio.timeout(self.server.config.write_timeout):
                await self.response.write(b"".join(chunks))
        except TimeoutError:
            raise SlowClient from None
        if events:
            self.server.metrics.events_sent.inc(events)

    async def send(self, items: list[LiveEvent | MergedOutput]) -> None:
        """Write what the client does not have yet, in order; the merged
        response goes just before the terminal event."""
        chunks: list[bytes] = []
        for item in items:
            if isinstance(item, MergedOutput):
                self.merged = item
                continue
            if not self.cursor.take(item):
                continue
            merged = None
            if item.terminal:
                merged = self.merged or await self._final_merged()
            chunks += self.fmt.event(item, merged)
        await self.write(chunks, len(chunks))

    async def _final_merged(self) -> MergedOutput | None:
        """The merged entry when its terminal event came without it (from
        the past, or a read that reached the terminal before the entry)."""
        return (await self.server.source.final(self.turn)).merged

    async def follow(self, subscription: Subscription) -> None:
        """Write the live feed until the terminal event (then the stream
        ends), the client is too slow, or the server stops."""
        heartbeat = self.server.config.heartbeat
        while not self.cursor.ended:
            items = await subscription.take(heartbeat)
            if items is None:
                if subscription.dropped:
                    raise SlowClient
                self.cut()  # the server is stopping: the client reconnects to another
                return
            if items:
                await self.send(items)
            else:
                await self.write([sse.comment("ping")], 0)

    def cut(self) -> None:
        """End the stream as a broken connection ends, without the chunked
        body's last chunk: every client takes it for a fault and reconnects
        with its last id, also one that takes a clean end for the end of the
        turn (``@microsoft/fetch-event-source``'s default handlers resolve
        their promise then). ``EventSource`` reconnects either way."""
        self.response.force_close()
        if self.request.transport is not None:
            self.request.transport.abort()

    async def gone(self, status: str | None) -> None:
        """A finished turn whose terminal event is no longer in its stream:
        its merged response if still there, then a ``gone`` event."""
        chunks = self.fmt.gone(self.turn, self.merged, status)
        await self.write(chunks, len(chunks))

    async def drop(self) -> None:
        """Tell a slow client where to resume, if it can still be told, and close."""
        self.server.metrics.dropped_clients.inc()
        log.info("slow client dropped", extra={"response_id": self.turn.response_id,
                                               "last_event_id": self.cursor.resume_id})
        notice = self.fmt.notice({"type": "dropped", "reason": "slow_client",
                                  "response_id": self.turn.response_id,
                                  "last_event_id": self.cursor.resume_id})
        self.response.force_close()  # no keep-alive for a connection that fell behind
        told = False
        with contextlib.suppress(SlowClient, ConnectionError):
            await self.write([notice], 1)
            told = True
        transport = self.request.transport
        if transport is None:
            return
        # Ended without the last chunk, as ``cut`` does (a client that took
        # a clean end for the turn's end would not resume): closed once what
        # was written (the notice) is out, or at once if it could not be written.
        if told:
            transport.close()
        else:
            transport.abort()


async def join(server: Server, turn: TurnRef, after: int | None, whole: bool = False) -> Join:
    """What the stream sends before the live feed (``processor.client.joining.join``)."""
    start = await joining.join(server.source, turn, after, whole=whole)
    if start.incomplete:
        server.metrics.incomplete_history.inc()
    return start


async def started(subscription: Subscription, wait: float) -> list[LiveEvent | MergedOutput]:
    """What the feed brings of a turn not started yet within ``wait`` seconds
    (nothing: it did not start)."""
    deadline = time.monotonic() + wait
    while True:  # (once at least: it may have started since the join read its state)
        left = deadline - time.monotonic()
        items = await subscription.take(max(0.0, left))
        if items is None:
            return []
        if items or left <= 0:
            return items


async def subscribe(server: Server, turn: TurnRef) -> Subscription:
    """The turn's live feed, subscribed before its past is read (nothing falls
    between the two); 503 if the shard readers do not take it in time."""
    try:
        return await asyncio.wait_for(
            server.hub.subscribe(turn, server.config.client_queue), REDIS_WAIT)
    except TimeoutError:
        raise refusal(503, "not_ready", "not reading Redis yet") from None


async def run(stream: EventStream, subscription: Subscription,
              begin: Callable[[], Awaitable[Join | None]], *,
              abort_unended: bool = False) -> web.StreamResponse:
    """Stream a turn: ``begin`` joins it and, unless it returns None (then
    204: nothing to stream), starts ``stream`` (``EventStream.start``)
    and writes the past; then the turn's ``gone`` event or its live feed.
    A slow client is dropped, a client that went away left, and a Redis
    failure on an open stream ends it so that the client resumes: cut at
    once, or, with ``abort_unended`` (a UI message stream), aborted like any
    stream that ends before its terminal event. The subscription always ends."""
    server, turn = stream.server, stream.turn
    try:
        start = await begin()
        if start is None:
            return web.Response(status=204)  # EventSource stops reconnecting on 204
        if start.gone:
            await stream.gone(start.status)
            return stream.response
        await stream.follow(subscription)
    except SlowClient:
        await stream.drop()
    except ConnectionError:
        pass  # the client went away: nothing to tell anyone
    except Exception as exc:
        if not stream.opened or not is_redis_failure(exc):
            raise
        server.metrics.redis_errors.inc()
        log.warning("stream ended by a redis failure", extra={
            "response_id": turn.response_id, "error": f"{type(exc).__name__}: {exc}"})
        if not abort_unended:
            stream.cut()  # the client resumes (on another replica, or once Redis is back)
    finally:
        server.hub.unsubscribe(subscription)
        if stream.opened:
            server.metrics.open_streams.dec()
    if abort_unended and not stream.cursor.ended and stream.request.transport is not None:
        # Cut before its end (the server stopping, a slow client, Redis): a
        # broken connection, not a clean end, so that useChat takes it as a
        # disconnect (resumable) and not as a finished, truncated message.
        stream.request.transport.abort()
    return stream.response

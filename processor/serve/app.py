"""The HTTP side of ``processor serve``: routes, tokens, CORS, and the event
stream of one turn (docs/serve.md is the reference for clients).

- ``GET /v1/turns/{response_id}/events``: the turn as server-sent events.
- ``POST /v1/turns/{response_id}/events?format=agui``: the same for an AG-UI
  client, which posts a ``RunAgentInput`` (it attaches, it never starts a turn).
- ``GET /v1/turns/{response_id}``: its outcome (200), or 202 while it runs, 404 unknown.
- ``POST /v1/turns/{response_id}/cancel``: sets its cancellation key.
- ``GET /v1/turns/{response_id}/view``: a page that watches it.
- ``/healthz``, ``/readyz``, ``/metrics``.

Every ``/v1/turns/{response_id}...`` request needs a token for that
response_id (processor/serve/tokens.py) unless the server runs with
``--no-auth``. Everything is read from Redis: any replica answers any request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from processor.client import CancelNotTaken, LibraryNotLoaded, Producer, joining
from processor.client.joining import Join
from processor.client.source import TurnSource
from processor.client.turns import (
    Cursor,
    LiveEvent,
    MergedOutput,
    TurnRef,
    parse_after,
)
from processor.redis_io.connections import is_redis_failure
from processor.serve import formats, sse, ui_format
from processor.serve.config import ServeConfig
from processor.serve.gate import RedisGate
from processor.serve.hub import Hub, Subscription
from processor.serve.metrics import ServeMetrics
from processor.serve.tokens import Verdict, verify
from processor.wire.cancels import REASON_BYTES, check_reason
from processor.wire.ids import MAX_ID_LENGTH, response_id_for_turn

log = logging.getLogger("processor.serve")

#: Seconds a request waits for Redis (readiness, a turn's past) before 503.
REDIS_WAIT = 5.0
#: What a reconnecting EventSource waits, in ms (its default is about 3 s).
RETRY_MS = 1000
#: Seconds /readyz waits for Redis's answer.
READY_TIMEOUT = 2.0
#: The longest cancellation reason taken, in bytes of UTF-8 (cancel_turn.lua's bound).
MAX_REASON = REASON_BYTES
#: The largest ``RunAgentInput`` body an AG-UI client may post (its whole
#: conversation rides along), in bytes.
MAX_RUN_INPUT = 4 * 1024 * 1024

_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden,
    404: web.HTTPNotFound, 406: web.HTTPNotAcceptable,
    409: web.HTTPConflict, 413: web.HTTPRequestEntityTooLarge, 503: web.HTTPServiceUnavailable,
}


def refusal(status: int, code: str, detail: str, **headers: str) -> web.HTTPException:
    """An error answer: ``{"error": code, "detail": detail}``."""
    body = json.dumps({"error": code, "detail": detail})
    if status == 413:
        return web.HTTPRequestEntityTooLarge(MAX_RUN_INPUT, 0, text=body,
                                             content_type="application/json")
    return _ERRORS[status](text=body, content_type="application/json", headers=headers or None)


@dataclass
class Server:
    """What every request handler shares."""

    config: ServeConfig
    client: Any
    hub: Hub
    source: TurnSource
    metrics: ServeMetrics = field(default_factory=ServeMetrics)
    clock: Callable[[], float] = time.time
    gate: RedisGate | None = None  # (None: one of config.redis_connections slots)

    def __post_init__(self) -> None:
        self.producer = Producer(self.client, self.config.namespace.name,
                                 self.config.namespace.shards)
        self.slots = self.gate or RedisGate(self.config.redis_connections,
                                            self.metrics.redis_wait)

    def authorize(self, request: web.Request, response_id: str) -> None:
        """Raise 401 or 403 unless the request's token is for ``response_id``."""
        secret = self.config.token_secret
        if secret is None:
            return
        verdict = verify(secret, _token(request), response_id, self.clock())
        if verdict is Verdict.OK:
            return
        self.metrics.auth_refusals.labels(verdict.value).inc()
        detail = {
            Verdict.MISSING: "a token is needed: Authorization: Bearer <token> or ?token=",
            Verdict.BAD: "the token is not one of this server's",
            Verdict.EXPIRED: "the token has expired",
            Verdict.FORBIDDEN: "the token is for another turn",
        }[verdict]
        headers = {"WWW-Authenticate": 'Bearer error="invalid_token"'} if verdict.status == 401 \
            else {}
        raise refusal(verdict.status, verdict.value, detail, **headers)


SERVER = web.AppKey("server", Server)


def _token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.query.get("token")


def turn_of(request: web.Request) -> TurnRef:
    """The synthesis a request names: the path's response_id, ``?attempt_id=``
    and, for a turn sent with only a turn_id, ``?turn_id=`` (its shard)."""
    response_id = request.match_info["response_id"]
    turn_id = request.query.get("turn_id") or None
    if len(response_id) > MAX_ID_LENGTH or len(turn_id or "") > MAX_ID_LENGTH:
        raise refusal(400, "bad_request",
                      f"ids are at most {MAX_ID_LENGTH} characters (docs/contract.md §3.2)")
    if turn_id is not None and response_id_for_turn(turn_id) != response_id:
        raise refusal(400, "bad_request", f"turn_id {turn_id!r} has the ResponseId "
                      f"{response_id_for_turn(turn_id)!r}, not {response_id!r}")
    return TurnRef(response_id, request.query.get("attempt_id", ""), turn_id)


# --------------------------------------------------------------------------- turns


async def get_turn(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    turn = turn_of(request)
    server.authorize(request, turn.response_id)
    state = await server.source.state(turn)
    if state.phase == "finished":
        final = await server.source.final(turn)
        merged = final.merged
        body = {"status": state.status,
                "response": msgspec.Raw(merged.response) if merged else None,
                "meta": msgspec.Raw(merged.meta) if merged else None}
        return _json(200, body)
    if state.phase == "running":
        snapshot = await server.source.snapshot(turn)
        return _json(202, {"status": "running",
                           "snapshot": msgspec.Raw(snapshot.data) if snapshot else None})
    raise refusal(404, "unknown_turn", "no such turn: not started yet, never sent, or finished "
                  "longer ago than the workers remember (--done-ttl)")


async def cancel_turn(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    turn = turn_of(request)
    server.authorize(request, turn.response_id)
    reason = "cancelled"
    if request.can_read_body:
        try:  # a body sent slowly holds the connection no longer than its headers could
            async with asyncio.timeout(server.config.header_timeout):
                body = await request.json()
        except TimeoutError:
            raise refusal(400, "bad_request", "the body did not arrive in time") from None
        except ValueError:
            raise refusal(400, "bad_request", "the body must be JSON: {\"reason\": \"...\"}") \
                from None
        given = body.get("reason") if isinstance(body, dict) else None
        if given is not None:
            try:
                check_reason(given)
            except ValueError as exc:
                raise refusal(400, "bad_request", f"reason: {exc}") from None
            reason = given
    server.metrics.redis_calls.labels("cancel").inc()
    async with server.slots.slot():
        try:  # (the serve ACL user asks the workers: cancel_turn.lua)
            await server.producer.cancel(turn.response_id if not turn.turn_id else None, reason,
                                         turn_id=turn.turn_id or None)
        except (CancelNotTaken, LibraryNotLoaded) as exc:
            raise refusal(503, "cancel_not_taken", str(exc)) from None
    log.info("turn cancelled", extra={"response_id": turn.response_id})
    return _json(202, {"cancelled": turn.response_id})


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(body),
                        content_type="application/json")


# --------------------------------------------------------------------------- events


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
        self.response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache, no-transform",
            "X-Accel-Buffering": "no",  # nginx: pass each event on at once
        })

    async def open(self) -> None:
        await self.response.prepare(self.request)
        await self.write([sse.retry(RETRY_MS)], 0)

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
        # Ended without the last chunk, as :meth:`cut` does (a client that took
        # a clean end for the turn's end would not resume): closed once what
        # was written (the notice) is out, or at once if it could not be written.
        if told:
            transport.close()
        else:
            transport.abort()


async def join(server: Server, turn: TurnRef, after: int | None, whole: bool = False) -> Join:
    """What the stream sends before the live feed (:func:`processor.client.joining.join`)."""
    start = await joining.join(server.source, turn, after, whole=whole)
    if start.incomplete:
        server.metrics.incomplete_history.inc()
    return start


async def turn_events(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    turn = turn_of(request)
    server.authorize(request, turn.response_id)
    return await _events(request, server, turn, request.query.get("format", "native"), None)


async def turn_events_posted(request: web.Request) -> web.StreamResponse:
    """An AG-UI client's ``POST`` of a ``RunAgentInput``: the turn's AG-UI
    stream, as ``GET ?format=agui`` answers it (docs/serve.md, "AG-UI")."""
    server = request.app[SERVER]
    turn = turn_of(request)
    server.authorize(request, turn.response_id)
    name = request.query.get("format", "agui")
    if name != "agui":
        raise refusal(400, "bad_request", "POST answers AG-UI clients (format=agui); "
                      "GET serves the other formats")
    run_input = await _run_input(request)
    run_id = run_input.run_id
    if run_id is not None and run_id.endswith(":synthesis") \
            and run_id != turn.key.synthesis_id():
        raise refusal(409, "other_turn", f"runId {run_id!r} names another turn than "
                      f"{turn.key.synthesis_id()!r} (the path's); leave runId to the client, "
                      "or set it to this turn's")
    return await _events(request, server, turn, name, run_input.messages)


@dataclass
class RunInput:
    """What ``processor serve`` reads of a posted ``RunAgentInput``: its
    ``runId`` (checked) and ``messages`` (what the client holds); its
    ``threadId``, ``tools``, ``state``, ``context`` and ``forwardedProps``
    are ignored (the turn is the path's)."""

    run_id: str | None
    messages: list[dict[str, Any]] | None


async def _run_input(request: web.Request) -> RunInput:
    if request.content_length is not None and request.content_length > MAX_RUN_INPUT:
        raise refusal(413, "too_large", f"the body is over {MAX_RUN_INPUT} bytes")
    parts: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):  # read() may stop short: to EOF
        size += len(chunk)
        if size > MAX_RUN_INPUT:
            raise refusal(413, "too_large", f"the body is over {MAX_RUN_INPUT} bytes")
        parts.append(chunk)
    raw = b"".join(parts)
    if not raw.strip():
        return RunInput(None, None)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise refusal(400, "bad_request", "the body must be JSON: AG-UI's RunAgentInput "
                      "({threadId, runId, messages, ...})") from None
    if not isinstance(body, dict):
        raise refusal(400, "bad_request", "the body must be a JSON object (RunAgentInput)")
    for name in ("threadId", "runId"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise refusal(400, "bad_request", f"{name} must be a string")
    given = body.get("messages")
    if given is None:
        return RunInput(body.get("runId"), None)
    if not isinstance(given, list):
        raise refusal(400, "bad_request", "messages must be a list of AG-UI messages")
    for i, message in enumerate(given):
        if not isinstance(message, dict):
            raise refusal(400, "bad_request", f"messages[{i}] must be an object (an AG-UI "
                          "message)")
    # A message without a string id and role cannot be named by a snapshot:
    # not kept (Agent Framework's AGUIChatClient posts its prompt without an id).
    given = [m for m in given if isinstance(m.get("id"), str) and isinstance(m.get("role"), str)]
    return RunInput(body.get("runId"), given)


def _accepts_event_stream(request: web.Request) -> bool:
    """Whether the request's ``Accept`` (absent: anything) takes ``text/event-stream``."""
    accept = request.headers.get("Accept")
    if not accept:
        return True
    for part in accept.split(","):
        media, _, params = part.strip().partition(";")
        if media.strip().lower() in ("text/event-stream", "text/*", "*/*") \
                and params.replace(" ", "").lower() not in ("q=0", "q=0.0", "q=0.00", "q=0.000"):
            return True
    return False


async def _events(request: web.Request, server: Server, turn: TurnRef, name: str,
                  given: list[dict[str, Any]] | None) -> web.StreamResponse:
    if not _accepts_event_stream(request):
        raise refusal(406, "not_acceptable", "this answers text/event-stream only (Accept: "
                      f"{request.headers.get('Accept')!r})")
    try:
        after = parse_after(request.headers.get("Last-Event-ID") or request.query.get("after"))
    except ValueError as exc:
        raise refusal(400, "bad_request", str(exc)) from None
    if name not in formats.FORMATS:
        raise refusal(400, "bad_request", f"format must be one of {', '.join(formats.FORMATS)}, "
                      f"got {name!r}")
    if after is not None:
        server.metrics.resumes.inc()
    try:  # subscribed before the past is read: nothing falls between the two
        subscription = await asyncio.wait_for(
            server.hub.subscribe(turn, server.config.client_queue), REDIS_WAIT)
    except TimeoutError:
        raise refusal(503, "not_ready", "not reading Redis yet") from None
    fmt = formats.make(name, fresh=after is None, given=given)
    stream = EventStream(server, request, turn, Cursor(-1 if after is None else after), fmt)
    opened = False
    try:
        start = await join(server, turn, after, whole=name == "agui")
        if start.has_all:
            return web.Response(status=204)  # EventSource stops reconnecting on 204
        server.metrics.open_streams.inc()
        server.metrics.streams.inc()
        opened = True
        await stream.open()
        for event in start.folded:
            fmt.fold(event)
        if start.snapshot is not None:
            stream.cursor.jump(start.snapshot.seq)
            first = start.folded[0] if start.folded else None
            frames = fmt.snapshot(start.snapshot, first)
            await stream.write(frames, len(frames))
        await stream.send(start.past)
        if start.gone:
            await stream.gone(start.status)
            return stream.response
        await stream.follow(subscription)
    except SlowClient:
        await stream.drop()
    except ConnectionError:
        pass  # the client went away: nothing to tell anyone
    except Exception as exc:
        if not opened or not is_redis_failure(exc):
            raise
        server.metrics.redis_errors.inc()
        log.warning("stream ended by a redis failure", extra={
            "response_id": turn.response_id, "error": f"{type(exc).__name__}: {exc}"})
        stream.cut()  # the client resumes (on another replica, or once Redis is back)
    finally:
        server.hub.unsubscribe(subscription)
        if opened:
            server.metrics.open_streams.dec()
    return stream.response


# --------------------------------------------------------------------------- AI SDK

#: The longest ``?wait=`` a UI message stream takes, in seconds.
MAX_WAIT = 60.0


async def turn_ui_stream(request: web.Request) -> web.StreamResponse:
    """The turn as the AI SDK's UI message stream (docs/serve.md, "The AI
    SDK"): what ``DefaultChatTransport.reconnectToStream`` asks for with
    ``api`` set to ``/v1/turns``. A turn the server does not know: 204 (the
    AI SDK's "nothing to resume"), at once or, with ``?wait=<seconds>``, if
    it has not started by then. Every connection is a fresh join."""
    server = request.app[SERVER]
    turn = turn_of(request)
    server.authorize(request, turn.response_id)
    try:
        wait = float(request.query.get("wait", "0"))
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= MAX_WAIT:  # (also NaN)
        raise refusal(400, "bad_request", f"wait must be 0 to {MAX_WAIT:g} seconds")
    try:  # subscribed before the past is read: nothing falls between the two
        subscription = await asyncio.wait_for(
            server.hub.subscribe(turn, server.config.client_queue), REDIS_WAIT)
    except TimeoutError:
        raise refusal(503, "not_ready", "not reading Redis yet") from None
    fmt = ui_format.UiMessages(turn)
    stream = EventStream(server, request, turn, Cursor(), fmt)
    stream.response.headers[ui_format.HEADER[0]] = ui_format.HEADER[1]
    opened = False
    try:
        start = await join(server, turn, None)
        early: list[LiveEvent | MergedOutput] = []
        if start.unknown:
            early = await _started(subscription, wait)
            if not early:
                return web.Response(status=204)  # useChat: no stream to resume
        server.metrics.open_streams.inc()
        server.metrics.streams.inc()
        opened = True
        await stream.open()
        if start.snapshot is not None:
            stream.cursor.jump(start.snapshot.seq)
            frames = fmt.snapshot(start.snapshot, None)
            await stream.write(frames, len(frames))
        await stream.send([*start.past, *early])
        if start.gone:
            await stream.gone(start.status)
            return stream.response
        await stream.follow(subscription)
    except SlowClient:
        await stream.drop()
    except ConnectionError:
        pass
    except Exception as exc:
        if not opened or not is_redis_failure(exc):
            raise
        server.metrics.redis_errors.inc()
        log.warning("stream ended by a redis failure", extra={
            "response_id": turn.response_id, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        server.hub.unsubscribe(subscription)
        if opened:
            server.metrics.open_streams.dec()
    if not stream.cursor.ended and request.transport is not None:
        # Cut before its end (the server stopping, a slow client, Redis): a
        # broken connection, not a clean end, so that useChat takes it as a
        # disconnect (resumable) and not as a finished, truncated message.
        request.transport.abort()
    return stream.response


async def _started(subscription: Subscription, wait: float) -> list[LiveEvent | MergedOutput]:
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


# --------------------------------------------------------------------------- page

_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)
_STYLE = re.compile(r"<style>(.*?)</style>", re.S)


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@dataclass(frozen=True)
class Page:
    """The watch page (static/view.html) and its Content-Security-Policy:
    only its own inline script and style run, and it talks only to this origin."""

    html: bytes
    policy: str

    @classmethod
    def load(cls) -> Page:
        text = (resources.files("processor.serve") / "static" / "view.html").read_text("utf-8")
        scripts = " ".join(_sha256(s) for s in _SCRIPT.findall(text))
        styles = " ".join(_sha256(s) for s in _STYLE.findall(text))
        policy = (f"default-src 'none'; script-src {scripts}; style-src {styles}; "
                  "connect-src 'self'; base-uri 'none'; form-action 'none'; "
                  "frame-ancestors 'none'")
        return cls(text.encode("utf-8"), policy)


PAGE = web.AppKey("page", Page)


async def view(request: web.Request) -> web.Response:
    """The page, also for a request the stream would refuse (a bad or expired
    token, a bad turn_id): then with the refusal's status, and the page says
    what happened in words, from its event stream's answer (one place for
    those words: the page, for a first load and a reconnect alike). The page
    holds no data of the turn: its stream is authorised on its own."""
    server = request.app[SERVER]
    status, headers = 200, {}
    try:
        turn = turn_of(request)
        server.authorize(request, turn.response_id)
    except web.HTTPException as refused:
        status = refused.status
        if "WWW-Authenticate" in refused.headers:
            headers["WWW-Authenticate"] = refused.headers["WWW-Authenticate"]
    page = request.app[PAGE]
    return web.Response(status=status, body=page.html, content_type="text/html",
                        charset="utf-8", headers={
        **headers,
        "Content-Security-Policy": page.policy,
        "Referrer-Policy": "no-referrer",  # the URL holds the token
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
    })


# --------------------------------------------------------------------------- operations


async def healthz(request: web.Request) -> web.Response:
    if request.app[SERVER].hub.alive:
        return web.Response(text="ok\n")
    return web.Response(status=503, text="a shard reader has stopped\n")


async def readyz(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    server.metrics.redis_calls.labels("ready").inc()
    try:
        async with server.slots.slot(READY_TIMEOUT):
            await uncancelled(server.client.ping(), READY_TIMEOUT)
    except TimeoutError:
        return web.Response(status=503, text=f"redis did not answer within {READY_TIMEOUT:g}s\n")
    except Exception as exc:
        if not is_redis_failure(exc):
            raise
        return web.Response(status=503, text=f"redis unreachable: {type(exc).__name__}\n")
    if not server.hub.positioned:
        return web.Response(status=503, text="shard readers not positioned yet\n")
    return web.Response(text="ok\n")


async def uncancelled(call: Awaitable[Any], timeout: float) -> Any:
    """``call``'s result, or TimeoutError after ``timeout`` s while ``call``
    goes on (bounded by the connection's socket timeout). Redis calls are
    never cancelled here: redis-py (8.1, on Python 3.11) can swallow the
    cancellation of a call in flight and leave its task waiting for good."""
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise TimeoutError
    return task.result()


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[SERVER].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# --------------------------------------------------------------------------- CORS


@dataclass(frozen=True)
class Cors:
    """Which browser origins may call (``("*",)``: any; empty: none)."""

    origins: tuple[str, ...]

    def allowed(self, origin: str | None) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for ``origin``, or None."""
        if not origin:
            return None
        if "*" in self.origins:
            return "*"
        return origin if origin in self.origins else None


CORS = web.AppKey("cors", Cors)
_PREFLIGHT = {
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Last-Event-ID",
    "Access-Control-Max-Age": "600",
}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def redis_unavailable(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request that Redis failed gets 503 (a stream already open just ends)."""
    try:
        return await handler(request)
    except RedisError as exc:  # not any OSError: a client that went away is not Redis
        request.app[SERVER].metrics.redis_errors.inc()
        log.warning("request failed: redis unavailable",
                    extra={"path": request.path, "error": type(exc).__name__})
        raise refusal(503, "redis_unavailable", "Redis did not answer; retry") from None


@web.middleware
async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        if request.app[CORS].allowed(request.headers.get("Origin")) is None:
            raise web.HTTPForbidden(text="origin not allowed\n")
        return web.Response(status=204, headers=_PREFLIGHT)
    return await handler(request)


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """On every response (streams included, before their headers go out)."""
    cors = request.app[CORS]
    if not cors.origins:
        return
    allowed = cors.allowed(request.headers.get("Origin"))
    if allowed is not None:
        response.headers["Access-Control-Allow-Origin"] = allowed
    if allowed != "*":
        response.headers.add("Vary", "Origin")


def make_app(server: Server) -> web.Application:
    app = web.Application(middlewares=[preflight, redis_unavailable])
    app[SERVER] = server
    app[PAGE] = Page.load()
    app[CORS] = Cors(server.config.cors_origins)
    app.on_response_prepare.append(cors_headers)
    # Any path part names a turn: aiohttp's default pattern, [^{}/]+, refused
    # the braces workers accept in ids (the route's own braces are its syntax).
    turn = "/v1/turns/{response_id:[^/]+}"
    app.router.add_get(turn, get_turn)
    app.router.add_get(turn + "/events", turn_events)
    app.router.add_post(turn + "/events", turn_events_posted)
    app.router.add_get(turn + "/stream", turn_ui_stream)
    app.router.add_post(turn + "/cancel", cancel_turn)
    app.router.add_get(turn + "/view", view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app

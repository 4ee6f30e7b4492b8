"""The routes of ``processor serve`` (docs/serve.md is the reference for
clients); the HTTP edge they share is in ``edge``, the event stream in ``stream``.

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
import logging
from collections.abc import Awaitable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from processor.client import CancelNotTaken, LibraryNotLoaded
from processor.client.joining import Join
from processor.client.turns import Cursor, LiveEvent, MergedOutput, TurnRef, parse_after
from processor.redis_io.connections import is_redis_failure
from processor.serve import formats, ui_format
from processor.serve.edge import (
    CORS,
    SERVER,
    Cors,
    Server,
    authorized_turn,
    cors_headers,
    json_response,
    preflight,
    redis_unavailable,
    refusal,
)
from processor.serve.page import PAGE, Page, view
from processor.serve.run_input import accepts_event_stream, run_input
from processor.serve.stream import MAX_WAIT, EventStream, join, run, started, subscribe
from processor.wire.cancels import REASON_BYTES, check_reason

log = logging.getLogger("processor.serve")

#: Seconds /readyz waits for Redis's answer.
READY_TIMEOUT = 2.0
#: The longest cancellation reason taken, in bytes of UTF-8 (cancel_turn.lua's bound).
MAX_REASON = REASON_BYTES


# --------------------------------------------------------------------------- turns


async def get_turn(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    turn = authorized_turn(request)
    state = await server.source.state(turn)
    if state.phase == "finished":
        final = await server.source.final(turn)
        merged = final.merged
        body = {"status": state.status,
                "response": msgspec.Raw(merged.response) if merged else None,
                "meta": msgspec.Raw(merged.meta) if merged else None}
        return json_response(200, body)
    if state.phase == "running":
        snapshot = await server.source.snapshot(turn)
        return json_response(202, {"status": "running",
                           "snapshot": msgspec.Raw(snapshot.data) if snapshot else None})
    raise refusal(404, "unknown_turn", "no such turn: not started yet, never sent, or finished "
                  "longer ago than the workers remember (--done-ttl)")


async def cancel_turn(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    turn = authorized_turn(request)
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
    return json_response(202, {"cancelled": turn.response_id})


# --------------------------------------------------------------------------- events


async def turn_events(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    turn = authorized_turn(request)
    return await _events(request, server, turn, request.query.get("format", "native"), None)


async def turn_events_posted(request: web.Request) -> web.StreamResponse:
    """An AG-UI client's ``POST`` of a ``RunAgentInput``: the turn's AG-UI
    stream, as ``GET ?format=agui`` answers it (docs/serve.md, "AG-UI")."""
    server = request.app[SERVER]
    turn = authorized_turn(request)
    name = request.query.get("format", "agui")
    if name != "agui":
        raise refusal(400, "bad_request", "POST answers AG-UI clients (format=agui); "
                      "GET serves the other formats")
    posted = await run_input(request)
    run_id = posted.run_id
    if run_id is not None and run_id.endswith(":synthesis") \
            and run_id != turn.key.synthesis_id():
        raise refusal(409, "other_turn", f"runId {run_id!r} names another turn than "
                      f"{turn.key.synthesis_id()!r} (the path's); leave runId to the client, "
                      "or set it to this turn's")
    return await _events(request, server, turn, name, posted.messages)


async def _events(request: web.Request, server: Server, turn: TurnRef, name: str,
                  given: list[dict[str, Any]] | None) -> web.StreamResponse:
    if not accepts_event_stream(request):
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
    subscription = await subscribe(server, turn)
    fmt = formats.make(name, fresh=after is None, given=given)
    stream = EventStream(server, request, turn, Cursor(-1 if after is None else after), fmt)

    async def begin() -> Join | None:
        start = await join(server, turn, after, whole=name == "agui")
        if start.has_all:
            return None
        await stream.start()
        for event in start.folded:
            fmt.fold(event)
        if start.snapshot is not None:
            stream.cursor.jump(start.snapshot.seq)
            first = start.folded[0] if start.folded else None
            frames = fmt.snapshot(start.snapshot, first)
            await stream.write(frames, len(frames))
        await stream.send(start.past)
        return start

    return await run(stream, subscription, begin)


# --------------------------------------------------------------------------- AI SDK


async def turn_ui_stream(request: web.Request) -> web.StreamResponse:
    """The turn as the AI SDK's UI message stream (docs/serve.md, "The AI
    SDK"): what ``DefaultChatTransport.reconnectToStream`` asks for with
    ``api`` set to ``/v1/turns``. A turn the server does not know: 204 (the
    AI SDK's "nothing to resume"), at once or, with ``?wait=<seconds>``, if
    it has not started by then. Every connection is a fresh join."""
    server = request.app[SERVER]
    turn = authorized_turn(request)
    try:
        wait = float(request.query.get("wait", "0"))
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= MAX_WAIT:  # (also NaN)
        raise refusal(400, "bad_request", f"wait must be 0 to {MAX_WAIT:g} seconds")
    subscription = await subscribe(server, turn)
    fmt = ui_format.UiMessages(turn)
    stream = EventStream(server, request, turn, Cursor(), fmt)
    stream.response.headers[ui_format.HEADER[0]] = ui_format.HEADER[1]

    async def begin() -> Join | None:
        start = await join(server, turn, None)
        early: list[LiveEvent | MergedOutput] = []
        if start.unknown:
            early = await started(subscription, wait)
            if not early:
                return None  # useChat: no stream to resume
        await stream.start()
        if start.snapshot is not None:
            stream.cursor.jump(start.snapshot.seq)
            frames = fmt.snapshot(start.snapshot, None)
            await stream.write(frames, len(frames))
        await stream.send([*start.past, *early])
        return start

    return await run(stream, subscription, begin, abort_unended=True)


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

"""The HTTP edge of ``processor serve``: what every handler shares
(``Server``), its error answers, who may ask (tokens), which browser
origins may call (CORS), and the middlewares."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web
from redis.exceptions import RedisError

from processor.client import Producer
from processor.client.source import TurnSource
from processor.client.turns import TurnRef
from processor.serve.config import ServeConfig
from processor.serve.gate import RedisGate
from processor.serve.hub import Hub
from processor.serve.metrics import ServeMetrics
from processor.serve.tokens import Verdict, verify
from processor.wire.ids import MAX_ID_LENGTH, response_id_for_turn

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

log = logging.getLogger("processor.serve")

_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden,
    404: web.HTTPNotFound, 406: web.HTTPNotAcceptable,
    409: web.HTTPConflict, 503: web.HTTPServiceUnavailable,
}


def refusal(status: int, code: str, detail: str, **headers: str) -> web.HTTPException:
    """An error answer: ``{"error": code, "detail": detail}``."""
    body = json.dumps({"error": code, "detail": detail})
    return _ERRORS[status](text=body, content_type="application/json", headers=headers or None)


def too_large(limit: int, code: str, detail: str) -> web.HTTPException:
    """A 413 answer for a body over ``limit`` bytes, shaped as ``refusal``'s."""
    body = json.dumps({"error": code, "detail": detail})
    return web.HTTPRequestEntityTooLarge(limit, 0, text=body, content_type="application/json")


def json_response(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(body),
                        content_type="application/json")


@dataclass
class Server:
    """What every request handler shares."""

    config: ServeConfig
    client: RedisClient
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


def authorized_turn(request: web.Request) -> TurnRef:
    """The turn the request names, once its token is checked for it."""
    turn = turn_of(request)
    request.app[SERVER].authorize(request, turn.response_id)
    return turn


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

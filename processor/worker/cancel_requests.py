"""The worker's side of cancel requests: setting the cancellation keys that
the least-privilege clients may not set themselves.

A Redis Function runs its commands with its caller's rights, and an ACL
grants commands and keys, never argument values: a user that may ``SET`` a
cancel key may ``SET`` it to 100 MB, without TTL, or to ``PX 1`` over
another client's cancel. So the shipped ``serve`` and ``producer`` users may
not ``SET`` cancel keys; ``cancel_turn.lua``, which they ``FCALL``, publishes
their request on the namespace's channel ``{ns:0}:cancels`` instead (Pub/Sub
stores nothing in Redis), and they wait until the key exists. Every worker
subscribes to that channel and calls the same function with its own rights,
which may ``SET`` cancel keys: bounded reason, a TTL, never shortening or
deleting a cancel already set (docs/contract.md §6). Every worker takes
every request (the function is idempotent); anything on the channel that
is not a well-formed request for this namespace (a hostile client may
``PUBLISH`` anything there) is counted and dropped.

Idle cost: one subscribed connection per worker, nothing sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from processor.redis_io.connections import is_redis_failure, is_transient
from processor.redis_io.replies import as_text
from processor.scripts.library import Function
from processor.wire import defaults
from processor.wire.cancels import check_reason, check_ttl
from processor.wire.keys import Namespace
from processor.worker.metrics import Metrics

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

log = logging.getLogger("processor.cancels")

#: Seconds between two reads of the channel by default (``WorkerConfig.idle_wait``:
#: a stopping worker leaves within it), and before subscribing again after a failure.
WAIT_S = defaults.IDLE_WAIT
#: Seconds between two log lines of the same failure.
LOG_EVERY_S = 60.0


class Refused(ValueError):
    """A message on the cancel channel that is not a request to carry out."""


def parse_request(namespace: Namespace, data: bytes | str) -> tuple[str, str, int]:
    """A request as ``cancel_turn.lua`` publishes it, ``[key, reason, ttl]``
    (JSON), checked: a cancellation key of ``namespace``, a reason and a TTL
    within the function's bounds. ``Refused`` says what is wrong."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(f"not JSON: {type(exc).__name__}") from None
    if not (isinstance(value, list) and len(value) == 3):
        raise Refused("not [key, reason, ttl]")
    key, reason, ttl = value
    if not isinstance(key, str) or namespace.cancel_key_shard(key) is None:
        raise Refused("not a cancellation key of this namespace")
    try:
        check_reason(reason)
        check_ttl(ttl)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    return key, reason, ttl


class CancelRequests:
    """Takes the namespace's cancel requests until stopped."""

    def __init__(self, client: RedisClient, namespace: Namespace, metrics: Metrics,
                 wait: float = WAIT_S) -> None:
        self.client = client
        self.wait = wait  # seconds of each read of the channel (WAIT_S)
        self.namespace = namespace
        self.metrics = metrics
        self.cancel_turn = Function(client, "cancel_turn")
        self._logged: tuple[str, float] | None = None  # the last failure logged, when
        self._refused, self._refused_logged = 0, -LOG_EVERY_S  # refused since logged, when
        self._subscribed = False  # whether the current subscription was made

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self._subscribed = False
            try:
                await self._listen(stopping)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis down, a refusal: never the worker's end
                self._failed(exc)
                if self._subscribed:
                    # Dropped after subscribing (a message past Redis's Pub/Sub
                    # output limit does that): subscribe again at once, since a
                    # request published in the gap reaches no worker. A
                    # subscription that cannot be made waits WAIT_S.
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=self.wait)

    async def _listen(self, stopping: asyncio.Event) -> None:
        pubsub = self.client.pubsub()
        try:
            await pubsub.subscribe(self.namespace.cancels)
            self._subscribed = True
            while not stopping.is_set():
                message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                   timeout=self.wait)
                if message is not None and message.get("type") == "message":
                    await self.take(message["data"])
        finally:
            with contextlib.suppress(Exception):
                # (redis-py leaves PubSub.aclose unannotated)
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def take(self, data: bytes | str) -> str:
        """Carry out one request; what became of it (``set``, ``kept``, ``refused``)."""
        try:
            key, reason, ttl = parse_request(self.namespace, data)
        except Refused as exc:
            self.metrics.cancel_requests.labels("refused").inc()
            self._refused += 1
            now = time.monotonic()
            if now - self._refused_logged >= LOG_EVERY_S:  # (a flood logs once a minute)
                log.warning("cancel requests refused", extra={"why": str(exc),
                                                              "count": self._refused})
                self._refused, self._refused_logged = 0, now
            return "refused"
        try:  # (no channel: a worker whose user may not set the key must not ask again)
            reply = await self.cancel_turn(keys=[key], args=[reason, ttl, ""])
        except ResponseError as exc:
            if "CANCELNOPERM" not in str(exc):
                raise
            self.metrics.cancel_requests.labels("refused").inc()
            self._failed(exc)  # (an error, once a minute: the ACL misses a grant)
            return "refused"
        outcome = as_text(reply[0])
        self.metrics.cancel_requests.labels(outcome).inc()
        if self._logged is not None:
            log.info("taking cancel requests again")
            self._logged = None
        return outcome

    def _failed(self, exc: Exception) -> None:
        if not is_redis_failure(exc):
            self.metrics.step_failed(exc)
            log.exception("taking cancel requests failed unexpectedly")
            return
        self.metrics.redis_error(exc)
        text, now = f"{type(exc).__name__}: {exc}", time.monotonic()
        if self._logged is None or self._logged[0] != text or now - self._logged[1] >= LOG_EVERY_S:
            level = logging.WARNING if is_transient(exc) else logging.ERROR
            log.log(level, "cannot take cancel requests; subscribing again", extra={"error": text})
            self._logged = (text, now)

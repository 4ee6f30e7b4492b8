"""The client side of the wire contract: producers send updates, subscribers read outputs.

:class:`Producer` writes input entries (contract section 3) to the right shard,
idempotently and with retries; it also sets and reads cancellation keys
(section 6) so a generator can stop when its turn is cancelled.
:class:`Subscriber` follows the ``merged`` and ``events`` streams of every
shard (section 5), resumable from the positions it reports, and waits for the
merged response of one turn.

Both take an asyncio Redis client: ``redis.asyncio.Redis`` or
``redis.asyncio.cluster.RedisCluster`` (see :func:`processor.connections.connect`)::

    producer = Producer(client, shards=4)
    await producer.stream("resp_1", agent.run_stream("hi"))
    item = await Subscriber(client, shards=4).wait_for("resp_1", timeout=60)
    response = item.agent_response()
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

import msgspec
from redis.asyncio.cluster import RedisCluster
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from processor.connections import TRANSIENT, as_text
from processor.ids import response_id_for_turn, shard_of
from processor.keys import DEFAULT_NAMESPACE, Namespace, Shard
from processor.models import ENTRY_IDS, TURN_IDS
from processor.scripts import source

__all__ = [
    "CancelWatch",
    "EntryItem",
    "EventItem",
    "Item",
    "MergedItem",
    "Producer",
    "RetryPolicy",
    "Sent",
    "Subscriber",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Encoding = Literal["json", "msgpack"]

#: The correlation ids an entry may carry (contract section 3).
CORRELATION_IDS = frozenset(TURN_IDS + ENTRY_IDS)
#: The streams of a shard a :class:`Subscriber` can follow.
STREAMS = ("merged", "events", "dlq", "updates")
#: How long an auto-generated idempotency key lives: it only guards the built-in retry.
AUTO_IDEMPOTENCY_TTL = 600



# --------------------------------------------------------------------------- retries


@dataclass(frozen=True)
class RetryPolicy:
    """Retries after connection errors: exponential backoff with full jitter.

    The ``n``-th wait is uniform in ``[0, min(max_wait, initial * 2**n)]``; after
    ``attempts`` tries the last error is raised.
    """

    attempts: int = 6
    initial: float = 0.05
    max_wait: float = 2.0

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()``, calling it again after a transient Redis/network error."""
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_random_exponential(multiplier=self.initial, max=self.max_wait),
            retry=retry_if_exception_type(TRANSIENT),
            reraise=True,
        ):
            with attempt:
                return await call()
        raise AssertionError("unreachable: the last attempt returns or raises")


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True, slots=True)
class _Turn:
    """Who an entry belongs to: its ResponseId (or turn_id) and correlation ids."""

    response_id: str | None
    ids: dict[str, str]

    @property
    def routing_id(self) -> str:
        """What the shard is computed from: the response_id, else the turn_id."""
        return self.response_id or self.ids["turn_id"]

    def fields(self) -> list[str]:
        """The entry's identity fields, for XADD."""
        out = ["response_id", self.response_id] if self.response_id else []
        for name, value in self.ids.items():
            out += [name, value]
        return out


def _turn(
    response_id: str | None,
    attempt_id: str | None,
    turn_id: str | None,
    ids: Mapping[str, str] | None,
) -> _Turn:
    """Validate and combine an entry's ids (``attempt_id``/``turn_id`` may be in ``ids``)."""
    merged = dict(ids or {})
    unknown = sorted(set(merged) - CORRELATION_IDS)
    if unknown:
        raise ValueError(f"unknown correlation ids {unknown}; known: {sorted(CORRELATION_IDS)}")
    for name, value in (("attempt_id", attempt_id), ("turn_id", turn_id)):
        if value is not None and merged.setdefault(name, value) != value:
            raise ValueError(f"{name} is given twice with different values")
    for name, value in merged.items():
        if not isinstance(value, str):
            raise TypeError(f"correlation id {name!r} must be a str, not {type(value).__name__}")
    merged = {name: value for name, value in merged.items() if value}
    if not response_id and "turn_id" not in merged:
        raise ValueError("an entry needs a response_id or a turn_id")
    return _Turn(response_id or None, merged)


def encode_update(update: Any, enc: Encoding = "json") -> str | bytes:
    """The ``update`` field of an entry: an ``AgentResponseUpdate`` (``.to_dict()``) or a dict."""
    data = update.to_dict() if hasattr(update, "to_dict") else update
    if not isinstance(data, Mapping):
        raise TypeError(f"an update must be an AgentResponseUpdate or a dict, not {type(data)}")
    if enc == "json":
        return msgspec.json.encode(data).decode("utf-8")
    if enc == "msgpack":
        return msgspec.msgpack.encode(data)
    raise ValueError(f"unknown encoding {enc!r} (json or msgpack)")


def _update_body(update: Any, enc: Encoding) -> list[Any]:
    """The fields of a ``kind=update`` entry after its ids."""
    body: list[Any] = ["kind", "update", "update", encode_update(update, enc)]
    return body if enc == "json" else [*body, "enc", enc]


def _error_body(message: str, code: str | None) -> list[Any]:
    """The fields of a ``kind=error`` entry after its ids."""
    body = ["kind", "error", "error", message]
    return [*body, "code", code] if code else body


@dataclass(frozen=True, slots=True)
class Sent:
    """What :meth:`Producer.stream` wrote: first entry id, the final entry's id, update count."""

    first_id: str
    last_id: str
    updates: int


# --------------------------------------------------------------------------- producer


class Producer:
    """Writes input entries to ``{<ns>:<s>}:updates`` (contract section 3).

    Every entry goes to the shard of its ``response_id`` (or ``turn_id``) and is
    added with ``send_update.lua``: an idempotency key makes a retried send add
    the entry once. Without an ``idempotency_key`` one is made per call (and
    reused by the built-in retry); pass your own, unique per entry (say
    ``f"{response_id}:{n}"``), to make your own retries safe as well. Keys are
    kept ``idempotency_ttl`` seconds, per namespace and shard.
    """

    def __init__(
        self,
        client: Any,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = 1,
        *,
        idempotency_ttl: int = 86_400,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Use ``client`` (asyncio Redis or RedisCluster) for ``shards`` shards of ``namespace``."""
        self.client = client
        self.keys = Namespace(namespace, shards)
        self.idempotency_ttl = idempotency_ttl
        self.retry = retry or RetryPolicy()
        self._send_update = client.register_script(source("send_update"))

    async def send(
        self,
        response_id: str | None,
        update: Any,
        *,
        attempt_id: str | None = None,
        turn_id: str | None = None,
        ids: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        enc: Encoding = "json",
    ) -> str:
        """Add one update (``AgentResponseUpdate`` or dict) of a turn; returns its entry id.

        ``response_id`` may be ``None`` when ``turn_id`` is given (the processor
        then assigns the ResponseId). ``ids`` holds the other correlation ids
        (``session_id``, ``step_id``, ...). ``enc="msgpack"`` sends the update as msgpack.
        """
        turn = _turn(response_id, attempt_id, turn_id, ids)
        return await self._add(turn, _update_body(update, enc), idempotency_key)

    async def end(
        self,
        response_id: str | None,
        *,
        attempt_id: str | None = None,
        turn_id: str | None = None,
        ids: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Mark the turn finished normally (``kind=end``); returns the entry id."""
        turn = _turn(response_id, attempt_id, turn_id, ids)
        return await self._add(turn, ["kind", "end"], idempotency_key)

    async def error(
        self,
        response_id: str | None,
        message: str,
        code: str | None = None,
        *,
        attempt_id: str | None = None,
        turn_id: str | None = None,
        ids: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Report that the producer failed (``kind=error``); the turn ends as ``producer_error``."""
        turn = _turn(response_id, attempt_id, turn_id, ids)
        return await self._add(turn, _error_body(message, code), idempotency_key)

    async def stream(
        self,
        response_id: str | None,
        updates: AsyncIterable[Any],
        *,
        attempt_id: str | None = None,
        turn_id: str | None = None,
        ids: Mapping[str, str] | None = None,
        enc: Encoding = "json",
    ) -> Sent:
        """Send every update of ``updates``, then ``end``.

        If iterating ``updates`` raises an ``Exception``, an ``error`` entry
        (message ``"<Type>: <text>"``, code = the exception's type name) ends
        the turn instead and the exception is re-raised. Errors of Redis itself
        (after the retries) propagate as they are. To stop on cancellation, pass
        ``producer.watch(response_id, updates)`` as ``updates``.
        """
        turn = _turn(response_id, attempt_id, turn_id, ids)
        first, count = "", 0
        iterator = aiter(updates)
        while True:
            try:
                update = await anext(iterator)
            except StopAsyncIteration:
                break
            except Exception as exc:
                await self._add(
                    turn, _error_body(f"{type(exc).__name__}: {exc}", type(exc).__name__), None
                )
                raise
            entry = await self._add(turn, _update_body(update, enc), None)
            first, count = first or entry, count + 1
        last = await self._add(turn, ["kind", "end"], None)
        return Sent(first or last, last, count)

    async def cancel(
        self,
        response_id: str | None,
        reason: str = "cancelled",
        ttl: int = 3600,
        *,
        turn_id: str | None = None,
    ) -> None:
        """Cancel every attempt of a turn: SET ``{ns:s}:cancel:<response_id>`` for ``ttl`` s.

        For a turn sent with only a ``turn_id``, pass ``response_id=None, turn_id=...``.
        """
        key = self.cancel_key(response_id, turn_id=turn_id)
        await self.retry.run(lambda: self.client.set(key, reason, ex=ttl))

    async def cancelled(self, response_id: str | None, *, turn_id: str | None = None) -> bool:
        """True when the turn's cancellation key exists (one EXISTS)."""
        key = self.cancel_key(response_id, turn_id=turn_id)
        return bool(await self.retry.run(lambda: self.client.exists(key)))

    def watch(
        self,
        response_id: str | None,
        updates: AsyncIterable[T],
        poll_interval: float = 0.2,
        *,
        turn_id: str | None = None,
    ) -> CancelWatch[T]:
        """Iterate ``updates`` until the turn is cancelled, then ``aclose()`` them.

        The cancellation key is read at most once per ``poll_interval`` (and
        once at the start), also while the generator is waiting for its next
        update, which is interrupted when the key appears. See :class:`CancelWatch`.
        """
        key = self.cancel_key(response_id, turn_id=turn_id)
        return CancelWatch(self.client, key, updates, poll_interval)

    def cancel_key(self, response_id: str | None, *, turn_id: str | None = None) -> str:
        """The cancellation key of a turn (of the ResponseId assigned from ``turn_id``)."""
        if response_id:
            return self.keys.shard_for(response_id).cancel(response_id)
        if turn_id:
            return self.keys.shard_for(turn_id).cancel(response_id_for_turn(turn_id))
        raise ValueError("a response_id or a turn_id is needed")

    async def _add(self, turn: _Turn, body: list[Any], idempotency_key: str | None) -> str:
        """XADD ``turn`` + ``body`` idempotently to the turn's shard, with retries."""
        shard = self.keys.shard_for(turn.routing_id)
        ttl = self.idempotency_ttl if idempotency_key else AUTO_IDEMPOTENCY_TTL
        keys = [shard.updates, shard.idem(idempotency_key or uuid.uuid4().hex)]
        args = [ttl, *turn.fields(), *body]
        return as_text(await self.retry.run(lambda: self._send_update(keys=keys, args=args)))


# --------------------------------------------------------------------------- watch


async def _next(iterator: AsyncIterator[T]) -> T:
    """``anext`` as a coroutine, so a Task can run it."""
    return await anext(iterator)


class CancelWatch(Generic[T]):
    """An async iterator over ``updates`` that ends when a cancellation key appears.

    It reads the key at most once per poll interval while it is iterated (no
    background task outlives it). When the key is seen, the pending ``anext``
    of the source is cancelled, the source is ``aclose()``-d, the iteration
    ends, and :attr:`reason` holds the key's value. Use ``async with`` (or
    :meth:`aclose`) when you may stop iterating early.
    """

    def __init__(self, client: Any, key: str, updates: AsyncIterable[T], poll_interval: float):
        """Watch ``key`` on ``client`` while iterating ``updates``."""
        self._client = client
        self._key = key
        self._source = updates
        self._iterator = aiter(updates)
        self._interval = poll_interval
        self._next_poll = 0.0
        self._closed = False
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        """True once the cancellation key was seen."""
        return self.reason is not None

    def __aiter__(self) -> CancelWatch[T]:
        """The watch itself."""
        return self

    async def __anext__(self) -> T:
        """The next update, or ``StopAsyncIteration`` when exhausted or cancelled."""
        if self._closed:
            raise StopAsyncIteration
        step = asyncio.ensure_future(_next(self._iterator))
        try:
            while not await self._step_done(step):
                if await self._poll():
                    await self._stop(step)
                    raise StopAsyncIteration
        except asyncio.CancelledError:
            step.cancel()
            raise
        return step.result()

    async def _step_done(self, step: asyncio.Future[T]) -> bool:
        """Wait for ``step`` until the next poll is due; True when it finished first."""
        delay = self._next_poll - asyncio.get_running_loop().time()
        if delay <= 0:
            return False
        done, _ = await asyncio.wait({step}, timeout=delay)
        return bool(done)

    async def _poll(self) -> bool:
        """Read the key once (a transient error counts as "not cancelled")."""
        self._next_poll = asyncio.get_running_loop().time() + self._interval
        try:
            value = await self._client.get(self._key)
        except TRANSIENT as exc:
            log.warning("could not read the cancellation key %s: %s", self._key, exc)
            return False
        if value is None:
            return False
        self.reason = as_text(value)
        return True

    async def _stop(self, step: asyncio.Future[T]) -> None:
        """Interrupt the pending ``anext`` and close the source."""
        step.cancel()
        await asyncio.wait({step})
        if not step.cancelled():
            step.exception()  # retrieved: it is superseded by the cancellation
        await self.aclose()

    async def aclose(self) -> None:
        """Stop iterating and ``aclose()`` the source (when it has one)."""
        if self._closed:
            return
        self._closed = True
        close = getattr(self._source, "aclose", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> CancelWatch[T]:
        """``async with producer.watch(...) as updates``: closed on exit."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close on exit."""
        await self.aclose()


# --------------------------------------------------------------------------- items


@dataclass(frozen=True, slots=True)
class MergedItem:
    """An entry of a ``merged`` stream: one finished turn (contract 5.1)."""

    stream: str
    id: str
    response_id: str
    status: str
    response: dict[str, Any]
    meta: dict[str, Any]
    synthesis_id: str = ""
    attempt_id: str = ""

    def agent_response(self) -> Any:
        """The response as an ``agent_framework.AgentResponse`` (needs agent-framework)."""
        from agent_framework import AgentResponse

        return AgentResponse.from_dict(self.response)


@dataclass(frozen=True, slots=True)
class EventItem:
    """An entry of an ``events`` stream (contract 5.2); ``event`` is the decoded JSON."""

    stream: str
    id: str
    event: dict[str, Any]

    @property
    def type(self) -> str:
        """``synthesis.started``, ``synthesis.chunk``, ``step`` or ``synthesis``."""
        return str(self.event.get("type", ""))

    @property
    def response_id(self) -> str:
        """The turn's ResponseId."""
        return str(self.event.get("response_id", ""))

    @property
    def synthesis_id(self) -> str:
        """The turn's synthesis id."""
        return str(self.event.get("synthesis_id", ""))


@dataclass(frozen=True, slots=True)
class EntryItem:
    """An entry of another stream (``dlq``, ``updates``): its fields as text."""

    stream: str
    id: str
    fields: dict[str, str]


Item = MergedItem | EventItem | EntryItem


def _decode_item(stream: str, kind: str, entry_id: str, raw: Mapping[Any, Any]) -> Item:
    """A typed item from one stream entry."""
    fields = {as_text(k): v for k, v in raw.items()}
    if kind == "merged":
        return MergedItem(
            stream,
            entry_id,
            as_text(fields["response_id"]),
            as_text(fields["status"]),
            json.loads(fields["response"]),
            json.loads(fields["meta"]),
            as_text(fields.get("synthesis_id", "")),
            as_text(fields.get("attempt_id", "")),
        )
    if kind == "events":
        return EventItem(stream, entry_id, json.loads(fields["event"]))
    return EntryItem(stream, entry_id, {k: as_text(v) for k, v in fields.items()})


def _xread_entries(reply: Any) -> list[tuple[str, list[Any]]]:
    """``(stream, [(id, fields), ...])`` pairs from an XREAD reply (RESP2 or RESP3)."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else reply
    out = []
    for name, entries in pairs:
        nested = (
            entries
            and isinstance(entries[0], list)
            and entries[0]
            and isinstance(entries[0][0], list | tuple)
        )
        out.append((as_text(name), entries[0] if nested else entries))
    return out


def _ms(entry_id: str) -> int:
    """The millisecond part of a stream entry id."""
    return int(entry_id.partition("-")[0])


# --------------------------------------------------------------------------- subscriber


class Subscriber:
    """Follows the output streams of every shard: ``async for item in subscriber``.

    Items are :class:`MergedItem`, :class:`EventItem` (or :class:`EntryItem`
    for ``dlq``/``updates``), in entry id order within each stream (a batch
    read across streams is ordered by entry time). :attr:`positions` maps each
    stream key (``{ns:s}:merged``, ...) to the id of the last item delivered;
    pass it as ``from_positions`` to resume without repeats. ``start`` is where
    streams without a position begin: ``"0-0"`` (all retained entries) or
    ``"$"`` (only entries added after the first read).

    On a single node one ``XREAD BLOCK`` covers all shards; on a Redis Cluster
    (``RedisCluster`` client) each shard has its own blocking XREAD in flight.
    """

    def __init__(
        self,
        client: Any,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = 1,
        streams: Iterable[str] = ("merged", "events"),
        *,
        from_positions: Mapping[str, str] | None = None,
        start: str = "0-0",
        shard_indexes: Iterable[int] | None = None,
        block_ms: int = 1000,
        count: int = 100,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Follow ``streams`` of ``shards`` shards (or only ``shard_indexes``) of ``namespace``."""
        self.client = client
        self.keys = Namespace(namespace, shards)
        self.streams = tuple(streams)
        unknown = set(self.streams) - set(STREAMS)
        if unknown:
            raise ValueError(f"unknown streams {sorted(unknown)}; known: {list(STREAMS)}")
        self.block_ms = block_ms
        self.count = count
        self.retry = retry or RetryPolicy()
        indexes = range(shards) if shard_indexes is None else sorted(set(shard_indexes))
        self._groups = [self._stream_keys(self.keys.shard(i)) for i in indexes]
        self._kinds = {key: kind for group in self._groups for key, kind in group.items()}
        self.positions: dict[str, str] = {key: start for key in self._kinds}
        self.positions.update((k, v) for k, v in (from_positions or {}).items() if k in self._kinds)
        self._cluster = isinstance(client, RedisCluster)
        self._pending: dict[int, asyncio.Task[list[tuple[str, list[Any]]]]] = {}
        self._buffer: deque[Item] = deque()
        self._stopped = False

    def _stream_keys(self, shard: Shard) -> dict[str, str]:
        """Stream key -> kind, for the followed streams of one shard."""
        return {getattr(shard, kind): kind for kind in self.streams}

    def __aiter__(self) -> Subscriber:
        """The subscriber itself."""
        return self

    async def __anext__(self) -> Item:
        """The next item (waits for one); ends after :meth:`stop` or :meth:`aclose`."""
        while not self._buffer:
            if self._stopped:
                raise StopAsyncIteration
            self._buffer.extend(await self._read_batch(self.block_ms))
        if self._stopped:
            raise StopAsyncIteration
        item = self._buffer.popleft()
        self.positions[item.stream] = item.id
        return item

    async def read(self, block_ms: int | None = None) -> list[Item]:
        """One batch of new items (waiting up to ``block_ms`` for any); advances positions."""
        items = self._take_buffer() or await self._read_batch(block_ms)
        for item in items:
            self.positions[item.stream] = item.id
        return items

    def _take_buffer(self) -> list[Item]:
        items = list(self._buffer)
        self._buffer.clear()
        return items

    async def wait_for(
        self,
        response_id: str | None,
        timeout: float = 30.0,
        *,
        attempt_id: str | None = None,
        turn_id: str | None = None,
        since: str = "0-0",
    ) -> MergedItem:
        """The merged item of one turn, waiting up to ``timeout`` s (``TimeoutError``).

        ``response_id`` may also be a synthesis id (``<rid>[:<attempt>]:synthesis``),
        or ``None`` with the ``turn_id`` of a turn sent without a ResponseId.
        With a plain ``response_id`` the first merged entry of any attempt
        matches, unless ``attempt_id`` is given. Only the turn's shard is read,
        from ``since``: the default scans the retained ``merged`` history, so
        pass an entry id written before the turn ended (e.g. the id
        :meth:`Producer.send` returned) or ``"$"`` (only new entries) to skip it.
        Independent of this subscriber's own positions.
        """
        target = response_id or response_id_for_turn(_required(turn_id))
        probe = Subscriber(
            self.client,
            self.keys.name,
            self.keys.shards,
            ("merged",),
            start=since,
            shard_indexes=self._shards_of(response_id, turn_id),
            block_ms=self.block_ms,
            count=self.count,
            retry=self.retry,
        )
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            return await probe._find(target, attempt_id, deadline)
        finally:
            await probe.aclose()

    async def _find(self, target: str, attempt_id: str | None, deadline: float) -> MergedItem:
        """Read until a merged item of ``target`` comes, or ``TimeoutError`` at ``deadline``."""
        loop = asyncio.get_running_loop()
        while (left_ms := int((deadline - loop.time()) * 1000)) > 0:
            for item in await self.read(min(left_ms, self.block_ms)):
                if isinstance(item, MergedItem) and _matches(item, target, attempt_id):
                    return item
        raise TimeoutError(f"no merged response for {target!r} within the timeout")

    def _shards_of(self, response_id: str | None, turn_id: str | None) -> set[int]:
        """The shards a turn's merged entry may be on (a synthesis id is ambiguous)."""
        candidates = {turn_id} if turn_id else set()
        if response_id:
            candidates.add(response_id)
            if response_id.endswith(":synthesis"):
                base = response_id.removesuffix(":synthesis")
                candidates |= {base, base.rpartition(":")[0] or base}
        return {shard_of(c, self.keys.shards) for c in candidates}

    def stop(self) -> None:
        """End the iteration (after the read in progress); positions stay valid."""
        self._stopped = True

    async def aclose(self) -> None:
        """Stop, and cancel the reads still in flight (Cluster)."""
        self.stop()
        pending = list(self._pending.values())
        self._pending.clear()
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def __aenter__(self) -> Subscriber:
        """``async with Subscriber(...) as sub``: :meth:`aclose` on exit."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close on exit."""
        await self.aclose()

    async def _read_batch(self, block_ms: int | None) -> list[Item]:
        """Read the next entries after the positions (not advancing them), in time order."""
        await self._resolve_latest()
        fetch = self._fetch_cluster if self._cluster else self._fetch_single
        batches = await self.retry.run(lambda: fetch(block_ms))
        items = [
            _decode_item(stream, self._kinds[stream], as_text(entry_id), fields)
            for stream, entries in batches
            for entry_id, fields in entries
        ]
        items.sort(key=lambda item: _ms(item.id))
        return items

    async def _resolve_latest(self) -> None:
        """Replace ``"$"`` positions by the streams' current last ids (once)."""
        for key, position in self.positions.items():
            if position == "$":
                last = await self.retry.run(lambda key=key: self.client.xrevrange(key, count=1))
                self.positions[key] = as_text(last[0][0]) if last else "0-0"

    async def _fetch_single(self, block_ms: int | None) -> list[tuple[str, list[Any]]]:
        """One XREAD over every followed stream."""
        return await self._xread(dict(self.positions), block_ms)

    async def _fetch_cluster(self, block_ms: int | None) -> list[tuple[str, list[Any]]]:
        """Keep one XREAD per shard in flight; return what the finished ones read."""
        for index, group in enumerate(self._groups):
            if index not in self._pending:
                streams = {key: self.positions[key] for key in group}
                self._pending[index] = asyncio.ensure_future(self._xread(streams, block_ms))
        await asyncio.wait(self._pending.values(), return_when=asyncio.FIRST_COMPLETED)
        done = [i for i, task in self._pending.items() if task.done()]
        results = [self._pending.pop(i) for i in done]
        errors = [error for task in results if (error := task.exception()) is not None]
        if errors:
            raise errors[0]
        return [pair for task in results for pair in task.result()]

    async def _xread(self, streams: dict[str, str], block_ms: int | None) -> list[Any]:
        """One XREAD of ``streams`` (key -> last id)."""
        reply = await self.client.xread(streams, count=self.count, block=block_ms)
        return _xread_entries(reply)


def _required(turn_id: str | None) -> str:
    """``turn_id``, which is needed when no response id is given."""
    if not turn_id:
        raise ValueError("a response_id (or synthesis id) or a turn_id is needed")
    return turn_id


def _matches(item: MergedItem, target: str, attempt_id: str | None) -> bool:
    """Whether ``item`` is the merged entry of ``target`` (a response or synthesis id)."""
    if target == item.synthesis_id:
        return True
    return target == item.response_id and attempt_id in (None, item.attempt_id)

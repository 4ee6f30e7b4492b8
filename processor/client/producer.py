"""The producer side of the wire contract: input entries and cancellation keys.

``Producer`` writes input entries (docs/contract.md §3) to the right shard,
idempotently and with retries; it also sets and reads cancellation keys
(section 6) so a generator can stop when its turn is cancelled.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ResponseError

from processor.client.entries import (
    Encoding,
    Sent,
    TurnIds,
    TurnNumbers,
    check_number,
    error_body,
    turn_ids,
    update_body,
)
from processor.client.errors import CancelNotTaken, TurnEnded
from processor.client.retry import RetryPolicy
from processor.client.watch import CancelWatch
from processor.redis_io.replies import as_text
from processor.scripts.library import Function, LibraryNotLoaded
from processor.scripts.meta import require
from processor.wire.cancels import DEFAULT_REASON, DEFAULT_TTL, check_reason, check_ttl
from processor.wire.ids import MAX_ID_LENGTH, response_id_for_turn
from processor.wire.keys import DEFAULT_NAMESPACE, Namespace

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

T = TypeVar("T")

#: How long an auto-generated idempotency key lives: it only guards the built-in retry.
AUTO_IDEMPOTENCY_TTL = 600
#: A cancel asked of the workers (``Producer.cancel``): how long to wait for
#: its key by default, how often to look (the first pause, doubling up to the
#: second: a worker usually sets it within a few ms), how often to ask again,
#: and how many asks in a row that reached no worker restart the looks from
#: the first pause. A request that reached a worker may still be lost: Redis
#: counts a subscriber whose subscription it is closing (a message past the
#: Pub/Sub output limit, docs/security.md), and during a flood of such
#: messages a fifth to a quarter of the requests that reached one were lost
#: (15 of 63 in two runs); asked every 0.1 s rather than 0.25 s, a cancel
#: has about twice as many chances in its wait (at 0.25 s the flood test
#: now and then lost one of its 8 cancels under load).
CANCEL_WAIT_S = 5.0
CANCEL_POLL_S = (0.002, 0.05)
CANCEL_ASK_EVERY_S = 0.1
CANCEL_QUICK_ASKS = 4


class Producer:
    """Writes input entries to ``{<ns>:<s>}:updates`` (docs/contract.md §3).

    Every entry goes to the shard of its ``response_id`` (or ``turn_id``) and is
    added by the Redis Function of ``send_update.lua`` (``processor.scripts.library``;
    EVALSHA of the same file on Redis 6.2): an idempotency key makes a retried
    send add the entry once. Without an ``idempotency_key`` one is made per call (and
    reused by the built-in retry); pass your own, unique per entry (say
    ``f"{response_id}:{n}"``), to make your own retries safe as well. Keys are
    kept ``idempotency_ttl`` seconds, per namespace and shard.

    The namespace's shard count comes from its record in Redis
    (``processor.scripts.meta``), read once by the first call that needs it:
    ``NotInitialised`` when no worker or ``processor
    init`` created it yet (nothing is sent; a later call reads again). Give
    ``shards`` only to check it: a different count raises
    ``Mismatch``.

    ``inbox=True`` sends through the shard's inbox instead (``send_inbox.lua``):
    the entry is pushed to ``{<ns>:<s>}:inbox`` and a worker moves it into the
    stream at once, in order, where it gets its id. That path needs no
    ``XADD`` right, so it is the one for the least-privilege ``producer`` ACL
    user, which cannot choose entry ids or trim the stream (docs/security.md);
    the default path needs ``producer-trusted``. In inbox mode the sends return
    a receipt instead of the entry id: ``"<ms>-0"``, 1 ms before Redis's clock
    at the push, an id below any the entry's turn can be published with, so
    it works as ``Subscriber.wait_for``'s ``since`` as an entry id does.

    **Numbered entries** (docs/contract.md §3.4). Each entry of a turn (per
    attempt) carries its number in the field ``n``: 0 for the turn's first
    entry this producer sends, one more for each next one, its ``end`` or
    ``error`` included (which forget the turn's counter). A worker that
    finds a number missing (an entry lost with Redis's data, trimmed or
    deleted before it was read) ends the turn ``error`` ``entries_lost``,
    never ``completed``, and drops a repeated number (a send that got
    through twice). The built-in retry resends the same number, and a send
    repeated with an idempotency key used before gets the number that key
    got. A send that Redis refused (``TurnEnded``, a missing library, an
    error reply) gives its number back; one whose outcome is unknown (the
    retries gave up on a connection error) has used it: if it did not reach
    Redis the turn is missing it (``entries_lost``, not a silent
    ``completed``) unless it is sent again with the same idempotency key.
    So one attempt's entries must come from one ``Producer``, in order: a
    turn sent from several producers (processes) passes its own numbers
    (``n=``, counting on from the last one given) or uses
    ``numbered=False`` (no ``n`` field: the check is off).
    """

    def __init__(
        self,
        client: RedisClient,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int | None = None,
        *,
        idempotency_ttl: int = 86_400,
        retry: RetryPolicy | None = None,
        shards_from: str = "shards=",
        inbox: bool = False,
        numbered: bool = True,
    ) -> None:
        """Use ``client`` (asyncio Redis or RedisCluster) for ``namespace``
        (``shards``, if given, is checked against its record; ``shards_from``
        names where it came from in that error); ``inbox=True``: send through
        the shards' inboxes; ``numbered=False``: send no entry numbers."""
        self.client = client
        self.namespace = namespace
        self.idempotency_ttl = idempotency_ttl
        self.retry = retry or RetryPolicy()
        self._shards, self._shards_from = shards, shards_from
        self._keys: Namespace | None = None
        self.inbox = inbox
        self.numbered = numbered
        # The number of each open turn's next entry (an attempt's, from 0).
        self._numbers = TurnNumbers()
        self._send_update = Function(client, "send_inbox" if inbox else "send_update")
        self._cancel_turn = Function(client, "cancel_turn")

    @property
    def keys(self) -> Namespace:
        """The namespace's key names, once its record was read (``ready``)."""
        if self._keys is None:
            raise RuntimeError("the namespace's record has not been read yet: "
                               "await producer.ready() first")
        return self._keys

    async def ready(self) -> Namespace:
        """The namespace's key names, reading its record the first time
        (``NotInitialised``,
        ``Mismatch``)."""
        if self._keys is None:
            meta = await self.retry.run(
                lambda: require(self.client, self.namespace, self._shards, self._shards_from))
            self._keys = meta.keys
        return self._keys

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
        n: int | None = None,
    ) -> str:
        """Add one update (``AgentResponseUpdate`` or dict) of a turn; returns its
        entry id (with ``inbox=True``, a receipt: see ``Producer``).

        ``response_id`` may be ``None`` when ``turn_id`` is given (the processor
        then assigns the ResponseId). ``ids`` holds the other correlation ids
        (``session_id``, ``step_id``, ...). ``enc="msgpack"`` sends the update as msgpack.
        ``n``: the entry's number in its turn, when the caller numbers them
        (by default the producer does: see ``Producer``).
        """
        turn = turn_ids(response_id, attempt_id, turn_id, ids)
        return await self._add(turn, update_body(update, enc), idempotency_key, n)

    async def end(
        self,
        response_id: str | None,
        *,
        attempt_id: str | None = None,
        turn_id: str | None = None,
        ids: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        n: int | None = None,
    ) -> str:
        """Mark the turn finished normally (``kind=end``); returns the entry id."""
        turn = turn_ids(response_id, attempt_id, turn_id, ids)
        return await self._add(turn, ["kind", "end"], idempotency_key, n, last=True)

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
        n: int | None = None,
    ) -> str:
        """Report that the producer failed (``kind=error``); the turn ends as ``producer_error``."""
        turn = turn_ids(response_id, attempt_id, turn_id, ids)
        return await self._add(turn, error_body(message, code), idempotency_key, n, last=True)

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
        turn = turn_ids(response_id, attempt_id, turn_id, ids)
        first, count = "", 0
        iterator = aiter(updates)
        while True:
            try:
                update = await anext(iterator)
            except StopAsyncIteration:
                break
            except Exception as exc:
                await self._add(
                    turn, error_body(f"{type(exc).__name__}: {exc}", type(exc).__name__), None,
                    last=True)
                raise
            entry = await self._add(turn, update_body(update, enc), None)
            first, count = first or entry, count + 1
        last = await self._add(turn, ["kind", "end"], None, last=True)
        return Sent(first or last, last, count)

    async def cancel(
        self,
        response_id: str | None,
        reason: str = DEFAULT_REASON,
        ttl: int = DEFAULT_TTL,
        *,
        turn_id: str | None = None,
        wait: float = CANCEL_WAIT_S,
    ) -> str:
        """Cancel every attempt of a turn: set ``{ns:s}:cancel:<response_id>``
        to ``reason`` (1 to 1024 bytes of UTF-8) for ``ttl`` seconds (1 to
        86,400), with the Redis Function of ``cancel_turn.lua``. A cancel
        already there is never shortened or replaced: its reason stays, its
        TTL becomes the longer of the two. Returns ``"set"`` or ``"kept"``.

        A client whose Redis user may not set cancel keys (the shipped
        ``serve`` and ``producer`` users: docs/security.md) has the function
        ask the workers, and waits up to ``wait`` seconds until the key
        exists (returns ``"asked"``); ``CancelNotTaken`` if no worker set
        it by then. ``ValueError`` for a reason or TTL out of bounds (nothing
        sent); ``LibraryNotLoaded`` before any worker or ``processor
        init`` loaded the function library.

        For a turn sent with only a ``turn_id``, pass ``response_id=None, turn_id=...``.
        """
        check_reason(reason)
        check_ttl(ttl)
        keys = await self.ready()
        key = self.cancel_key(response_id, turn_id=turn_id)
        args = [reason, ttl, keys.cancels]
        reply = await self.retry.run(lambda: self._cancel_turn(keys=[key], args=args))
        if as_text(reply[0]) != "asked":
            return as_text(reply[0])
        deadline = time.monotonic() + wait
        asked, reached, pause = time.monotonic(), int(reply[1]), CANCEL_POLL_S[0]
        unreached = 1 if reached == 0 else 0  # asks in a row that reached no worker
        while not await self.retry.run(lambda: self.client.exists(key)):
            now = time.monotonic()
            if now >= deadline:
                raise CancelNotTaken(key, wait)
            # Asked again while no worker has set the key: a request reaches
            # only the workers subscribed at that moment, and one may be
            # between two subscriptions (docs/security.md, the cancel channel).
            # A request that reached no worker is asked again at the next look,
            # the first few times with the looks restarted from the shortest
            # pause: a worker that lost its subscription takes a few ms to
            # subscribe again (with no worker at all, the looks slow down).
            if reached == 0 or now - asked >= CANCEL_ASK_EVERY_S:
                reply = await self.retry.run(lambda: self._cancel_turn(keys=[key], args=args))
                asked, reached = now, int(reply[1]) if as_text(reply[0]) == "asked" else 1
                unreached = unreached + 1 if reached == 0 else 0
                if 0 < unreached <= CANCEL_QUICK_ASKS:
                    pause = CANCEL_POLL_S[0]
            await asyncio.sleep(min(pause, max(0.0, deadline - now)))
            pause = min(pause * 2, CANCEL_POLL_S[1])
        return "asked"

    async def cancelled(self, response_id: str | None, *, turn_id: str | None = None) -> bool:
        """True when the turn's cancellation key exists (one EXISTS)."""
        await self.ready()
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
        update, which is interrupted when the key appears. See ``CancelWatch``.
        """
        if not (response_id or turn_id):
            raise ValueError("a response_id or a turn_id is needed")

        async def key() -> str:
            await self.ready()
            return self.cancel_key(response_id, turn_id=turn_id)

        return CancelWatch(self.client, key, updates, poll_interval)

    def cancel_key(self, response_id: str | None, *, turn_id: str | None = None) -> str:
        """The cancellation key of a turn (of the ResponseId assigned from
        ``turn_id``), once the namespace's record was read (``ready``).
        ``ValueError`` for an id over 512 characters (docs/contract.md §3.2)."""
        for given in (response_id, turn_id):
            if given and len(given) > MAX_ID_LENGTH:
                raise ValueError(f"a turn's id is at most {MAX_ID_LENGTH} characters "
                                 f"(docs/contract.md §3.2), not {len(given)}")
        if response_id:
            return self.keys.shard_for(response_id).cancel(response_id)
        if turn_id:
            return self.keys.shard_for(turn_id).cancel(response_id_for_turn(turn_id))
        raise ValueError("a response_id or a turn_id is needed")

    async def _add(self, turn: TurnIds, body: list[Any], idempotency_key: str | None,
                   n: int | None = None, *, last: bool = False) -> str:
        """XADD ``turn`` + ``body`` idempotently to the turn's shard (or push it to
        the shard's inbox), with retries; ``TurnEnded`` when the turn has
        ended (the same call checks it). Numbered (``n``, else the turn's
        next number) unless the producer is not; ``last``: the turn's end
        or error, after which its counter is forgotten."""
        shard = (self._keys or await self.ready()).shard_for(turn.routing_id)
        ttl = self.idempotency_ttl if idempotency_key else AUTO_IDEMPOTENCY_TTL
        to = [shard.inbox, shard.inbox_bell] if self.inbox else [shard.updates]
        key = turn.turn_key()
        keys = [*to, shard.idem(idempotency_key or uuid.uuid4().hex), shard.done(key.encode())]
        if n is not None:
            check_number(n)
        # The entry's number (docs/contract.md §3.4), counted as used now: the
        # built-in retry resends it; it is free again only if Redis refused
        # the send (nothing added), never after an outcome left unknown.
        taken = (self._numbers.take(key, n, idempotency_key, last)
                 if self.numbered or n is not None else None)
        number = [] if taken is None else ["n", str(taken.number)]
        args = [ttl, *turn.fields(), *number, *body]
        try:
            reply = await self.retry.run(lambda: self._send_update(keys=keys, args=args))
        except (ResponseError, LibraryNotLoaded) as exc:
            if taken is not None:
                self._numbers.refused(taken)
            code, _, status = str(exc).partition(" ")
            if code == "TURNENDED":
                self._numbers.forget(key)
                raise TurnEnded(turn.label(), status.split()[0] if status else "?") from None
            raise
        return as_text(reply)

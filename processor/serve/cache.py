"""A short-lived per-turn cache in front of a ``TurnSource``.

Without it every join, resume and GET reads the turn's past from Redis
again: resuming a finished turn from seq 0 in a loop read back up to
10,000 entries (about 21 MB) per request, and a join of a running turn
with 20,000 updates of 1 KB re-read and re-merged 20 MB each time. With
it, repeated requests for one turn cost Redis about one read of it per
``ttl`` seconds per replica, whoever makes them:

- **Finished turns** do not change: their state and outputs (merged entry,
  terminal event and the events a resume after seq N missed) are kept
  ``ttl`` s. A resume after N' >= N is answered from a read made for N.
- **Running turns**: a stream subscribes to the live feed *before* it reads
  the past, so that nothing falls between the two; a snapshot or history
  read before a client subscribed is exact for it only if the turn has
  published nothing since that read began. Each cached read keeps a watch
  (a hub subscription made before the read): while it is quiet, the read
  is answered again, to a request that came while it was in flight too
  (anything published after the read began would have reached the watch,
  and reaches the request's own subscription later), and kept until
  unused for ``ttl`` s. A history read goes on being answered as the turn
  moves on: its watch keeps what the turn publishes (up to ``tail``
  events), and a resume gets the read followed by those. A snapshot cannot
  be moved on so: once the turn moves on, the next fresh join waits for a
  new read, started after it came.
- **Reads are shared and spaced**: requests that need a new read of one
  turn wait for the same one; after ``READ_BURST`` reads back to back,
  the next starts no sooner than ``ttl`` s after the one before (so a
  client looping on a busy turn waits up to ``ttl`` s, and Redis sees
  about one read of it per ``ttl``).

The state of a turn that is not finished is read for each request (three
one-field reads): it decides whether the past must be read at all, and
only a state read after the client subscribed is exact for it.

Every Redis call of the inner source holds a slot of the replica's
``RedisGate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from processor.client.source import Final, History, TurnSource, TurnState
from processor.client.turns import Item, LiveEvent, Snapshot, TurnRef
from processor.serve.gate import RedisGate
from processor.serve.hub import Hub, Subscription
from processor.serve.metrics import ServeMetrics

T = TypeVar("T")
#: Reads of one kind of one turn that may start back to back (then one per
#: ``ttl``): a few viewers joining a busy turn at once are not kept waiting,
#: a client looping on it costs about one read per ``ttl``.
READ_BURST = 3.0
Kind = Literal["state", "final", "snapshot", "history"]


@dataclass(eq=False)
class _Pending(Generic[T]):
    """A read not started yet: whoever asks before it starts shares it."""

    future: asyncio.Future[T]
    after: int | None = None  # (final) the lowest seq a resume asked from


@dataclass(eq=False)
class _Slot(Generic[T]):
    """One kind of read of one turn: its last result and the next read."""

    value: T | None = None
    after: int | None = None  # (final) the seq its read looked back to
    started: float = float("-inf")  # when the read that gave ``value`` began
    used: float = float("-inf")  # when it was last answered from
    watch: Subscription | None = None  # (running turns) made before that read
    pending: _Pending[T] | None = None
    running: asyncio.Future[T] | None = None  # the read in flight
    last_start: float = float("-inf")  # of the newest read
    credit: float = READ_BURST  # reads it may start now (one more every ttl)
    refilled: float = float("-inf")  # when ``credit`` was last topped up


@dataclass(eq=False)
class TurnCache:
    """``TurnSource``: ``inner``'s answers, shared and kept (module doc)."""

    inner: TurnSource
    hub: Hub
    gate: RedisGate
    metrics: ServeMetrics
    ttl: float
    tail: int = 1000  # events a history read is followed by before it is read again
    clock: Callable[[], float] = time.monotonic
    _slots: dict[tuple[TurnRef, Kind], _Slot[object]] = field(default_factory=dict)
    _swept: float = float("-inf")
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def state(self, turn: TurnRef) -> TurnState:
        slot: _Slot[TurnState] = self._slot(turn, "state")
        if slot.value is not None and self._fresh(slot):
            self.metrics.cache.labels("hit").inc()
            return slot.value
        self.metrics.cache.labels("read").inc()
        started = self.clock()
        async with self.gate.slot():
            state = await self.inner.state(turn)
        if state.phase == "finished":  # (it stays so: kept)
            slot.value, slot.started, slot.used = state, started, started
        return state

    async def final(self, turn: TurnRef, after: int | None = None) -> Final:
        slot: _Slot[Final] = self._slot(turn, "final")
        found = await self._get(turn, "final", slot, lambda a: self.inner.final(turn, a),
                                lambda: self._fresh(slot) and _covers(slot.after, after), after)
        return _trimmed(found, after)

    async def snapshot(self, turn: TurnRef) -> Snapshot | None:
        slot: _Slot[Snapshot | None] = self._slot(turn, "snapshot")
        return await self._get(turn, "snapshot", slot, lambda _: self.inner.snapshot(turn),
                               lambda: self._unchanged(slot), None, watch=1)

    async def history(self, turn: TurnRef, after: int) -> History:
        slot: _Slot[History] = self._slot(turn, "history")
        whole = await self._get(turn, "history", slot, lambda _: self.inner.history(turn, -1),
                                lambda: self._followed(slot), None, watch=self.tail)
        # The watch made before the read that gave ``whole`` has what came since
        # (a read another request started since has a watch of its own).
        if whole is slot.value and slot.watch is not None and not slot.watch.over:
            whole = _followed_by(whole, slot.watch.held())
        return _after(whole, after)

    # ----------------------------------------------------------------- shared reads

    def _slot(self, turn: TurnRef, kind: Kind) -> _Slot[T]:
        self._sweep()
        slot = self._slots.get((turn, kind))
        if slot is None:
            slot = self._slots[(turn, kind)] = _Slot()
        return slot  # type: ignore[return-value]

    def _fresh(self, slot: _Slot[T]) -> bool:
        return self.clock() - slot.started < self.ttl

    def _followed(self, slot: _Slot[T]) -> bool:
        """A running turn's history read is still exact with what its watch
        has had since (nothing lost: the watch did not overflow)."""
        return slot.watch is not None and not slot.watch.over

    def _unchanged(self, slot: _Slot[T]) -> bool:
        """A running turn's read is still exact: nothing published since it
        began (however long ago: it is forgotten once unused for ``ttl``)."""
        return slot.watch is not None and slot.watch.quiet

    async def _get(self, turn: TurnRef, kind: Kind, slot: _Slot[T],
                   read: Callable[[int | None], Awaitable[T]], fits: Callable[[], bool],
                   after: int | None, watch: int = 0) -> T:
        """The kept value while it ``fits``; else, after the read in flight
        (if its value fits, that), the next read: one not started yet,
        shared with whoever else asks before it starts."""
        while True:
            if slot.started > float("-inf") and fits():
                slot.used = self.clock()
                self.metrics.cache.labels("hit").inc()
                return slot.value  # type: ignore[return-value]
            if slot.pending is not None or slot.running is None:
                break
            with contextlib.suppress(Exception):  # (its own callers see its error)
                await asyncio.shield(slot.running)
            if self._slots.get((turn, kind)) is not slot:
                break  # swept meanwhile
        pending = slot.pending
        if pending is not None:
            self.metrics.cache.labels("shared").inc()
            pending.after = _lowest(pending.after, after)
        else:
            self.metrics.cache.labels("read").inc()
            pending = slot.pending = _Pending(asyncio.get_running_loop().create_future(), after)
            task = asyncio.create_task(self._read((turn, kind), slot, pending, read,
                                                  watch if self.ttl > 0 else 0))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # Shielded: a caller that goes away leaves the read to the others.
        return await asyncio.shield(pending.future)

    async def _read(self, key: tuple[TurnRef, Kind], slot: _Slot[T], pending: _Pending[T],
                    read: Callable[[int | None], Awaitable[T]], watch: int) -> None:
        """``watch``: the capacity of the hub subscription that follows the
        turn from just before the read (0: none)."""
        if self.ttl > 0:  # a read spends a credit; a credit comes back every ttl
            now = self.clock()
            slot.credit = min(READ_BURST, slot.credit + (now - slot.refilled) / self.ttl)
            slot.refilled = now
            if slot.credit < 1:
                await asyncio.sleep((1 - slot.credit) * self.ttl)
                slot.credit, slot.refilled = 1.0, self.clock()
            slot.credit -= 1
        subscription = None
        if watch and self.hub.positioned:  # (else not kept: nothing to watch it with)
            subscription = await self.hub.subscribe(key[0], watch)
        slot.pending = None  # who asks from now on asked after this read began
        slot.running = pending.future
        started = slot.last_start = self.clock()
        try:
            async with self.gate.slot():
                self.metrics.redis_calls.labels(key[1]).inc()
                value = await read(pending.after)
        except BaseException as exc:
            if subscription is not None:
                self.hub.unsubscribe(subscription)
            slot.running = None
            pending.future.set_exception(exc)
            pending.future.add_done_callback(_retrieved)
            if not isinstance(exc, Exception):
                raise
            return
        slot.running = None
        if self._slots.get(key) is not slot:  # swept meanwhile (a read longer than ttl)
            if subscription is not None:
                self.hub.unsubscribe(subscription)
        else:
            if slot.watch is not None:
                self.hub.unsubscribe(slot.watch)
            slot.value, slot.after, slot.started, slot.watch = value, pending.after, started, \
                subscription
            slot.used = self.clock()
        pending.future.set_result(value)

    def _sweep(self) -> None:
        """Forget what was neither read nor used for ``ttl`` (at most once per ``ttl``)."""
        now = self.clock()
        if now - self._swept < max(self.ttl, 0.1):
            return
        self._swept = now
        for key, slot in list(self._slots.items()):
            if slot.pending is None and slot.running is None \
                    and now - slot.last_start >= self.ttl \
                    and now - slot.used >= self.ttl:
                if slot.watch is not None:
                    self.hub.unsubscribe(slot.watch)
                del self._slots[key]

    async def close(self) -> None:
        """Let the reads in flight end (their callers are answered)."""
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # (marked as seen: its callers may all have gone)


def _lowest(a: int | None, b: int | None) -> int | None:
    """The resume position that covers both (None: no look-back wanted)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _covers(read_after: int | None, after: int | None) -> bool:
    """Whether a finished turn's read made for ``read_after`` answers ``after``."""
    return after is None or (read_after is not None and read_after <= after)


def _trimmed(final: Final, after: int | None) -> Final:
    """``final`` as asked with ``after`` (its missed events after it)."""
    if after is None:
        return Final(final.merged, final.terminal)
    if not final.complete:
        return final
    return Final(final.merged, final.terminal, [e for e in final.missed if e.seq > after])


def _followed_by(whole: History, items: list[Item]) -> History:
    """A whole history read, followed by the events the turn published
    since (its watch's: in seq order, some maybe in the read already)."""
    last = whole.events[-1].seq if whole.events else -1
    later = [item for item in items if isinstance(item, LiveEvent) and item.seq > last]
    if not later:
        return whole
    return History(whole.events + later, whole.complete)


def _after(whole: History, after: int) -> History:
    """The events of the whole history after ``after``, as ``history(after)`` gives them."""
    if not whole.events:
        return whole
    found = [event for event in whole.events if event.seq > after]
    return History(found, not found or found[0].seq == after + 1)

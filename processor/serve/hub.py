"""The live feed: one reader per shard, fanning out to every open stream.

Each shard has one task that keeps one ``XREAD BLOCK`` over the shard's
``merged`` and ``events`` streams in flight, from the positions it has
reached, and hands each entry of a followed turn to the subscriptions of
that ``response_id``. The Redis load is the same for one open stream or
ten thousand: one read per shard at a time.

A ``Subscription`` queues at most ``capacity`` items: a client that
does not read as fast as its turn is written (its writes block, so its
queue fills) is dropped, never buffered without bound; it resumes from the
last id it has.

Positions: a reader starts at the streams' ends and never skips an entry
after that, across Redis failures (it retries from where it was). A stream
subscribes first and reads the turn's past after its shard's reader has a
position (``Hub.subscribe``), so every entry is in the past it reads,
or in the feed, or both (the ``Cursor`` drops
the repeats).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from processor.client.items import xread_entries
from processor.client.source import entry_field, owned_event, owned_merged
from processor.client.turns import Item, TurnRef
from processor.redis_io.client import streams_arg
from processor.redis_io.connections import is_redis_failure
from processor.redis_io.replies import as_text
from processor.serve.metrics import ServeMetrics
from processor.wire.keys import Namespace, Shard

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

log = logging.getLogger("processor.serve")

#: Entries per stream one XREAD returns at most.
READ_COUNT = 1000
#: Seconds between retries of a failed read, at most.
MAX_BACKOFF = 2.0


class Subscription:
    """What the feed has for one open stream, waiting to be written."""

    def __init__(self, turn: TurnRef, capacity: int) -> None:
        self.turn = turn
        self.capacity = capacity
        self.dropped = False  # the queue overflowed: the client is too slow
        self.closed = False  # the server is stopping
        self._items: deque[Item] = deque()
        self._wake = asyncio.Event()

    def put(self, item: Item) -> None:
        if self.dropped or self.closed:
            return
        if len(self._items) >= self.capacity:
            self.dropped = True
            self._items.clear()
        else:
            self._items.append(item)
        self._wake.set()

    def close(self) -> None:
        self.closed = True
        self._items.clear()
        self._wake.set()

    def held(self) -> list[Item]:
        """What came and waits, in order (left where it is)."""
        return list(self._items)

    @property
    def quiet(self) -> bool:
        """Nothing has come for it (nor been lost) since it was made."""
        return not self._items and not self.over

    @property
    def over(self) -> bool:
        """Dropped or closed: nothing more will come."""
        return self.dropped or self.closed

    async def take(self, timeout: float) -> list[Item] | None:
        """Everything queued, waiting up to ``timeout`` s for something
        (``[]`` when nothing came); None once ``over``."""
        if not self._items and not self.over:
            self._wake.clear()
            # asyncio.timeout, not wait_for: no task per wait (one per event and stream)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
        if self.over:
            return None
        items = list(self._items)
        self._items.clear()
        return items


class Hub:
    """The readers of one process and the subscriptions they feed."""

    def __init__(self, client: RedisClient, namespace: Namespace, metrics: ServeMetrics,
                 block_ms: int = 1000) -> None:
        self.client = client
        self.namespace = namespace
        self.metrics = metrics
        self.block_ms = block_ms
        self._subs: dict[str, set[Subscription]] = {}
        self._positioned = {shard.index: asyncio.Event() for shard in namespace.all()}
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    def start(self) -> None:
        for shard in self.namespace.all():
            self._tasks.append(asyncio.create_task(self._read(shard), name=f"feed-{shard.index}"))

    @property
    def alive(self) -> bool:
        """Every reader is running (a reader only ends by ``close``)."""
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    @property
    def positioned(self) -> bool:
        """Every reader has found where its streams end (streams may open)."""
        return all(event.is_set() for event in self._positioned.values())

    async def subscribe(self, turn: TurnRef, capacity: int) -> Subscription:
        """A subscription to ``turn``, once its shard's reader has a position
        (until then this waits: a caller bounds it with a timeout)."""
        subscription = Subscription(turn, capacity)
        if self._closed:
            subscription.close()
            return subscription
        self._subs.setdefault(turn.response_id, set()).add(subscription)
        try:
            await self._positioned[turn.shard(self.namespace).index].wait()
        except BaseException:
            self.unsubscribe(subscription)
            raise
        return subscription

    def followers(self, response_id: str) -> int:
        """How many open streams follow ``response_id`` here."""
        return len(self._subs.get(response_id, ()))

    def unsubscribe(self, subscription: Subscription) -> None:
        subs = self._subs.get(subscription.turn.response_id)
        if subs is not None:
            subs.discard(subscription)
            if not subs:
                del self._subs[subscription.turn.response_id]

    async def close(self) -> None:
        """Stop the readers and end every subscription (their clients reconnect).

        A reader stops after the read it has in flight (at most ``block_ms``),
        and is cancelled only if that takes much longer: redis-py (8.1, on
        Python 3.11) can swallow the cancellation of a blocking XREAD and
        leave the task waiting on its socket for good."""
        self._closed = True
        for subs in list(self._subs.values()):
            for subscription in list(subs):
                subscription.close()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=self.block_ms / 1000 + 5)
            for task in late:
                task.cancel()

    async def _read(self, shard: Shard) -> None:
        positions: dict[str, str] = {}
        kinds = {shard.merged: "merged", shard.events: "events"}  # merged first: see dispatch
        failures = 0
        while not self._closed:
            try:
                if not positions:
                    positions = await self._ends(shard)
                    self._positioned[shard.index].set()
                self.metrics.redis_calls.labels("live").inc()
                reply = await self.client.xread(streams_arg(positions), count=READ_COUNT,
                                                block=self.block_ms)
            except Exception as exc:
                failures += 1
                self.metrics.redis_errors.inc()
                if is_redis_failure(exc):
                    if failures == 1:
                        log.warning("redis read failed, retrying", extra={
                            "shard": shard.index, "error": f"{type(exc).__name__}: {exc}"})
                else:
                    log.exception("feed read failed, retrying", extra={"shard": shard.index})
                if not self._closed:
                    await asyncio.sleep(min(MAX_BACKOFF, 0.05 * 2 ** min(failures, 6)))
                continue
            if failures:
                log.info("redis read recovered", extra={"shard": shard.index})
                failures = 0
            # A turn's merged entry and terminal event are added by one script:
            # XREAD reads both streams at one instant, merged first, so a
            # stream has the merged response in hand when its terminal comes.
            for stream, entries in xread_entries(reply):
                kind = kinds.get(stream)
                if kind is None:
                    continue
                for entry_id, fields in entries:
                    positions[stream] = as_text(entry_id)
                    self._dispatch(kind, fields)

    async def _ends(self, shard: Shard) -> dict[str, str]:
        """The id of the newest entry of each stream ("0-0" when empty)."""
        ends = {}
        for stream in (shard.merged, shard.events):
            self.metrics.redis_calls.labels("position").inc()
            last = await self.client.xrevrange(stream, count=1)
            ends[stream] = as_text(last[0][0]) if last else "0-0"
        return ends

    def _dispatch(self, kind: str, fields: dict[Any, Any]) -> None:
        rid = entry_field(fields, "response_id")
        if rid is None:
            return
        subs = self._subs.get(as_text(rid))
        if not subs:
            return
        attempt = as_text(entry_field(fields, "attempt_id") or "")
        item: Item | None = None  # decoded once, for all the subscriptions it belongs to
        for subscription in list(subs):
            if subscription.turn.attempt_id != attempt:
                continue
            if item is None:
                if kind == "events":
                    item = owned_event(subscription.turn, fields)
                else:
                    item = owned_merged(subscription.turn, fields)
                if item is None:
                    return
            subscription.put(item)

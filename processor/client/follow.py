"""Following one turn from Redis: ``follow`` (``Subscriber.follow``).

The same rules as ``processor serve``'s event streams (docs/serve.md,
"Joining and resuming"), from the same pure pieces: the turn's shard's live
feed is positioned first and its past read second (a
``TurnSource``), and a
``Cursor`` gives each seq once, in order; the
merged output comes just before the terminal event, which ends it.

Why from Redis and not over HTTP from a serve URL: a Python backend that
uses this client already holds the Redis connection its producers write
with, needs no token and no HTTP client (this package does not depend on
aiohttp), and reads what the server reads (the server itself is one more
hop over the same keys). A browser or another language uses the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from processor.client.items import xread_entries
from processor.client.joining import join
from processor.client.retry import RetryPolicy
from processor.client.source import (
    Final,
    History,
    LogSource,
    TurnSource,
    TurnState,
    entry_field,
    owned_event,
    owned_merged,
)
from processor.client.turns import Cursor, LiveEvent, MergedOutput, Snapshot, TurnRef
from processor.redis_io.client import streams_arg
from processor.redis_io.replies import as_text
from processor.wire.keys import Namespace

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

#: What ``follow`` yields.
Followed = Snapshot | LiveEvent | MergedOutput


def default_source(client: RedisClient, namespace: Namespace) -> TurnSource:
    """The past of turns on the keys workers write (the server's source:
    the turns' live logs)."""
    return LogSource(client, namespace)


async def follow(client: RedisClient, namespace: Namespace, turn: TurnRef, after: int | None,
                 *, source: TurnSource | None = None, block_ms: int = 1000,
                 retry: RetryPolicy | None = None) -> AsyncIterator[Followed]:
    """The turn's snapshot (a fresh join of a running turn, when the source
    has one, or a resume whose missed events are no longer all there) or
    its events after ``after``, then its live events, its merged output and
    its terminal event; then the iteration ends. A finished turn gives the
    events after ``after`` it missed, its merged output and terminal event
    (nothing when ``after`` is its terminal seq already). The same rules as
    the server's streams: ``processor.client.joining.join``."""
    retry = retry or RetryPolicy()
    source = source or default_source(client, namespace)
    shard = turn.shard(namespace)
    streams = (shard.merged, shard.events)  # merged first: it is in hand when the terminal comes
    # Positioned first, the past read second: every entry is in one or both.
    positions: dict[str, str] = {}
    for stream in streams:
        last = await retry.run(lambda s=stream: client.xrevrange(s, count=1))  # type: ignore[misc]
        positions[stream] = as_text(last[0][0]) if last else "0-0"
    cursor = Cursor(-1 if after is None else after)
    merged: MergedOutput | None = None

    async def final_merged() -> MergedOutput | None:
        return merged or (await retry.run(lambda: source.final(turn))).merged

    start = await join(_Retrying(source, retry), turn, after)
    if start.has_all:
        return  # the caller has it all (the server answers 204)
    if start.gone:  # no longer retained: the merged output is all there is
        for item in start.past:
            if isinstance(item, MergedOutput):
                yield item
        return
    if start.snapshot is not None:
        cursor.jump(start.snapshot.seq)
        yield start.snapshot
    past: list[LiveEvent | MergedOutput] = list(start.past)
    while True:
        for item in past:
            if isinstance(item, MergedOutput):
                merged = item
                continue
            if not cursor.take(item):
                continue
            if item.terminal:
                last_merged = await final_merged()
                if last_merged is not None:
                    yield last_merged
            yield item
            if cursor.ended:
                return
        reply = await retry.run(lambda: client.xread(streams_arg(positions), count=1000,
                                                     block=block_ms))
        past = []
        for stream, entries in xread_entries(reply):
            for entry_id, fields in entries:
                positions[stream] = as_text(entry_id)
                found = _owned(turn, stream == shard.merged, fields)
                if found is not None:
                    past.append(found)


class _Retrying:
    """A ``TurnSource`` whose reads are retried by ``retry``."""

    def __init__(self, source: TurnSource, retry: RetryPolicy) -> None:
        self.source = source
        self.retry = retry

    async def state(self, turn: TurnRef) -> TurnState:
        return await self.retry.run(lambda: self.source.state(turn))

    async def snapshot(self, turn: TurnRef) -> Snapshot | None:
        return await self.retry.run(lambda: self.source.snapshot(turn))

    async def history(self, turn: TurnRef, after: int) -> History:
        return await self.retry.run(lambda: self.source.history(turn, after))

    async def final(self, turn: TurnRef, after: int | None = None) -> Final:
        return await self.retry.run(lambda: self.source.final(turn, after))


def _owned(turn: TurnRef, merged: bool,
           fields: Mapping[Any, Any]) -> LiveEvent | MergedOutput | None:
    if entry_field(fields, "response_id") is None:
        return None
    return owned_merged(turn, fields) if merged else owned_event(turn, fields)

"""The reading side of the wire contract: following the output streams of every shard.

``Subscriber`` follows the ``merged`` and ``events`` streams of every
shard (section 5), resumable from the positions it reports, and waits for the
merged response of one turn.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from redis.asyncio.cluster import RedisCluster

from processor.client.closing import AsyncClosing
from processor.client.follow import Followed, follow
from processor.client.items import Item, MergedItem, decode_item, entry_ms, xread_entries
from processor.client.retry import RetryPolicy
from processor.client.source import TurnSource
from processor.client.turns import TurnRef
from processor.redis_io.client import streams_arg
from processor.redis_io.replies import as_text
from processor.scripts.meta import require
from processor.wire.ids import response_id_for_turn, shard_of
from processor.wire.keys import DEFAULT_NAMESPACE, Namespace, Shard

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

#: The streams of a shard a ``Subscriber`` can follow.
STREAMS = ("merged", "events", "dlq", "updates")


class Subscriber(AsyncClosing):
    """Follows the output streams of every shard: ``async for item in subscriber``.

    Items are ``MergedItem``, ``EventItem`` (or ``EntryItem``
    for ``dlq``/``updates``), in entry id order within each stream (a batch
    read across streams is ordered by entry time). ``positions`` maps each
    stream key (``{ns:s}:merged``, ...) to the id of the last item delivered;
    pass it as ``from_positions`` to resume without repeats. ``start`` is where
    streams without a position begin: ``"0-0"`` (all retained entries) or
    ``"$"`` (only entries added after the first read).

    On a single node one ``XREAD BLOCK`` covers all shards; on a Redis Cluster
    (``RedisCluster`` client) each shard has its own blocking XREAD in flight.

    The namespace's shard count comes from its record in Redis
    (``processor.scripts.meta``), read by the first read (until then
    ``positions`` is empty): ``NotInitialised``
    when there is none yet. ``shards``, if given, is checked against it
    (``Mismatch``), and fills ``positions`` at once.
    """

    def __init__(
        self,
        client: RedisClient,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int | None = None,
        streams: Iterable[str] = ("merged", "events"),
        *,
        from_positions: Mapping[str, str] | None = None,
        start: str = "0-0",
        shard_indexes: Iterable[int] | None = None,
        block_ms: int = 1000,
        count: int = 100,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Follow ``streams`` of every shard (or only ``shard_indexes``) of ``namespace``."""
        self.client = client
        self.namespace = namespace
        self.streams = tuple(streams)
        unknown = set(self.streams) - set(STREAMS)
        if unknown:
            raise ValueError(f"unknown streams {sorted(unknown)}; known: {list(STREAMS)}")
        self.block_ms = block_ms
        self.count = count
        self.retry = retry or RetryPolicy()
        self._start, self._from = start, dict(from_positions or {})
        self._indexes = None if shard_indexes is None else sorted(set(shard_indexes))
        self._shards, self._checked = shards, False
        self.keys = Namespace(namespace, shards or 1)
        self._groups: list[dict[str, str]] = []
        self._kinds: dict[str, str] = {}
        self.positions: dict[str, str] = {}
        if shards is not None:
            self._follow(shards)
        self._cluster = isinstance(client, RedisCluster)
        self._pending: dict[int, asyncio.Task[list[tuple[str, list[Any]]]]] = {}
        self._buffer: deque[Item] = deque()
        self._stopped = False

    def _follow(self, shards: int) -> None:
        """Set up the streams of ``shards`` shards (or the chosen ones)."""
        self.keys = Namespace(self.namespace, shards)
        indexes = range(shards) if self._indexes is None else self._indexes
        self._groups = [self._stream_keys(self.keys.shard(i)) for i in indexes]
        self._kinds = {key: kind for group in self._groups for key, kind in group.items()}
        self.positions = {key: self._start for key in self._kinds}
        self.positions.update((k, v) for k, v in self._from.items() if k in self._kinds)

    async def ready(self) -> Namespace:
        """The namespace's key names, reading its record the first time
        (``NotInitialised``,
        ``Mismatch``)."""
        if not self._checked:
            meta = await self.retry.run(
                lambda: require(self.client, self.namespace, self._shards))
            if self._shards is None:
                self._follow(meta.shards)
            self._checked = True
        return self.keys

    def _stream_keys(self, shard: Shard) -> dict[str, str]:
        """Stream key -> kind, for the followed streams of one shard."""
        return {getattr(shard, kind): kind for kind in self.streams}

    def __aiter__(self) -> Subscriber:
        """The subscriber itself."""
        return self

    async def __anext__(self) -> Item:
        """The next item (waits for one); ends after ``stop`` or ``aclose``."""
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
        ``Producer.send`` returned) or ``"$"`` (only new entries) to skip it.
        Independent of this subscriber's own positions.
        """
        target = response_id or response_id_for_turn(_required(turn_id))
        await self.ready()
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
        probe._checked = True  # (the same record: read once)
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

    async def follow(
        self,
        response_id: str,
        after: int | None = None,
        *,
        attempt_id: str = "",
        turn_id: str | None = None,
        source: TurnSource | None = None,
    ) -> AsyncIterator[Followed]:
        """One turn as ``processor serve`` streams it, read from Redis:
        ``async for item in subscriber.follow("resp_1")``.

        Yields a ``Snapshot`` (the merge so far,
        when joining a running turn whose source keeps one), then
        ``LiveEvent`` s in seq order, each once
        (``item.seq``), and the turn's
        ``MergedOutput`` (authoritative) just
        before the terminal
        ``synthesis`` event, after which the iteration ends. ``after`` resumes
        after the last seq seen (the same as ``Last-Event-ID``). Every item
        reads alike: ``item.type``, ``item.data`` (the event's JSON, bytes, as
        the server sends it) and ``item.json()`` (decoded); a snapshot and the
        merged output also have ``item.text`` and ``item.response_json()``.

        Read directly from Redis with the server's rules and pure pieces
        (processor/client/follow.py says why not over HTTP). Independent of
        this subscriber's own positions; ``source`` replaces where the past
        is read (the server's by default)."""
        keys = await self.ready()
        turn = TurnRef(response_id, attempt_id, turn_id)
        async for item in follow(self.client, keys, turn, after, source=source,
                                 block_ms=self.block_ms, retry=self.retry):
            yield item

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

    async def _read_batch(self, block_ms: int | None) -> list[Item]:
        """Read the next entries after the positions (not advancing them), in time order."""
        await self.ready()
        await self._resolve_latest()
        fetch = self._fetch_cluster if self._cluster else self._fetch_single
        batches = await self.retry.run(lambda: fetch(block_ms))
        items = [
            decode_item(stream, self._kinds[stream], as_text(entry_id), fields)
            for stream, entries in batches
            for entry_id, fields in entries
        ]
        items.sort(key=lambda item: entry_ms(item.id))
        return items

    async def _resolve_latest(self) -> None:
        """Replace ``"$"`` positions by the streams' current last ids (once)."""
        for key, position in self.positions.items():
            if position == "$":
                last = await self.retry.run(partial(self.client.xrevrange, key, count=1))
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
        reply = await self.client.xread(streams_arg(streams), count=self.count, block=block_ms)
        return xread_entries(reply)


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

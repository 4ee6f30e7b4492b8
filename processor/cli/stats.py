"""``processor stats``: what every shard looks like right now.

Per shard: the ``updates`` stream's length, the consumer group's lag and
pending count, its consumers with their idle time, the active and closing
turns (the worker's ``active`` and ``closing`` zsets), the lengths of the
output streams and of the inbox (entries of ``Producer(inbox=True)`` not yet
admitted into the stream). Then the live workers (``{ns:0}:workers:<group>``), each with
its last beat and the shards shard affinity gives it. Read-only: XINFO
STREAM / GROUPS / CONSUMERS, XLEN, LLEN, ZCARD, ZRANGE and TIME, one key at a
time, so it works the same on one node and on a Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import msgspec
from redis.exceptions import ResponseError
from rich.console import Console

from processor.cli.tables import Column, Table, print_table
from processor.redis_io.replies import as_text
from processor.wire.keys import Namespace, Shard
from processor.worker.affinity import owned_shards

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient


class ConsumerStats(msgspec.Struct):
    """One consumer of a shard's group."""

    name: str
    pending: int
    idle_ms: int


class ShardStats(msgspec.Struct):
    """One shard of a namespace."""

    shard: int
    stream: str
    length: int  # entries in the updates stream (the worker deletes what it applied)
    inbox: int  # entries in the inbox, not admitted into the stream yet
    group: bool  # the consumer group exists
    lag: int  # entries not delivered to the group yet
    lag_exact: bool  # False: Redis gave no lag (6.2, or deleted entries); see _lag
    pending: int  # delivered to a consumer, not acked yet
    last_delivered_id: str
    consumers: list[ConsumerStats]
    active_turns: int
    closing_turns: int
    dlq: int
    merged: int
    events: int


class WorkerStats(msgspec.Struct):
    """A worker that beat in the group's workers set (shard affinity)."""

    name: str
    last_beat_ms: int  # ms since its last beat, on Redis's clock
    shards: list[int]  # the shards it reads, by the workers' own rule


class Stats(msgspec.Struct):
    """``processor stats --json``."""

    namespace: str
    group: str
    shards: list[ShardStats]
    workers: list[WorkerStats] = []


def _missing_key(exc: ResponseError) -> bool:
    return "no such key" in str(exc).lower()


async def _stream_info(client: RedisClient, key: str) -> dict[str, Any] | None:
    try:
        return dict(await client.xinfo_stream(key))
    except ResponseError as exc:
        if _missing_key(exc):
            return None
        raise


async def _group_info(client: RedisClient, key: str, group: str) -> dict[str, Any] | None:
    try:
        groups = await client.xinfo_groups(key)
    except ResponseError as exc:
        if _missing_key(exc):
            return None
        raise
    return next((dict(g) for g in groups if as_text(g["name"]) == group), None)


def _lag(length: int, info: dict[str, Any] | None) -> tuple[int, bool]:
    """Entries the group has not been delivered yet, and whether Redis said so.

    Redis 7 reports ``lag`` unless entries were deleted in the range it would
    count. Otherwise it is ``length - pending``: the worker trims the entries
    it acks (all those below the oldest pending one) in the same step, so the
    stream holds the pending entries, the ones not delivered yet and, while an
    older entry is still pending, the few acked after it.
    """
    if info is None:
        return length, True
    lag = info.get("lag")
    if lag is not None:
        return int(lag), True
    return max(0, length - int(info["pending"])), False


async def _consumers(client: RedisClient, key: str, group: str) -> list[ConsumerStats]:
    replies = await client.xinfo_consumers(key, group)
    return [
        ConsumerStats(as_text(c["name"]), int(c["pending"]), int(c["idle"])) for c in replies
    ]


async def shard_stats(client: RedisClient, shard: Shard, group: str) -> ShardStats:
    """The figures of one shard (every key of it lives on one Cluster node)."""
    stream = await _stream_info(client, shard.updates)
    length = int(stream["length"]) if stream else 0
    info = await _group_info(client, shard.updates, group) if stream else None
    lag, exact = _lag(length, info)
    consumers = await _consumers(client, shard.updates, group) if info else []
    return ShardStats(
        shard=shard.index,
        stream=shard.updates,
        length=length,
        inbox=int(await client.llen(shard.inbox)),
        group=info is not None,
        lag=lag,
        lag_exact=exact,
        pending=int(info["pending"]) if info else 0,
        last_delivered_id=as_text(info["last-delivered-id"]) if info else "",
        consumers=consumers,
        active_turns=int(await client.zcard(shard.active)),
        closing_turns=int(await client.zcard(shard.closing)),
        dlq=int(await client.xlen(shard.dlq)),
        merged=int(await client.xlen(shard.merged)),
        events=int(await client.xlen(shard.events)),
    )


async def collect(
    client: RedisClient, keys: Namespace, group: str, advance: Callable[[], None] | None = None
) -> Stats:
    """Every shard's figures; ``advance()`` is called after each shard (progress)."""
    shards = []
    for shard in keys.all():
        shards.append(await shard_stats(client, shard, group))
        if advance is not None:
            advance()
    return Stats(keys.name, group, shards, await worker_stats(client, keys, group))


async def worker_stats(client: RedisClient, keys: Namespace, group: str) -> list[WorkerStats]:
    """The workers in the group's workers set (those a TTL silent included,
    until a beat drops them) and the shards each reads."""
    beats = cast(list[tuple[bytes, float]],
                 await client.zrange(keys.workers(group), 0, -1, withscores=True))
    seconds, micros = await client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    names = sorted(as_text(name) for name, _score in beats)
    last = {as_text(name): int(score) for name, score in beats}
    return [WorkerStats(name, max(0, now - last[name]),
                        sorted(owned_shards(name, names, keys.shards))) for name in names]


# --------------------------------------------------------------------------- rendering


def idle_text(ms: int) -> str:
    """An idle time for people: ``850ms``, ``12.3s``, ``4m05s``, ``2h07m``."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def shard_table(stats: Stats) -> Table:
    """One row per shard. The ``inbox`` column only when some shard has entries
    waiting there (so the usual table fits 80 columns; ``--json`` always has it)."""
    inboxes = any(s.inbox for s in stats.shards)
    names = ("shard", "length", "lag", "pending", "consumers", "active", "closing", "dlq",
             "merged", "events", *(("inbox",) if inboxes else ()))
    rows = []
    for s in stats.shards:
        lag = str(s.lag) if s.lag_exact else f"~{s.lag}"
        consumers = str(len(s.consumers)) if s.group else "no group"
        rows.append([
            str(s.shard), str(s.length), lag, str(s.pending), consumers, str(s.active_turns),
            str(s.closing_turns), str(s.dlq), str(s.merged), str(s.events),
            *((str(s.inbox),) if inboxes else ()),
        ])
    return Table(f"namespace {stats.namespace}, group {stats.group}",
                 [Column(name, right=name != "shard") for name in names], rows)


def consumer_table(stats: Stats) -> Table | None:
    """One row per consumer of each shard; None when no shard has any."""
    rows = [[str(s.shard), c.name, str(c.pending), idle_text(c.idle_ms)]
            for s in stats.shards for c in s.consumers]
    if not rows:
        return None
    columns = [Column("shard"), Column("consumer"), Column("pending", right=True),
               Column("idle", right=True)]
    return Table("consumers", columns, rows)


def worker_table(stats: Stats) -> Table | None:
    """One row per live worker; None when none beats (or affinity is off)."""
    if not stats.workers:
        return None
    rows = [[w.name, idle_text(w.last_beat_ms) + " ago", ",".join(map(str, w.shards)) or "-"]
            for w in stats.workers]
    columns = [Column("worker"), Column("last beat", right=True), Column("shards read")]
    return Table("workers (shard affinity)", columns, rows)


def render(stats: Stats, console: Console) -> None:
    """Print the tables (and what ``~`` in the lag column means, when it is used)."""
    tables = [shard_table(stats), consumer_table(stats), worker_table(stats)]
    for n, table in enumerate(t for t in tables if t is not None):
        if n:
            console.print()
        print_table(console, table.title, table.columns, table.rows)
    if any(not s.lag_exact for s in stats.shards):
        console.print("# ~ lag = length - pending (Redis reported no lag)", markup=False,
                      highlight=False)


def to_json(stats: Stats) -> bytes:
    """The figures as one JSON document."""
    return msgspec.json.encode(stats)

"""A namespace's record in Redis: what every party of a namespace must agree on.

``{<ns>:0}:meta`` (``processor.wire.keys.Namespace.meta``, under shard 0's
hash tag) is a hash holding the namespace's number of shards (where
producers write, what workers and tools read), its consumer group and an
``epoch``: a random id written when the record is created. It is written
once, by ``processor init`` or by the first worker (``create_namespace.lua``:
create-if-absent, returns what is stored), and read by every worker, tool
and client, so none of them needs to be told the shard count. A value given
explicitly that disagrees with the record is refused (``Mismatch``); a
default is not explicit and takes the record's value.

The epoch tells a worker that the namespace's state in Redis is gone: a
Redis restarted without persistence comes back without the record, and the
first worker to notice writes a new one with a new epoch (docs/reliability.md).

Changing the shard count of a namespace is refused unless every shard is
drained and no worker is live (``processor init --shards N --reshard``,
``reshard_namespace.lua``; docs/cluster.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from processor.redis_io.replies import as_text
from processor.scripts import source
from processor.wire.keys import Namespace

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient


class NamespaceError(Exception):
    """What a namespace's record says against what was asked (a base class)."""


class NotInitialised(NamespaceError, LookupError):
    """The namespace has no record yet: no ``processor init`` and no worker ran."""

    def __init__(self, namespace: str) -> None:
        key = Namespace(namespace).meta
        super().__init__(f"namespace {namespace!r} is not initialised (no {key}): run "
                         "`processor init` or start a worker")


class Mismatch(NamespaceError, ValueError):
    """A value given explicitly disagrees with the namespace's record."""


@dataclass(frozen=True)
class Meta:
    """A namespace's record, as stored."""

    namespace: str
    shards: int
    group: str
    epoch: str
    created_ms: int = 0

    @property
    def keys(self) -> Namespace:
        """The key names of the namespace, with its shard count."""
        return Namespace(self.namespace, self.shards)


def parse(namespace: str, stored: Mapping[Any, Any] | list[Any]) -> Meta | None:
    """The record from an ``HGETALL`` reply (a dict, or a flat list as a
    script returns it); None when it is empty (no record)."""
    if isinstance(stored, list):
        pairs = iter(stored)
        stored = dict(zip(pairs, pairs, strict=False))
    fields = {as_text(k): as_text(v) for k, v in stored.items()}
    if not fields:
        return None
    try:
        shards = int(fields["shards"])
        if shards < 1:
            raise ValueError(shards)
        return Meta(namespace, shards, fields["group"], fields["epoch"],
                    int(fields.get("created", "0")))
    except (KeyError, ValueError):
        raise NamespaceError(
            f"the record of namespace {namespace!r} ({Namespace(namespace).meta}) is "
            f"malformed: {sorted(fields)}") from None


async def read(client: RedisClient, namespace: str) -> Meta | None:
    """The namespace's record, or None when there is none (one ``HGETALL``)."""
    return parse(namespace, await client.hgetall(Namespace(namespace).meta))


async def create(client: RedisClient, namespace: str, shards: int, group: str) -> Meta:
    """The namespace's record: written with these values if there is none
    (with a new epoch), else the one stored (which may disagree: ``check``)."""
    script = client.register_script(source("create_namespace"))
    stored = await script(keys=[Namespace(namespace).meta],
                          args=[shards, group, uuid.uuid4().hex])
    meta = parse(namespace, stored)
    if meta is None:  # (the script writes it when missing)
        raise NamespaceError(f"namespace {namespace!r}: the record was not written")
    return meta


def check(meta: Meta, shards: int | None = None, shards_from: str = "shards=",
          group: str | None = None, group_from: str = "group=") -> None:
    """Refuse values given explicitly (None: not given) that disagree with
    the record: ``Mismatch``, one line naming both values and where
    the given one came from (``shards_from``: ``--shards``, ``PROCESSOR_SHARDS``...)."""
    key = meta.keys.meta
    if shards is not None and shards != meta.shards:
        raise Mismatch(
            f"namespace {meta.namespace!r} has {meta.shards} shard(s) (its record {key}), "
            f"but {shards_from} says {shards}; to change it, drain the namespace and run "
            "`processor init --shards N --reshard` (docs/cluster.md)")
    if group is not None and group != meta.group:
        raise Mismatch(
            f"namespace {meta.namespace!r} is served by consumer group {meta.group!r} (its "
            f"record {key}), but {group_from} says {group!r}")


async def require(client: RedisClient, namespace: str, shards: int | None = None,
                  shards_from: str = "shards=") -> Meta:
    """The namespace's record for a client or a tool: ``NotInitialised``
    when there is none, ``Mismatch`` when ``shards`` (given explicitly)
    disagrees with it."""
    meta = await read(client, namespace)
    if meta is None:
        raise NotInitialised(namespace)
    check(meta, shards, shards_from)
    return meta


# --------------------------------------------------------------------------- resharding


async def drain_problems(client: RedisClient, meta: Meta, worker_ttl_ms: int) -> list[str]:
    """Why the namespace cannot be resharded now, one line per problem
    (none: every shard drained and no worker live). Drained: no entry in
    ``updates`` (workers delete what they applied) or in the inbox (routed
    by the old count), nothing pending, no active or closing turn."""
    keys = meta.keys
    problems = []
    seconds, micros = await client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    live = await client.zrangebyscore(keys.workers(meta.group), now_ms - worker_ttl_ms, "+inf")
    if live:
        names = ", ".join(sorted(as_text(name) for name in live))
        problems.append(f"{len(live)} worker(s) live: {names} (stop every worker first)")
    for shard in keys.all():
        async with client.pipeline(transaction=False) as pipe:
            pipe.xlen(shard.updates)
            pipe.xpending(shard.updates, meta.group)
            pipe.zcard(shard.active)
            pipe.zcard(shard.closing)
            pipe.llen(shard.inbox)
            length, pending, active, closing, inbox = await pipe.execute(raise_on_error=False)
        if isinstance(pending, Exception):  # no stream or no group: nothing pending
            pending = {"pending": 0}
        found = {"entries": length, "pending": int(pending["pending"]),
                 "active turns": active, "closing turns": closing, "inbox entries": inbox}
        left = ", ".join(f"{n} {what}" for what, n in found.items()
                         if not isinstance(n, Exception) and int(n))
        if left:
            problems.append(f"shard {shard.index} is not drained: {left}")
    return problems


async def reshard(client: RedisClient, meta: Meta, shards: int) -> bool:
    """Change the record's shard count if it is still ``meta`` (compare and
    set); False if it changed meanwhile. The caller checked ``drain_problems``."""
    script = client.register_script(source("reshard_namespace"))
    changed = await script(keys=[meta.keys.meta], args=[meta.epoch, meta.shards, shards])
    return int(changed) == 1

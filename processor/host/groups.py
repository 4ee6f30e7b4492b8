"""One consumer group per namespace: the check ``processor run`` makes at start.

A namespace's turn state, done markers and outputs are keyed by the
namespace, not by the group. So a second group on the same shard streams
is not a second, independent processor: its workers apply every entry
again to the same turns (the turn is merged once, by whichever group comes
first; the other group's entries of it are dead-lettered ``turn_closed``),
and each group trims the stream at its own oldest pending entry, deleting
entries the other has not read yet. Nothing a group name can select is
separate, so a second processor needs its own ``--namespace``.

``other_groups`` reads the groups once, before the worker creates its
own: a worker refused for another group leaves nothing behind (a group it
created would refuse the other group's next start in turn).
``--allow-other-groups`` starts anyway, with a warning (a group left by a
mistyped ``--group`` that the workers' Redis user may not destroy, say).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError

from processor.redis_io.connections import until_done
from processor.redis_io.replies import as_text
from processor.wire.keys import Namespace

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

log = logging.getLogger("processor.groups")


@dataclass(frozen=True)
class OtherGroup:
    """A consumer group other than ours on the namespace's shard streams."""

    name: str
    streams: list[str]  # the shard streams it is on
    consumers: int  # over those streams
    pending: int


def find_others(replies: Sequence[tuple[str, Any]], group: str) -> list[OtherGroup]:
    """The groups other than ``group`` in XINFO GROUPS replies, one
    ``(stream, reply)`` per shard stream, in name order; a reply that is an
    error (no such stream yet) has none."""
    streams: dict[str, list[str]] = {}
    consumers: dict[str, int] = {}
    pending: dict[str, int] = {}
    for stream, reply in replies:
        if isinstance(reply, BaseException):
            continue
        for entry in reply:
            info = {as_text(k): v for k, v in entry.items()}
            name = as_text(info.get("name", b""))
            if name != group:
                streams.setdefault(name, []).append(stream)
                consumers[name] = consumers.get(name, 0) + int(info.get("consumers") or 0)
                pending[name] = pending.get(name, 0) + int(info.get("pending") or 0)
    return [OtherGroup(name, streams[name], consumers[name], pending[name])
            for name in sorted(streams)]


def refusal(namespace: Namespace, group: str, others: list[OtherGroup]) -> str:
    """The one line ``processor run`` exits with when other groups were found."""
    shards = namespace.shards
    listed = ", ".join(
        f"{g.name!r} (on {len(g.streams)} of {shards} shard stream(s), e.g. {g.streams[0]}; "
        f"{g.consumers} consumer(s), {g.pending} pending)" for g in others)
    return (f"namespace {namespace.name!r} is read by other consumer group(s): {listed}; "
            f"group {group!r} would apply every entry again (its turns' entries dead-lettered "
            f"turn_closed, entries trimmed before the other group reads them). Use the same "
            f"--group, give this worker its own --namespace, or remove the other group once "
            f"its workers are stopped (XGROUP DESTROY <stream> <group>); "
            f"--allow-other-groups starts anyway")


async def other_groups(client: RedisClient, namespace: Namespace, group: str,
                       give_up: Callable[[], bool]) -> list[OtherGroup] | None:
    """The groups other than ``group`` on the namespace's shard streams
    (XINFO GROUPS of each, in one pipeline; retried while Redis is
    unreachable). None if it could not tell: ``give_up()`` (stopping) or a
    Redis user without XINFO GROUPS (logged)."""
    streams = [shard.updates for shard in namespace.all()]

    async def read() -> list[Any]:
        async with client.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xinfo_groups(stream)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
            return replies

    def retrying(exc: BaseException | None) -> None:
        log.warning("redis unavailable, retrying", extra={"error": repr(exc)})

    try:
        replies = await until_done(read, give_up=give_up, on_retry=retrying)
    except Exception:
        if give_up():
            return None
        raise
    if any(isinstance(r, NoPermissionError) for r in replies):
        log.warning("cannot check for other consumer groups on the shard streams: "
                    "the Redis user may not run XINFO GROUPS", extra={"group": group})
        return None
    return find_others(list(zip(streams, replies, strict=True)), group)


async def check_groups(client: RedisClient, namespace: Namespace, group: str, allow: bool,
                       give_up: Callable[[], bool]) -> str | None:
    """At start: the refusal line if another group reads the namespace's
    shard streams (None: start). With ``allow``, a warning instead."""
    others = await other_groups(client, namespace, group, give_up)
    if not others:
        return None
    if allow:
        log.warning("other consumer groups read this namespace's shard streams: every entry "
                    "is applied by each group (--allow-other-groups)",
                    extra={"group": group, "other_groups": [g.name for g in others]})
        return None
    return refusal(namespace, group, others)

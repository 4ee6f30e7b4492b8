"""``processor repair-stream``: a shard's updates stream back from bad ids.

An ``XADD`` with an explicit id at the last possible id makes every later
``XADD *`` of the stream fail; one far ahead of Redis's clock gets there
entry by entry (``processor.wire.stream_ids``; workers report either in their
log, ``processor_stream_ids_bad`` and ``/readyz``). The repair is one Lua
step per shard (``repair_stream.lua``, which says exactly what it does): the
entries past the limit move to the DLQ whole (reason ``BAD_ID``; one a
worker already merged and acked is only deleted), every
other entry, pending entry and consumer group stays, and the stream's and
groups' last ids come back below the limit so that producers' sends work
again. A shard that needs nothing is left alone.

Stop the workers first (the command refuses while any beats): a worker
remembers the newest id it has read, and the held-turn path takes a batch
below it for one it has already routed, so entries it reads after a repair
would wait for a reclaim. Workers started after the repair know nothing of
the old ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from processor.redis_io.replies import as_text
from processor.scripts import source
from processor.wire.keys import Namespace, Shard
from processor.wire.stream_ids import MAX_AHEAD_MS

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

#: The DLQ reason of an entry the repair moved.
BAD_ID = "bad_id"


@dataclass(frozen=True, slots=True)
class GroupRepair:
    """One consumer group: its last-delivered-id before and after, and its
    pending entries kept (or, for a plan, pending now) and dropped because
    their entry was already deleted."""

    name: str
    last_before: str
    last_after: str
    pending: int
    lost: int


@dataclass(frozen=True, slots=True)
class ShardRepair:
    """What the repair of one shard did (``repaired``), would do (``plan``),
    or found (``fine``, ``missing``)."""

    shard: int
    status: str
    last_before: str = ""
    last_after: str = ""
    dead_lettered: int = 0
    acked: int = 0
    kept: int = 0
    groups: tuple[GroupRepair, ...] = ()

    def lines(self) -> list[str]:
        """What to print: one line for the shard, one per group when it changed."""
        head = f"shard {self.shard}: "
        if self.status == "missing":
            return [head + "no updates stream"]
        if self.status == "fine":
            return [head + f"fine (last id {self.last_before})"]
        plan = self.status == "plan"
        acked = f", {'would delete' if plan else 'deleted'} {self.acked} already acked" if (
            self.acked) else ""
        out = [head + f"{'would move' if plan else 'moved'} {self.dead_lettered} "
               f"entr{'y' if self.dead_lettered == 1 else 'ies'} to the DLQ ({BAD_ID}){acked}, "
               f"kept {self.kept}; last id {self.last_before} -> {self.last_after}"]
        for g in self.groups:
            pending = f"{g.pending} pending" + (
                f", {g.lost} pending without data dropped" if g.lost else "")
            out.append(f"  group {g.name}: last delivered {g.last_before} -> {g.last_after}; "
                       f"{pending}")
        return out


def parse_reply(shard: int, reply: Sequence[Any]) -> ShardRepair:
    """``repair_stream.lua``'s reply."""
    status = as_text(reply[0])
    if status == "missing":
        return ShardRepair(shard, status)
    rest = reply[6:]
    groups = tuple(
        GroupRepair(as_text(rest[i]), as_text(rest[i + 1]), as_text(rest[i + 2]),
                    int(rest[i + 3]), int(rest[i + 4]))
        for i in range(0, len(rest), 5))
    return ShardRepair(shard, status, as_text(reply[1]), as_text(reply[2]), int(reply[3]),
                       int(reply[4]), int(reply[5]), groups)


async def running_workers(client: RedisClient, keys: Namespace, group: str) -> list[str]:
    """The workers of ``group`` that beat within the last two ``--worker-ttl``
    (a drained worker leaves at once; one that died drops out after that;
    workers run with ``--no-affinity`` do not beat and are not seen)."""
    return sorted(as_text(name) for name in await client.zrange(keys.workers(group), 0, -1))


async def repair(client: RedisClient, shard: Shard, *, max_ahead_ms: int = MAX_AHEAD_MS,
                 dry_run: bool = False) -> ShardRepair:
    """Repair ``shard``'s updates stream (or, with ``dry_run``, say what it would do)."""
    script = client.register_script(source("repair_stream"))
    reply = await script(keys=[shard.updates, shard.dlq, shard.repair],
                         args=[BAD_ID, max_ahead_ms, 1 if dry_run else 0])
    return parse_reply(shard.index, reply)

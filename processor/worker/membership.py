"""The worker's side of shard affinity (``processor.worker.affinity``): beating
in the group's workers zset, keeping the set of shards it reads, and
checking the shards it does not own for a stalled owner.

The imperative shell of the pure rules in ``affinity``: Redis I/O only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from processor.redis_io.connections import is_redis_failure
from processor.redis_io.replies import as_text
from processor.scripts.membership_calls import beat_worker, build_beat
from processor.wire.keys import Namespace, Shard
from processor.wire.stream_ids import id_order
from processor.worker.affinity import (
    BEATS_PER_TTL,
    owned_shards,
    readers_per_shard,
    shard_readers,
    stalled,
)
from processor.worker.metrics import Metrics
from processor.worker.sampler import find_group
from processor.worker.shell import end_if_cancelled

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient, Script

log = logging.getLogger("processor.worker")


class Membership:
    """Which shards of ``namespace`` this consumer reads (all of them with
    ``enabled=False``, or until the first beat)."""

    def __init__(self, client: RedisClient, beat_worker: Script, namespace: Namespace, group: str,
                 consumer: str, ttl: float, enabled: bool, metrics: Metrics) -> None:
        self.client = client
        self.namespace = namespace
        self.group = group
        self.consumer = consumer
        self.ttl_ms = max(1, int(ttl * 1000))
        self.enabled = enabled
        self.metrics = metrics
        self.key = namespace.workers(group)
        self._script = beat_worker  # (Scripts.beat_worker)
        self.live: list[str] = [consumer]
        self.owned = frozenset(range(namespace.shards))
        self.rescued: frozenset[int] = frozenset()
        self.crowded = False  # more live workers than shards, as the last beat saw
        metrics.shards_read.set(namespace.shards)
        metrics.shards.set(namespace.shards)

    @property
    def beat_period(self) -> float:
        """Seconds between beats."""
        return self.ttl_ms / 1000 / BEATS_PER_TTL

    def reads(self, shard: int) -> bool:
        """Whether to read new entries from ``shard`` now."""
        return shard in self.owned or shard in self.rescued

    def sole_reader(self, shard: int) -> bool:
        """Whether no other live worker reads ``shard`` as far as this one
        knows: the shard is its own, and every shard has one reader (no more
        live workers than shards). With affinity off every worker reads
        every shard and none knows how many others there are: True."""
        if not self.enabled:
            return True
        return (shard in self.owned
                and readers_per_shard(len(self.live), self.namespace.shards) == 1)

    async def beat(self) -> None:
        """Say this worker is alive; update the live set, the owned shards and
        the rescued ones (shards not owned whose owners stalled)."""
        if not self.enabled:
            return
        live = await beat_worker(self._script,
                                 build_beat(self.key, self.consumer, self.ttl_ms, "beat"))
        owned = owned_shards(self.consumer, live, self.namespace.shards)
        if owned != self.owned:
            log.info("shards to read changed", extra={"consumer": self.consumer,
                                                      "shards": sorted(owned),
                                                      "workers": len(live)})
        self.live, self.owned = live, owned
        self._count_workers(len(live))
        rescued = set()
        for shard in self.namespace.all():
            if shard.index not in owned and await self._stalled(shard):
                rescued.add(shard.index)
        if rescued - self.rescued:
            log.warning("reading shards whose owners stalled",
                        extra={"shards": sorted(rescued - self.rescued)})
        self.rescued = frozenset(rescued)
        self.metrics.shards_read.set(len(owned | rescued))

    def _count_workers(self, workers: int) -> None:
        """The live workers gauge, and one log line when there come to be
        more live workers than shards (and one when that ends): then every
        shard is shared, its turns are stored rather than held, and a
        worker's throughput falls to about a third (docs/benchmarks.md)."""
        self.metrics.live_workers.set(workers)
        shards = self.namespace.shards
        crowded = workers > shards
        if crowded and not self.crowded:
            log.warning("more live workers than shards: every shard is shared, which "
                        "costs throughput; run at most as many workers as shards, or "
                        "reshard (docs/cluster.md)",
                        extra={"workers": workers, "shards_total": shards,
                               "readers_per_shard": readers_per_shard(workers, shards)})
        elif self.crowded and not crowded:
            log.info("no more live workers than shards now",
                     extra={"workers": workers, "shards_total": shards})
        self.crowded = crowded

    async def _stalled(self, shard: Shard) -> bool:
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.xinfo_consumers(shard.updates, self.group)
                pipe.xinfo_groups(shard.updates)
                pipe.xrevrange(shard.updates, count=1)
                consumers, groups, newest = await pipe.execute()
        except ResponseError as exc:  # no stream or no group yet: nothing waits
            log.debug("stall check failed", extra={"shard": shard.index, "error": repr(exc)})
            return False
        info = find_group(groups, self.group)
        if info is None or not newest:
            return False
        delivered = as_text(info.get("last-delivered-id", b"0-0"))
        undelivered = id_order(as_text(newest[0][0])) > id_order(delivered)
        idle = {}
        for consumer in consumers:
            fields = {as_text(k): v for k, v in consumer.items()}
            idle[as_text(fields.get("name", b""))] = int(fields.get("idle", 0))
        owners = shard_readers(set(self.live) | {self.consumer}, shard.index,
                               self.namespace.shards)
        return stalled(idle, owners, undelivered, self.ttl_ms)

    async def run(self, stopping: asyncio.Event) -> None:
        """Beat every ``ttl / 5`` seconds until ``stopping`` is set, then
        leave at once: a draining worker reads nothing new, so the others
        take its shards while it applies what it read. A failed beat keeps
        the last view: a worker that cannot reach Redis reads nothing
        anyway, and the others take its shards after the TTL. A failure of
        another kind is counted as a failed step and logged."""
        if not self.enabled:
            return
        while True:
            try:
                await asyncio.wait_for(stopping.wait(), timeout=self.beat_period)
                await self.leave()
                return
            except TimeoutError:
                pass
            try:
                await self.beat()
            except Exception as exc:
                if is_redis_failure(exc):
                    log.warning("worker heartbeat failed", extra={"error": repr(exc)})
                else:  # a bug or an odd reply: never the worker's end
                    self.metrics.step_failed(exc)
                    log.exception("worker heartbeat failed unexpectedly")
            end_if_cancelled()  # (a cancel a redis-py call dropped)

    async def leave(self) -> None:
        """Leave the live set, so the others take this worker's shards now."""
        if not self.enabled:
            return
        try:
            await beat_worker(self._script,
                              build_beat(self.key, self.consumer, self.ttl_ms, "leave"))
        except Exception as exc:
            if not is_redis_failure(exc):
                raise
            log.warning("could not leave the workers set", extra={"error": repr(exc)})


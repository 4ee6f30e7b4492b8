"""What a worker does about entries that are pending but not being applied:
its own, delivered by a read whose reply was lost (take-back), and a dead
worker's, idle in the group's pending list (reclaim); and leaving the group
cleanly. A mixin of :class:`~processor.worker.Worker`: these run inside its
shard loops, between batches, and apply through the same transitions."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ResponseError

from processor.connections import TRANSIENT, as_text, is_transient
from processor.keys import Namespace, Shard
from processor.membership import Membership
from processor.metrics import Metrics

log = logging.getLogger("processor.worker")


class Recovery:
    """Take-back, reclaim and leaving, for :class:`~processor.worker.Worker`."""

    client: Any
    config: Any  # WorkerConfig
    metrics: Metrics
    namespace: Namespace
    _orphans: set[int]
    _claimed: set[int]  # shards with entries reclaimed and being applied
    _reclaim_cursor: dict[int, str]
    # Worker's: apply entries (a batch, or one by one if the batch fails).
    _apply_isolated: Callable[..., Awaitable[None]]
    membership: Membership
    _held_ids: Callable[[Shard], set[str]]  # Holding's

    async def _take_back(self, shard: Shard) -> None:
        """Apply what this consumer was delivered but never received, now,
        rather than after --reclaim-idle-ms (a Redis restart or a dropped
        connection would otherwise hold the shard's watermark, so every turn
        of the shard, that long). Each shard loop reads, applies and acks in
        turn, so this consumer's pending entries of a shard are all orphans
        when its loop is back here (or ones left pending on purpose after a
        failure: applying them again is what a reclaim would do)."""
        cfg = self.config
        start = "0"
        while True:
            reply = await self.client.xreadgroup(cfg.group, cfg.consumer,
                                                 {shard.updates: start}, count=cfg.batch)
            found = [entry for _stream, entries in reply or [] for entry in entries]
            if not found:
                break
            start = as_text(found[-1][0])
            # Held entries (--hold-turns) are pending on purpose, not orphans.
            held = self._held_ids(shard)
            entries = [(i, f) for i, f in found if f and as_text(i) not in held]
            gone = [i for i, f in found if not f]
            if gone:  # deleted while pending: nothing to apply
                await self.client.xack(shard.updates, cfg.group, *gone)
            if entries:
                log.info("took back undelivered entries",
                         extra={"shard": shard.index, "count": len(entries)})
                await self._apply_isolated(shard, entries, await self._deliveries(shard, entries))
        self._orphans.discard(shard.index)

    async def _deliveries(self, shard: Shard, entries: list[tuple[Any, Any]]) -> dict[str, int]:
        """How many times each of this consumer's pending entries was delivered."""
        pending = await self.client.xpending_range(
            shard.updates, self.config.group, min=entries[0][0], max=entries[-1][0],
            count=len(entries) * 2, consumername=self.config.consumer,
        )
        return {as_text(p["message_id"]): int(p["times_delivered"]) for p in pending}

    async def reclaim(self, shard: Shard) -> None:
        """Take over entries idle in any consumer's pending list (a dead worker's)."""
        cfg = self.config
        await self._claim_departed(shard)
        # XAUTOCLAIM scans at most 10 * count pending entries per call: go on
        # from where the last call stopped, so idle entries behind many
        # in-flight ones are found too.
        try:
            reply = await self.client.xautoclaim(
                shard.updates, cfg.group, cfg.consumer, min_idle_time=cfg.reclaim_idle_ms,
                start_id=self._reclaim_cursor.get(shard.index, "0-0"), count=cfg.batch,
            )
        except Exception as exc:
            if is_transient(exc):  # claimed for this consumer, maybe, and the reply lost
                self._orphans.add(shard.index)
            raise
        self._reclaim_cursor[shard.index] = as_text(reply[0])
        entries = [(i, f) for i, f in reply[1] if f is not None]
        gone = [i for i, f in reply[1] if f is None]
        if gone:  # Redis 6.2 reports deleted entries as nil: nothing to apply
            await self.client.xack(shard.updates, cfg.group, *gone)
        await self._apply_claimed(shard, entries)

    async def _claim_departed(self, shard: Shard) -> None:
        """Take over at once what consumers that left the live set still have
        pending on ``shard`` (their beats stopped for --worker-ttl and they have
        not read since: dead), instead of after --reclaim-idle-ms. A turn a dead
        worker held, cancelled meanwhile, waits for exactly those entries
        (docs/design.md, *Cancellation*). Only with shard affinity: without
        beats no worker knows who is alive."""
        membership, cfg = self.membership, self.config
        if not membership.enabled:
            return
        live = {*membership.live, cfg.consumer}
        for info in await self.client.xinfo_consumers(shard.updates, cfg.group):
            name = as_text(info["name"])
            if name in live or not info["pending"] or info["idle"] < membership.ttl_ms:
                continue
            pending = await self.client.xpending_range(
                shard.updates, cfg.group, min="-", max="+", count=cfg.batch, consumername=name)
            ids = [p["message_id"] for p in pending]
            if not ids:
                continue
            try:
                claimed = await self.client.xclaim(shard.updates, cfg.group, cfg.consumer,
                                                   min_idle_time=0, message_ids=ids)
            except Exception as exc:
                if is_transient(exc):
                    self._orphans.add(shard.index)
                raise
            entries = [(i, f) for i, f in claimed if f]
            log.info("took over a departed worker's entries",
                     extra={"shard": shard.index, "consumer": name, "count": len(entries)})
            await self._apply_claimed(shard, entries)

    async def _apply_claimed(self, shard: Shard, entries: list[tuple[Any, Any]]) -> None:
        """Apply entries this consumer just claimed from another."""
        if not entries:
            return
        # Pending to this consumer now, neither held nor applied until applied
        # below: no floor for the watermark meanwhile (holding._floor); if
        # applying them fails, they are taken back before the next read.
        self._claimed.add(shard.index)
        try:
            deliveries = await self._deliveries(shard, entries)
            self.metrics.read(shard.index, len(entries), "reclaim")
            log.info("reclaimed entries", extra={"shard": shard.index, "count": len(entries)})
            await self._apply_isolated(shard, entries, deliveries)
        except BaseException:
            self._orphans.add(shard.index)
            raise
        finally:
            self._claimed.discard(shard.index)

    async def _leave(self) -> None:
        """Remove this consumer from each group once it holds no pending entry."""
        for shard in self.namespace.all():
            try:
                info = await self.client.xpending_range(
                    shard.updates, self.config.group, min="-", max="+", count=1,
                    consumername=self.config.consumer,
                )
                if not info:
                    await self.client.xgroup_delconsumer(
                        shard.updates, self.config.group, self.config.consumer
                    )
            except (*TRANSIENT, ResponseError) as exc:
                log.warning("could not remove consumer", extra={"error": repr(exc)})


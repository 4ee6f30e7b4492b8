"""The per-shard loop of a worker (``ShardRunner``, one per shard): a
reader task that reads (and decodes) one batch ahead, and an apply loop that
applies batches in the order they were read, then sweeps and reclaims. One
failing step never stops the loop: it is counted, logged and retried later
(its entries stay pending). The transitions are the worker's and its parts'
(``Worker``); the shard's state is its
``ShardState``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from redis.exceptions import ResponseError

from processor.redis_io.connections import read_raw
from processor.redis_io.read_budget import ReadBudget, ReplyTooLarge, bounded
from processor.redis_io.replies import RawEntry, as_text
from processor.scripts.calls import BatchOptions
from processor.scripts.stored_calls import ApplyCall, build_apply
from processor.worker.budget import read_count
from processor.worker.config import WorkerConfig
from processor.worker.continuity import Continuity, is_nogroup
from processor.worker.handoff import Batch, Handoff, next_batch
from processor.worker.held.batch import HeldCall, decode_batch
from processor.worker.held.path import HeldPath
from processor.worker.live_progress import LivePublisher
from processor.worker.membership import Membership
from processor.worker.metrics import Metrics
from processor.worker.paths import Paths
from processor.worker.recovery import Recovery
from processor.worker.shard_state import ShardState
from processor.worker.shell import cancel_pending, end_if_cancelled, now_ms
from processor.worker.sweeping import Sweeper

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

T = TypeVar("T")

log = logging.getLogger("processor.worker")

#: How a step of the shard loop went (``ShardRunner._guarded``).
Step = Literal["done", "failed", "vanished"]
DONE: Step = "done"
FAILED: Step = "failed"
VANISHED: Step = "vanished"  # its stream or group was missing, and is put back


class RunnerHost(Protocol):
    """What a shard runner uses of the worker that owns it
    (``Worker``): its parts, and the steps that
    stay the worker's. A protocol, so that this module never imports the
    worker (which imports it)."""

    client: RedisClient
    config: WorkerConfig
    metrics: Metrics
    options: BatchOptions
    membership: Membership
    held: HeldPath
    live: LivePublisher
    recovery: Recovery
    continuity: Continuity
    paths: Paths
    sweeper: Sweeper
    read_budget: int

    @property
    def stopping(self) -> bool: ...

    async def retrying(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...



class ShardRunner:
    """Reading ahead, applying, sweeping and reclaiming one shard: one per
    shard of a ``Worker``, which owns it and
    whose parts (held, stored, recovery, continuity) it runs."""

    def __init__(self, worker: RunnerHost, state: ShardState) -> None:
        self.worker = worker
        self.state = state
        #: How the shard's next batch is read: ``read_redis`` (a test
        #: may give another source).
        self.read: Callable[[], Awaitable[list[RawEntry]]] = self.read_redis
        self.shard = state.shard

    @property
    def stopping(self) -> bool:
        return self.worker.stopping

    async def run(self) -> None:
        """Read ahead while applying: a reader task reads and decodes the next
        batch while this one waits for the current batch's scripts, so the
        worker's Python and redis-server work at the same time. Applying,
        finalising, sweeping and reclaiming stay one after the other here."""
        batches = Handoff()
        reader = asyncio.create_task(self._read_ahead(batches))
        try:
            await self._apply_loop(batches, reader)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self.worker.held.abandon(self.shard)

    async def _read_ahead(self, batches: Handoff) -> None:
        """Read and decode batches until stopping (the apply loop then applies
        what was read, and stops once this task is done and the queue empty)."""
        shard, retrying = self.shard, self.worker.retrying
        while not self.stopping:
            end_if_cancelled()
            try:
                batch = await retrying(self._take_back_then_read, batches)
                batch.call = self._prepare(batch)
                await self.worker.held.open_ahead(shard, batch.call)
                await batches.put(batch)
                await batches.taken()  # one batch ahead of the apply loop, no more
            except asyncio.CancelledError as exc:
                if cancel_pending() or self.stopping:
                    raise
                await self._step_failed(exc, "read was cancelled from inside")
            except Exception as exc:
                if self.stopping:
                    break
                await self._step_failed(exc, "read failed")

    async def _take_back_then_read(self, batches: Handoff | None) -> Batch:
        """The shard's next batch, after taking back what a lost reply left
        pending to this consumer. Retried as a whole: a read whose reply was
        lost is never sent again before the take-back, since that
        ``XREADGROUP >`` would deliver the entries after the lost ones first,
        and a held turn would be checkpointed or ended without them
        (docs/design.md, *Recovery*)."""
        shard, state = self.shard, self.state
        if state.orphans:
            if batches is not None:  # (reading ahead)
                await batches.join()  # nothing read earlier is still waiting to be applied
            await self.worker.held.settle(shard)  # (nor finalised)
            try:
                await self.worker.recovery.take_back(shard)
            except ResponseError as exc:
                if not is_nogroup(exc):
                    raise
                return Batch(await self._group_vanished(), self.worker.continuity.generation)
        generation = self.worker.continuity.generation
        return Batch(await self.read(), generation)

    async def _group_vanished(self) -> list[RawEntry]:
        """The group (or the stream) vanished under this worker: put back
        where it was, or the namespace's whole state is gone (continuity.py),
        and its groups come back a little later: wait as an idle read would.
        No entries: the next read goes on from there."""
        if await self.worker.continuity.group_vanished(self.shard):
            await asyncio.sleep(self.worker.config.block_ms / 1000)
        return []

    def _prepare(self, batch: Batch) -> ApplyCall | HeldCall | None:
        """Decode a batch into its script call ahead of applying it; None (decode
        again when applying, entry by entry if need be) if that fails."""
        entries = batch.entries
        if not entries:
            return None
        shard = self.shard
        try:
            if self.worker.held.holds_on(shard):  # grouped for holding (held/batch.py)
                return decode_batch(shard, entries, self.worker.options, now_ms())
            call = build_apply(shard, batch.usual, {}, self.worker.options, now_ms())
        except Exception:
            log.exception("could not prepare a batch", extra={"shard": self.shard.index})
            return None
        call.newest = True  # read with XREADGROUP >
        call.read_from = as_text(entries[0][0])
        return call

    async def _apply_loop(self, batches: asyncio.Queue[Batch], reader: asyncio.Task[None]) -> None:
        shard, retrying = self.shard, self.worker.retrying
        next_sweep = next_reclaim = 0.0
        read_before = False
        while (batch := await next_batch(batches, reader)) is not None:
            try:
                end_if_cancelled()
                if not self.worker.membership.sole_reader(shard.index):
                    self.state.mirrors.shared()  # (stale once another worker ends a turn)
                await self._step(batch)
                if self.worker.config.progress:  # (the live progress that waited)
                    await self._guarded(self.worker.live.publish_waiting, shard)
                now = time.monotonic()
                reads = self.worker.membership.reads(shard.index)
                if reads and not read_before:
                    next_reclaim = 0.0  # a shard just taken over: its dead owner's entries now
                read_before = reads
                # Held turns are spilled when due, and all of them once
                # another worker reads the shard (it cannot finish them).
                await self._guarded(retrying, self.worker.held.spill_due, shard,
                                    not self.worker.held.holds_on(shard))
                await self._guarded(retrying, self.worker.sweeper.retry_cancels, shard)
                if now >= next_sweep:
                    # A shard this worker does not read gets a slow sweep
                    # for cancels only, so that a cancel is published within
                    # a beat even while the shard's readers are dead; its
                    # readers finalise the rest, from their own mirrors.
                    await self._guarded(retrying, self.worker.sweeper.sweep, shard, reads)
                    next_sweep = now + (self.worker.config.sweep_interval if reads
                                        else self.worker.membership.beat_period)
                if reads and now >= next_reclaim:
                    await self._guarded(self.worker.held.settle, shard)
                    await self._guarded(retrying, self.worker.recovery.reclaim, shard)
                    next_reclaim = now + self.worker.config.reclaim_idle_ms / 2000
            finally:
                batches.task_done()
        # Stopping: what is held goes to apply_entries (stored, acked) before
        # leaving; if Redis is gone, it stays pending for a reclaim.
        await self._guarded(self.worker.held.spill_due, shard, True)

    async def _step(self, batch: Batch) -> None:
        shard, state, retrying = self.shard, self.state, self.worker.retrying
        if state.lost or batch.generation != self.worker.continuity.generation:
            await self._guarded(self.worker.held.settle, shard)  # (what it finalises, known first)
        if state.lost:  # the namespace's state found lost:
            await self._guarded(retrying, self.worker.continuity.lose_shard_now, shard)
        if self.worker.config.progress:  # (how far behind the read is stretches the live interval)
            self.worker.live.read(shard, batch.entries[-1][0] if batch.entries else None, now_ms())
        if batch.entries:
            self.worker.metrics.read(shard.index, len(batch.entries))
            # On a connection error the same batch is applied again: the XACK
            # fence makes that idempotent, and nothing waits for a reclaim.
            # Its group vanished: applied again once it is put back with this
            # worker's pending entries (continuity.py), or, the namespace's
            # state lost, what Redis no longer has goes to the DLQ.
            try:
                for _ in range(3):
                    if batch.generation != self.worker.continuity.generation:
                        await self._guarded(retrying, self.worker.continuity.after_loss, shard,
                                            batch.usual)
                        break
                    done = await self._guarded(retrying, self.worker.paths.apply_read,
                                               shard, batch)
                    if done is not VANISHED:
                        break
            finally:
                state.floor_marks.routed(as_text(batch.entries[0][0]),
                                         as_text(batch.entries[-1][0]))
                state.batch_done(batch.entries)

    async def _guarded(self, fn: Callable[..., Awaitable[object]], *args: Any) -> Step:
        """One step of the shard loop; a failure is logged and counted, never
        fatal. A stream or group found missing is put back (continuity.py):
        ``VANISHED``, so that the caller may run the step again."""
        try:
            await fn(*args)
            return DONE
        except ResponseError as exc:
            if not is_nogroup(exc):
                return await self._failed(exc)
            try:
                await self.worker.retrying(self.worker.continuity.group_vanished, self.shard)
            except Exception as again:
                return await self._failed(again)
            return VANISHED
        except asyncio.CancelledError as exc:
            if cancel_pending():
                raise  # this task is being cancelled: let run() unwind
            # A CancelledError nobody asked this task for (raised inside a
            # library, or an inner future cancelled under us) is a failed
            # step like any other, not a reason to stop serving the shard.
            # What it interrupted is finished by a later sweep or reclaim.
            if not self.stopping:
                await self._step_failed(exc, "shard loop step was cancelled from inside")
            return FAILED
        except Exception as exc:
            return await self._failed(exc)

    async def _failed(self, exc: Exception) -> Step:
        """A step failed (inside its ``except``)."""
        if self.stopping:
            log.warning("stopping without finishing a step", exc_info=True,
                        extra={"shard": self.shard.index})
            return FAILED
        # A bug or an unexpected reply must not stop the worker: what
        # was not applied stays pending, is reclaimed and, if it keeps
        # failing, dead-lettered after max_deliveries.
        await self._step_failed(exc, "shard loop step failed")
        return FAILED

    async def _step_failed(self, exc: BaseException, message: str) -> None:
        """Count and log a failed step (inside its ``except``), then pause before the next."""
        self.worker.metrics.step_failed(exc)
        log.exception(message, extra={"shard": self.shard.index})
        await asyncio.sleep(min(1.0, self.worker.config.sweep_interval * 5))

    async def read_once(self) -> None:
        """Read and apply one batch, without reading ahead (a single step)."""
        shard, state, retrying = self.shard, self.state, self.worker.retrying
        entries = (await retrying(self._take_back_then_read, None)).entries
        if entries:
            self.worker.metrics.read(shard.index, len(entries))
            try:
                await retrying(self.worker.paths.apply_read, shard, Batch(entries))
                await self.worker.held.settle(shard)
            finally:
                state.floor_marks.routed(as_text(entries[0][0]), as_text(entries[-1][0]))
                state.batch_done(entries)

    async def read_redis(self) -> list[RawEntry]:
        """The shard's next batch, each entry as the reply holds it
        (``connections.read_raw``: the held path groups those directly, the
        stored path takes them in the usual shape, ``replies.entries_of``)."""
        shard, state = self.shard, self.state
        if not self.worker.membership.reads(shard.index):
            # Another worker reads this shard (shard affinity): wait as long
            # as an idle read would, so the loop's cancel sweeps keep their pace.
            await asyncio.sleep(self.worker.config.block_ms / 1000)
            return []
        cfg = self.worker.config
        # Bounded in bytes (processor.worker.budget): as many entries as fit the
        # budget at the size of the last ones; a reply past it is cut.
        count = state.read_count
        budget = ReadBudget(self.worker.read_budget)
        try:
            with bounded(budget):
                entries = await read_raw(self.worker.client, cfg.group, cfg.consumer,
                                         shard.updates, count, cfg.block_ms)
        except ReplyTooLarge as exc:
            # Delivered to this consumer, never received: taken back (bounded
            # too) before the next read, one entry first, then as many as fit
            # at its size (each cut read delivers its entries once more).
            state.reply_lost(cut=True)
            log.info("read past its byte budget, cut: reading fewer entries",
                     extra={"shard": shard.index, "count": count, "budget": exc.limit})
            return []
        except ResponseError as exc:
            if not is_nogroup(exc):
                raise
            return await self._group_vanished()
        except Exception:
            # Redis may have delivered the batch and the reply be lost (an
            # outage, or a MemoryError reading it): taken back, delivery
            # counts first, before the next read.
            state.reply_lost()
            raise
        if entries:
            last = as_text(entries[-1][0])
            state.read_done(last, read_count(self.worker.read_budget, cfg.batch,
                                             budget.bytes, len(entries)))
            state.read_batch(entries)  # until applied (_step): restored if the group goes
            if cfg.hold_turns:
                state.floor_marks.read(as_text(entries[0][0]), last)
        return entries


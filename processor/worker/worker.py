"""``processor run``: one worker consuming every shard of a namespace.

The imperative shell. Per shard, a runner (:mod:`processor.worker.runner`) reads
batches with XREADGROUP, one ahead, decodes them (:mod:`processor.worker.batches`),
holds them (:mod:`processor.worker.held.holding`) or stores them with one
``apply_entries`` call and finalises the turns that call reports ready
(:mod:`processor.worker.stored.storing`: from the worker's own copy,
:mod:`processor.worker.stored.mirror`,
or a replay of the stored records, :mod:`processor.engine.render`; then one
``finalise_turns`` call). Between batches it sweeps the shard (timeouts,
cancellation keys, turns left ready by a dead worker) and reclaims entries
idle in a dead consumer's pending list (:mod:`processor.worker.recovery`). Which
entry merges where is decided by the data and the scripts, never here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import NoPermissionError, ResponseError

from processor.engine.render import Reason
from processor.redis_io.connections import is_transient, until_done
from processor.redis_io.replies import as_text, stream_entry
from processor.scripts import Scripts, library
from processor.scripts.meta import Meta, check, create
from processor.wire import defaults
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace, Shard
from processor.worker.batches import ApplyCall, parse_member
from processor.worker.budget import COPY_BYTES, HELD_BYTES, read_bytes
from processor.worker.cancel_requests import CancelRequests
from processor.worker.config import WorkerConfig, default_consumer
from processor.worker.continuity import Continuity, is_nogroup
from processor.worker.held.held_batch import HeldCall
from processor.worker.held.hold import Holds
from processor.worker.held.holding import HeldPath
from processor.worker.inbox import Admitter
from processor.worker.membership import Membership
from processor.worker.metrics import DeadLetterLog, Metrics
from processor.worker.publishing import LivePublisher
from processor.worker.recovery import Recovery
from processor.worker.runner import ShardRunner
from processor.worker.shard_state import ShardState
from processor.worker.shell import Shell, run_together
from processor.worker.stored.mirror import Mirrors
from processor.worker.stored.storing import StoredPath

__all__ = ["CANCEL_CYCLE_S", "Worker", "WorkerConfig", "cancel_slice", "default_consumer"]

T = TypeVar("T")

log = logging.getLogger("processor.worker")


# Every active turn's cancel key is read at least once per this many seconds,
# whatever their number: a cancel's terminal event is due within 1 s (p99).
CANCEL_CYCLE_S = 0.5


def cancel_slice(active: int, configured: int, sweep_interval: float) -> int:
    """How many cancel keys one sweep reads (one MGET): at least ``configured``,
    more when the shard has so many active turns that slices of that size
    would take longer than :data:`CANCEL_CYCLE_S` to go round them all."""
    sweeps_per_cycle = max(1, int(CANCEL_CYCLE_S / max(sweep_interval, 1e-3)))
    return max(configured, -(-active // sweeps_per_cycle))


class Worker:
    """One consumer in each shard's group. ``await run()``; ``stop()`` drains.

    Made of parts it owns (docs/design.md, *The worker: parts it owns*): its
    :class:`~processor.worker.membership.Membership`, one
    :class:`~processor.worker.shard_state.ShardState` and one
    :class:`~processor.worker.runner.ShardRunner` per shard, and the paths
    the runners run: :class:`~processor.worker.stored.storing.StoredPath`,
    :class:`~processor.worker.held.holding.HeldPath` (given the stored path),
    :class:`~processor.worker.recovery.Recovery`,
    :class:`~processor.worker.continuity.Continuity` and, given to both paths,
    :class:`~processor.worker.publishing.LivePublisher`."""

    def __init__(self, client: Any, config: WorkerConfig, metrics: Metrics | None = None) -> None:
        self.client = client
        self.config = config
        self.metrics = metrics or Metrics()
        self.options = config.batch_options()
        self.namespace = Namespace(config.namespace, config.shards)
        self.scripts = Scripts(client)
        self._stopping = asyncio.Event()
        self.dead_letters = DeadLetterLog()  # dead letters in the log, rate-limited
        shell = Shell(client, config, self.options, self.scripts, self.metrics,
                      self.dead_letters)
        # Byte budgets (processor.worker.budget): the worker's, shared by its shards.
        self.read_budget = read_bytes(config.shards, config.limits.max_entry_bytes)
        # Two caches of turns per shard, each with its own budgets: the copies
        # of stored turns (--mirror-turns, COPY_BYTES; 0 turns = always read
        # back) and the held turns (HELD_TURNS, HELD_BYTES).
        mirror_budget, held_budget = COPY_BYTES // config.shards, HELD_BYTES // config.shards
        self._shards: dict[int, ShardState] = {
            s.index: ShardState(s, Holds(config.limits, defaults.HELD_TURNS, held_budget),
                                Mirrors(config.limits, config.mirror_turns, mirror_budget),
                                config.batch, config.hold_turns)
            for s in self.namespace.all()}
        self.membership = Membership(client, self.scripts.beat_worker, self.namespace,
                                     config.group, config.consumer, config.worker_ttl,
                                     config.affinity, self.metrics)
        self.ready = asyncio.Event()  # set once every group exists
        self.admitter = Admitter(client, self.scripts.admit_inbox, self.namespace,
                                 self.membership, self.metrics, self.dead_letters,
                                 config.dlq_maxlen, config.idle_wait)
        self.cancel_requests = CancelRequests(client, self.namespace, self.metrics,
                                              config.idle_wait)
        self.continuity = Continuity(shell, self.namespace, self._shards, self.membership,
                                     self.apply_isolated, self.stop, self._stopping,
                                     self.ensure_groups)
        self.live = LivePublisher(shell, self._shards, self.retrying)
        self.stored = StoredPath(shell, self._shards, self.continuity, self.live)
        self.held = HeldPath(shell, self._shards, self.membership, self.stored, self.continuity,
                             self.live, self.retrying)
        self.recovery = Recovery(shell, self.namespace, self._shards, self.membership,
                                 self.stored, self.apply_isolated, self.retrying,
                                 self.read_budget)
        self._runners = {i: ShardRunner(self, state) for i, state in self._shards.items()}

    def shard(self, index: int) -> ShardState:
        """Shard ``index``'s state in this worker."""
        return self._shards[index]

    @property
    def shards(self) -> list[ShardState]:
        """Every shard's state in this worker, by index."""
        return list(self._shards.values())

    def runner(self, index: int) -> ShardRunner:
        """Shard ``index``'s runner."""
        return self._runners[index]

    @property
    def meta(self) -> Meta | None:
        """The namespace's record (scripts.meta), read by :meth:`run`."""
        return self.continuity.meta

    @property
    def fatal(self) -> str | None:
        """Why the worker stopped by itself (:meth:`run` returned)."""
        return self.continuity.fatal

    def readiness(self) -> str | None:
        """What ``/readyz`` adds: the namespace's state lost, for a while after."""
        return self.continuity.readiness()

    def stop(self) -> None:
        """Stop reading; batches already read are applied and acked first."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        """Serve every shard until :meth:`stop`. Raises
        :class:`~processor.scripts.meta.Mismatch` at once when the namespace's record
        (written by the first worker or ``processor init``) has another
        shard count than this worker's."""
        self.continuity.meta = await self.retrying(self._open_namespace)
        await self.retrying(self.ensure_groups)
        await self.retrying(self.load_library)
        await self.retrying(self.membership.beat)
        self.ready.set()
        log.info("worker started", extra={"consumer": self.config.consumer,
                                          "shards": self.config.shards,
                                          "reads": sorted(self.membership.owned)})
        try:
            await run_together(self.membership.run(self._stopping),
                               self.continuity.watch_namespace(),
                               self.admitter.run(self._stopping),
                               self.cancel_requests.run(self._stopping),
                               *(runner.run() for runner in self._runners.values()))
        finally:
            await self.membership.leave()
            await self.recovery.leave()

    async def _open_namespace(self) -> Meta:
        """The namespace's record, written now with this worker's shards and
        group if there is none; refused if its shard count is another
        (``processor run`` checks the group, service.open_namespace)."""
        cfg = self.config
        meta = await create(self.client, cfg.namespace, cfg.shards, cfg.group)
        check(meta, cfg.shards, "this worker's shards")
        return meta

    async def ensure_groups(self) -> None:
        """Create each shard's consumer group (and stream) if missing."""
        for shard in self.namespace.all():
            try:
                await self.client.xgroup_create(shard.updates, self.config.group, id="0",
                                                mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def load_library(self) -> None:
        """Load the producers' function library (:mod:`processor.scripts.library`).
        Refused (a user without FUNCTION LOAD): logged, not fatal, since
        merging does not need it; producers on Redis 7 do."""
        try:
            await library.load(self.client)
        except NoPermissionError as exc:
            log.error("cannot load the producers' function library: producers fail until "
                      "it is loaded (processor init as a user allowed FUNCTION LOAD)",
                      extra={"library": library.library_name(), "error": str(exc)})

    async def retrying(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn`` until it succeeds, waiting with backoff and jitter on
        connection errors (Redis restarting, failing over, unreachable),
        each counted and logged (:func:`~processor.redis_io.connections.until_done`).
        Once stopping, it gives up: what was read stays pending for another
        worker to reclaim, and a SIGTERM never waits for Redis to return."""
        result: T = await until_done(fn, *args, give_up=lambda: self.stopping,
                                     on_retry=self._redis_down)
        return result

    def _redis_down(self, exc: BaseException | None) -> None:
        self.metrics.redis_error(exc)
        log.warning("redis unavailable, retrying", extra={"error": repr(exc)})

    # ------------------------------------------------------------ transitions

    async def apply_isolated(
        self, shard: Shard, entries: list[tuple[Any, Any]], deliveries: dict[str, int],
        call: ApplyCall | HeldCall | None = None,
    ) -> None:
        """Apply a batch; if it fails (not a connection error), apply its entries
        one by one, so that one entry that always fails stays pending alone
        (and reaches max_deliveries alone) instead of taking its batch along."""
        try:
            await self.process_batch(shard, entries, deliveries, call)
        except Exception as exc:
            if is_transient(exc) or is_nogroup(exc):  # (the group: continuity.py)
                raise
            if self.config.hold_turns:
                # Some may stay pending, neither held nor applied: no floor
                # (ShardState.floor) until they are taken back before the next read.
                self._shards[shard.index].orphans = True
            if len(entries) == 1:
                log.exception("entry failed, left pending for redelivery",
                              extra={"shard": shard.index, "entry_id": as_text(entries[0][0])})
                return
            log.exception("batch failed, applying its entries one by one",
                          extra={"shard": shard.index, "count": len(entries)})
            for entry in entries:
                await self.apply_isolated(shard, [entry], deliveries)

    async def process_batch(
        self, shard: Shard, entries: list[tuple[Any, Any]], deliveries: dict[str, int],
        call: ApplyCall | HeldCall | None = None,
    ) -> None:
        """Apply a batch (``call``: its script call, if already built): hold
        it (:mod:`processor.worker.held.holding`) or store it."""
        if isinstance(call, HeldCall):  # grouped for holding (ShardRunner._prepare)
            await self.held.apply_held(shard, entries, call)
        elif entries and entries[0][1].__class__ is not dict:  # read raw (read_raw)
            await self.stored.store(shard, list(map(stream_entry, entries)), deliveries, call)
        else:
            await self.stored.store(shard, entries, deliveries, call)

    async def sweep(self, shard: Shard, whole: bool = True) -> None:
        """Finalise turns made ready, timed out or cancelled while no entry
        came; with ``whole=False`` (a shard this worker does not read) only
        the cancelled ones."""
        cfg = self.config
        state = self._shards[shard.index]
        start = state.cursor
        # Sized from the active count the last sweep saw (this one learns it).
        size = cancel_slice(state.active, cfg.cancel_slice,
                            cfg.sweep_interval)
        _now, ready, expired, cancelled, sliced, count = await self.scripts.sweep_shard(
            keys=[shard.updates, shard.active, shard.closing],
            args=[cfg.group, int(cfg.limits.turn_timeout * 1000),
                  self.options.ready_limit if whole else 0, start, size, cfg.consumer,
                  state.floor(), shard.tag],
        )
        state.active = int(count)
        state.cursor = 0 if start + size >= count else start + int(sliced)
        todo: dict[TurnKey, Reason] = {parse_member(m): "closing" for m in ready}
        for tk in cancelled:
            todo.setdefault(TurnKey.decode(as_text(tk)), "cancel")
        for tk in expired:
            todo.setdefault(TurnKey.decode(as_text(tk)), "timeout")
        await self.held.publish_held_ends(shard, todo)
        if todo:
            await self.stored.finalise(shard, todo)

    async def _cancelled(
        self, shard: Shard, turns: list[TurnKey]
    ) -> tuple[list[TurnKey], list[TurnKey]]:
        """Of ``turns``, the cancelled ones to finalise now, and those that must
        wait (``cancelled_turns``: another worker holds them, or an entry up to
        their cut is still pending)."""
        keys = [shard.updates]
        for key in turns:
            keys += [shard.cancel(key.response_id), shard.turn(key.encode())]
        ready, waiting = await self.scripts.cancelled_turns(
            keys=keys,
            args=[self.config.group, self.config.consumer, self._shards[shard.index].floor()])
        return ([turns[int(i) - 1] for i in ready], [turns[int(i) - 1] for i in waiting])

    async def retry_cancels(self, shard: Shard) -> None:
        """Finalise the cancelled turns a finalise left waiting for an entry up
        to their cut (docs/design.md, *Cancellation*), as soon as they can be:
        the next step after the entry is applied, not the next sweep."""
        waiting = self._shards[shard.index].waiting_cancels
        if not waiting:
            return
        turns = list(waiting)
        ready, still = await self._cancelled(shard, turns)
        waiting.intersection_update(still)
        if ready:
            todo: dict[TurnKey, Reason] = {key: "cancel" for key in ready}
            await self.held.publish_held_ends(shard, todo)
            if todo:
                await self.stored.finalise(shard, todo)

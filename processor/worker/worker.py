"""``processor run``: one worker consuming every shard of a namespace.

The imperative shell. Per shard, a loop (:mod:`processor.worker.shard_loop`) reads
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
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from processor.engine.lifecycle import Limits
from processor.engine.render import Reason
from processor.redis_io.connections import is_transient, until_done
from processor.redis_io.replies import as_text, stream_entry
from processor.scripts import Scripts, library
from processor.scripts.meta import Meta, check, create
from processor.wire import defaults
from processor.wire.ids import TurnKey
from processor.wire.keys import DEFAULT_GROUP, DEFAULT_NAMESPACE, Namespace, Shard
from processor.worker.batches import (
    ApplyCall,
    BatchOptions,
    parse_member,
)
from processor.worker.budget import COPY_BYTES, HELD_BYTES, read_bytes
from processor.worker.continuity import Continuity, is_nogroup
from processor.worker.held.hold import Floor, Holds
from processor.worker.held.holding import Holding
from processor.worker.inbox import Admitter
from processor.worker.membership import Membership
from processor.worker.metrics import DeadLetterLog, Metrics
from processor.worker.publishing import Publishing
from processor.worker.recovery import Recovery
from processor.worker.shard_loop import ShardLoop
from processor.worker.stored.mirror import Mirrors
from processor.worker.stored.storing import Storing

log = logging.getLogger("processor.worker")


def default_consumer() -> str:
    """A consumer name unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerConfig:
    """Everything ``processor run`` can be told (see ``processor run --help``)."""

    namespace: str = DEFAULT_NAMESPACE
    shards: int = 1
    group: str = DEFAULT_GROUP
    consumer: str = field(default_factory=default_consumer)
    limits: Limits = field(default_factory=Limits)
    progress: bool = True  # live progress events and each turn's live log (processor.engine.live)
    agui: bool = False
    batch: int = defaults.BATCH
    block_ms: int = defaults.BLOCK_MS
    sweep_interval: float = defaults.SWEEP_INTERVAL
    reclaim_idle_ms: int = defaults.RECLAIM_IDLE_MS
    max_deliveries: int = defaults.MAX_DELIVERIES
    affinity: bool = True
    worker_ttl: float = defaults.WORKER_TTL
    cancel_slice: int = defaults.CANCEL_SLICE
    merged_maxlen: int = defaults.MERGED_MAXLEN
    events_maxlen: int = defaults.EVENTS_MAXLEN
    dlq_maxlen: int = defaults.DLQ_MAXLEN
    done_ttl: int = defaults.DONE_TTL
    compact_threshold: int = defaults.COMPACT_THRESHOLD
    mirror_turns: int = defaults.MIRROR_TURNS
    hold_turns: bool = defaults.HOLD_TURNS
    hold_ms: int = defaults.HOLD_MS

    @property
    def holding(self) -> bool:
        """Whether batches read with XREADGROUP > are held (--hold-turns;
        processor.worker.held.holding)"""
        return self.hold_turns

    def batch_options(self) -> BatchOptions:
        return BatchOptions(
            group=self.group, shards=self.shards, limits=self.limits,
            max_deliveries=self.max_deliveries, events_maxlen=self.events_maxlen,
            dlq_maxlen=self.dlq_maxlen, merged_maxlen=self.merged_maxlen,
            done_ttl=self.done_ttl, ready_limit=max(self.batch, 100), agui=self.agui,
            compact_threshold=self.compact_threshold,
            live_ttl=self.done_ttl + max(1, int(self.limits.turn_timeout)),
        )


# Every active turn's cancel key is read at least once per this many seconds,
# whatever their number: a cancel's terminal event is due within 1 s (p99).
CANCEL_CYCLE_S = 0.5


def cancel_slice(active: int, configured: int, sweep_interval: float) -> int:
    """How many cancel keys one sweep reads (one MGET): at least ``configured``,
    more when the shard has so many active turns that slices of that size
    would take longer than :data:`CANCEL_CYCLE_S` to go round them all."""
    sweeps_per_cycle = max(1, int(CANCEL_CYCLE_S / max(sweep_interval, 1e-3)))
    return max(configured, -(-active // sweeps_per_cycle))


class Worker(ShardLoop, Recovery, Holding, Storing, Publishing, Continuity):
    """One consumer in each shard's group. ``await run()``; ``stop()`` drains."""

    def __init__(self, client: Any, config: WorkerConfig, metrics: Metrics | None = None) -> None:
        self.client = client
        self.config = config
        self.metrics = metrics or Metrics()
        self.options = config.batch_options()
        self.namespace = Namespace(config.namespace, config.shards)
        self.scripts = Scripts(client)
        self._stopping = asyncio.Event()
        self._cursor: dict[int, int] = {}
        self._active: dict[int, int] = {}  # active turns per shard, as last swept
        self._reclaim_cursor: dict[int, str] = {}
        # Shards where this consumer may hold entries it never received: a
        # read whose reply a connection error lost (and, at start, a previous
        # process with the same consumer name). See _take_back.
        self._orphans: set[int] = {s.index for s in self.namespace.all()}
        self._claimed: set[int] = set()  # reclaimed entries being applied (recovery.py)
        # Byte budgets (processor.worker.budget): the worker's, shared by its shards.
        self._read_budget = read_bytes(config.shards, config.limits.max_entry_bytes)
        self._read_counts: dict[int, int] = {}
        # Two caches of turns, each with its own budgets: the copies of stored
        # turns (--mirror-turns, COPY_BYTES; 0 turns = always read back) and the
        # held turns (HELD_TURNS, HELD_BYTES).
        mirror_budget, held_budget = COPY_BYTES // config.shards, HELD_BYTES // config.shards
        self._mirrors = {s.index: Mirrors(config.limits, config.mirror_turns, mirror_budget)
                         for s in self.namespace.all()}
        self._holds = {s.index: Holds(config.limits, defaults.HELD_TURNS, held_budget)
                       for s in self.namespace.all()}
        self._floors = {s.index: Floor() for s in self.namespace.all()}
        self._opening = {s.index: asyncio.Lock() for s in self.namespace.all()}
        # Per shard: cancelled turns whose finalise answered "not yet" (storing.py).
        self._waiting_cancels: dict[int, set[TurnKey]] = {
            s.index: set() for s in self.namespace.all()}
        self.membership = Membership(client, self.scripts.beat_worker, self.namespace,
                                     config.group, config.consumer, config.worker_ttl,
                                     config.affinity, self.metrics)
        self.ready = asyncio.Event()  # set once every group exists
        self.meta: Meta | None = None  # the namespace's record (scripts.meta), read by run()
        self.fatal: str | None = None  # why the worker stopped by itself (run() returned)
        self.dead_letters = DeadLetterLog()  # dead letters in the log, rate-limited
        self.admitter = Admitter(client, self.scripts.admit_inbox, self.namespace,
                                 self.membership, self.metrics, self.dead_letters,
                                 config.dlq_maxlen)
        self._init_continuity()

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
        self.meta = await self._retrying(self._open_namespace)
        await self._retrying(self.ensure_groups)
        await self._retrying(self.load_library)
        await self._retrying(self.membership.beat)
        self.ready.set()
        log.info("worker started", extra={"consumer": self.config.consumer,
                                          "shards": self.config.shards,
                                          "reads": sorted(self.membership.owned)})
        try:
            await asyncio.gather(self.membership.run(self._stopping), self._watch_namespace(),
                                 self.admitter.run(self._stopping),
                                 *(self._shard_loop(s) for s in self.namespace.all()))
        finally:
            await self.membership.leave()
            await self._leave()

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

    async def _retrying(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` until it succeeds, waiting with backoff and jitter on
        connection errors (Redis restarting, failing over, unreachable),
        each counted and logged (:func:`~processor.redis_io.connections.until_done`).
        Once stopping, it gives up: what was read stays pending for another
        worker to reclaim, and a SIGTERM never waits for Redis to return."""
        return await until_done(fn, *args, give_up=lambda: self.stopping,
                                on_retry=self._redis_down)

    def _redis_down(self, exc: BaseException | None) -> None:
        self.metrics.redis_error(exc)
        log.warning("redis unavailable, retrying", extra={"error": repr(exc)})

    # ------------------------------------------------------------ shard loop

    async def _apply_isolated(
        self, shard: Shard, entries: list[tuple[Any, Any]], deliveries: dict[str, int],
        call: ApplyCall | None = None,
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
                # (_floor) until they are taken back before the next read.
                self._orphans.add(shard.index)
            if len(entries) == 1:
                log.exception("entry failed, left pending for redelivery",
                              extra={"shard": shard.index, "entry_id": as_text(entries[0][0])})
                return
            log.exception("batch failed, applying its entries one by one",
                          extra={"shard": shard.index, "count": len(entries)})
            for entry in entries:
                await self._apply_isolated(shard, [entry], deliveries)

    # ------------------------------------------------------------ transitions

    async def process_batch(
        self, shard: Shard, entries: list[tuple[Any, Any]], deliveries: dict[str, int],
        call: ApplyCall | None = None,
    ) -> None:
        """Apply a batch (``call``: its script call, if already built): hold
        it (:mod:`processor.worker.held.holding`) or store it."""
        if call is not None and call.held is not None:  # (Holding._holding)
            await self._apply_held(shard, entries, call, call.held)
        elif entries and entries[0][1].__class__ is not dict:  # read raw (read_raw)
            await self._store(shard, list(map(stream_entry, entries)), deliveries, call)
        else:
            await self._store(shard, entries, deliveries, call)

    async def sweep(self, shard: Shard, whole: bool = True) -> None:
        """Finalise turns made ready, timed out or cancelled while no entry
        came; with ``whole=False`` (a shard this worker does not read) only
        the cancelled ones."""
        cfg = self.config
        start = self._cursor.get(shard.index, 0)
        # Sized from the active count the last sweep saw (this one learns it).
        size = cancel_slice(self._active.get(shard.index, 0), cfg.cancel_slice,
                            cfg.sweep_interval)
        _now, ready, expired, active, count = await self.scripts.sweep_shard(
            keys=[shard.updates, shard.active, shard.closing],
            args=[cfg.group, int(cfg.limits.turn_timeout * 1000),
                  self.options.ready_limit if whole else 0, start, size, cfg.consumer,
                  self._floor(shard)],
        )
        self._active[shard.index] = int(count)
        self._cursor[shard.index] = 0 if start + size >= count else start + len(active)
        todo: dict[TurnKey, Reason] = {parse_member(m): "closing" for m in ready}
        if active:
            turns = [TurnKey.decode(as_text(tk)) for tk in active]
            ready, _waiting = await self._cancelled(shard, turns)
            for key in ready:
                todo.setdefault(key, "cancel")
        for tk in expired:
            todo.setdefault(TurnKey.decode(as_text(tk)), "timeout")
        await self._publish_held_ends(shard, todo)
        if todo:
            await self.finalise(shard, todo)

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
            keys=keys, args=[self.config.group, self.config.consumer, self._floor(shard)])
        return ([turns[int(i) - 1] for i in ready], [turns[int(i) - 1] for i in waiting])

    async def retry_cancels(self, shard: Shard) -> None:
        """Finalise the cancelled turns a finalise left waiting for an entry up
        to their cut (docs/design.md, *Cancellation*), as soon as they can be:
        the next step after the entry is applied, not the next sweep."""
        waiting = self._waiting_cancels[shard.index]
        if not waiting:
            return
        turns = list(waiting)
        ready, still = await self._cancelled(shard, turns)
        waiting.intersection_update(still)
        if ready:
            todo: dict[TurnKey, Reason] = {key: "cancel" for key in ready}
            await self._publish_held_ends(shard, todo)
            if todo:
                await self.finalise(shard, todo)


"""``processor run``: one worker consuming every shard of a namespace.

The imperative shell. Per shard, a loop (:mod:`processor.shard_loop`) reads
batches with XREADGROUP, one ahead, decodes them (:mod:`processor.batches`),
applies them with one ``apply_entries`` call, and finalises the turns that
call reports ready (from the worker's own copy, :mod:`processor.mirror`, or
a replay of the stored records, :mod:`processor.settle`; then one
``finalise_turns`` call). Between batches it sweeps the shard (timeouts,
cancellation keys, turns left ready by a dead worker) and reclaims entries
idle in a dead consumer's pending list (:mod:`processor.recovery`). Which
entry merges where is decided by the data and the scripts, never here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from processor.batches import (
    ApplyCall,
    BatchOptions,
    build_apply,
    build_finalise,
    parse_member,
    parse_versions,
)
from processor.compaction import compact_turns
from processor.connections import as_text, handed_over, is_transient, until_done
from processor.hold import Floor, Holds
from processor.holding import Holding
from processor.ids import TurnKey
from processor.keys import DEFAULT_GROUP, DEFAULT_NAMESPACE, Namespace, Shard
from processor.lifecycle import Limits
from processor.membership import Membership
from processor.metrics import Metrics
from processor.mirror import MIRROR_BYTES, Ahead, Applied, Mirror, Mirrors
from processor.recovery import Recovery
from processor.scripts import Scripts
from processor.settle import Reason, Settled, render, settle, text_hash
from processor.shard_loop import ShardLoop, now_ms

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
    progress: bool = False
    agui: bool = False
    batch: int = 500
    block_ms: int = 100
    sweep_interval: float = 0.1
    reclaim_idle_ms: int = 30_000
    max_deliveries: int = 5
    affinity: bool = True
    worker_ttl: float = 5.0
    cancel_slice: int = 1000
    merged_maxlen: int = 100_000
    events_maxlen: int = 1_000_000
    dlq_maxlen: int = 100_000
    done_ttl: int = 86_400
    compact_threshold: int = 256
    mirror_turns: int = 10_000
    hold_turns: bool = False
    hold_ms: int = 5000

    def batch_options(self) -> BatchOptions:
        return BatchOptions(
            group=self.group, shards=self.shards, limits=self.limits, progress=self.progress,
            max_deliveries=self.max_deliveries, events_maxlen=self.events_maxlen,
            dlq_maxlen=self.dlq_maxlen, merged_maxlen=self.merged_maxlen,
            done_ttl=self.done_ttl, ready_limit=max(self.batch, 100), agui=self.agui,
            compact_threshold=self.compact_threshold,
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


class Worker(ShardLoop, Recovery, Holding):
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
        # The copies' byte budget is the worker's, shared by its shards.
        budget = MIRROR_BYTES // config.shards
        self._mirrors = {s.index: Mirrors(config.limits, config.mirror_turns, budget)
                         for s in self.namespace.all()}
        self._holds = {s.index: Holds(config.limits, config.mirror_turns, budget)
                       for s in self.namespace.all()}
        self._floors = {s.index: Floor() for s in self.namespace.all()}
        self._opening = {s.index: asyncio.Lock() for s in self.namespace.all()}
        self.membership = Membership(client, self.scripts.beat_worker, self.namespace,
                                     config.group, config.consumer, config.worker_ttl,
                                     config.affinity, self.metrics)
        self.ready = asyncio.Event()  # set once every group exists

    def stop(self) -> None:
        """Stop reading; batches already read are applied and acked first."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        await self._retrying(self.ensure_groups)
        await self._retrying(self.membership.beat)
        self.ready.set()
        log.info("worker started", extra={"consumer": self.config.consumer,
                                          "shards": self.config.shards,
                                          "reads": sorted(self.membership.owned)})
        try:
            await asyncio.gather(self.membership.run(self._stopping),
                                 *(self._shard_loop(s) for s in self.namespace.all()))
        finally:
            await self.membership.leave()
            await self._leave()

    async def ensure_groups(self) -> None:
        """Create each shard's consumer group (and stream) if missing."""
        for shard in self.namespace.all():
            try:
                await self.client.xgroup_create(shard.updates, self.config.group, id="0",
                                                mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def _retrying(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` until it succeeds, waiting with backoff and jitter on
        connection errors (Redis restarting, failing over, unreachable),
        each counted and logged (:func:`~processor.connections.until_done`).
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
            await self.apply(shard, entries, deliveries, call)
        except Exception as exc:
            if is_transient(exc):
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

    async def apply(
        self, shard: Shard, entries: list[tuple[Any, Any]], deliveries: dict[str, int],
        call: ApplyCall | None = None,
    ) -> None:
        """Apply a batch (``call``: its script call, if already built): hold
        it (:mod:`processor.holding`) or store it."""
        if call is not None and self._holding(call):
            await self._apply_held(shard, entries, call)
        else:
            await self._store(shard, entries, deliveries, call)

    async def _store(
        self, shard: Shard, entries: list[tuple[Any, Any]], deliveries: dict[str, int],
        call: ApplyCall | None = None,
    ) -> None:
        """Store a batch with ``apply_entries``, then finalise whatever it made ready."""
        if call is None:
            call = build_apply(shard, entries, deliveries, self.options, now_ms())
        applying = self.scripts.apply_entries(
            keys=call.keys, args=call.argv(self.config.consumer, self._floor(shard)))
        if call.newest:
            cancelled, ready, counts, full, versions, fresh = await self._follow_ahead(
                shard, call.applied, applying)
        else:
            cancelled, ready, counts, full, versions = await applying
            fresh = self._follow(shard, call.applied, versions, call.newest)
        self.metrics.applied(counts)
        todo: dict[TurnKey, Reason] = {parse_member(m): "closing" for m in ready}
        for tk in cancelled:
            todo.setdefault(TurnKey.decode(as_text(tk)), "cancel")
        if todo:
            await self.finalise(shard, todo, fresh)
        if full:
            await self._compact(shard, [TurnKey.decode(as_text(tk)) for tk in full])

    async def _follow_ahead(
        self, shard: Shard, applied: list[Applied], applying: Awaitable[list[Any]]
    ) -> tuple[Any, ...]:
        """``apply_entries``' reply and :meth:`_follow`'s turns, for a batch
        read with ``XREADGROUP >``: the copies are fed while redis-server runs
        the script (:meth:`~processor.mirror.Mirrors.feed_ahead`), and kept
        only where its versions confirm them, exactly as :meth:`_follow`
        would keep them."""
        mirrors = self._mirrors[shard.index]
        sent = asyncio.ensure_future(applying)
        ahead = Ahead()
        try:
            await handed_over()  # the call is with redis-server: feed meanwhile
            try:
                mirrors.feed_ahead(applied, ahead)
            except Exception:  # a copy is only a shortcut (as in _follow)
                log.exception("could not follow the batch's turns", extra={"shard": shard.index})
                mirrors.forget(ahead)
                # Nothing fed: settle keeps a copy only of a turn the call
                # stored nothing of (update() with no entries does the same).
                ahead = Ahead()
            reply = await sent
        except BaseException:
            sent.cancel()
            mirrors.forget(ahead)  # a retry feeds the batch again
            raise
        try:
            fresh = mirrors.settle(ahead, parse_versions(reply[4]))
        except Exception:
            log.exception("could not follow the batch's turns", extra={"shard": shard.index})
            mirrors.forget(ahead)
            fresh = set()
        return (*reply, fresh)

    def _follow(
        self, shard: Shard, applied: list[Applied], versions: list[Any], newest: bool
    ) -> set[TurnKey]:
        """Keep this worker's copies of the batch's turns (:mod:`processor.mirror`);
        returns the turns whose copy is the state this very call left."""
        mirrors = self._mirrors[shard.index]
        try:
            return mirrors.update(applied, parse_versions(versions), newest)
        except Exception:  # a copy is only a shortcut: without it the finalise reads back
            log.exception("could not follow the batch's turns", extra={"shard": shard.index})
            for entry in applied:
                mirrors.drop(entry.key)
            return set()

    async def _compact(self, shard: Shard, keys: list[TurnKey]) -> None:
        """Fold long turns' stored records into snapshots. Best effort: one that
        fails or loses a race leaves the records as they were (still correct),
        and the turn's next threshold crossing tries again."""
        try:
            await compact_turns(self.client, self.scripts, shard, keys, self.options)
        except Exception as exc:
            log.warning("compaction skipped", extra={"shard": shard.index, "error": repr(exc)})

    async def finalise(
        self, shard: Shard, todo: dict[TurnKey, Reason], fresh: set[TurnKey] | None = None
    ) -> None:
        """Merge and publish finished turns; re-read any that changed meanwhile.
        ``fresh``: turns whose copy the apply call that made them ready confirmed."""
        await self._spill_ready(shard, todo)
        for _ in range(5):
            with self.metrics.timed(self.metrics.finalise_seconds):
                todo = await self._finalise_once(shard, todo, fresh or set())
            fresh = None  # a retry reads the turns back
            if not todo:
                return
        log.warning("turns still changing after 5 finalise attempts", extra={"turns": len(todo)})

    async def _finalise_once(
        self, shard: Shard, todo: dict[TurnKey, Reason], fresh: set[TurnKey]
    ) -> dict[TurnKey, Reason]:
        keys = [key for key, reason in todo.items() if reason == "closing"]
        others = [key for key, reason in todo.items() if reason != "closing"]
        if others:
            # A turn that one of its entries ended is left to the closing path
            # (below): check that before reading its records, which the sweep
            # would otherwise re-read every round while the turn waits.
            async with self.client.pipeline(transaction=False) as pipe:
                for key in others:
                    pipe.hexists(shard.turn(key.encode()), "closing")
                ended = await pipe.execute()
            keys += [key for key, flag in zip(others, ended, strict=True) if not flag]
        if not keys:
            return {}
        mirrors = self._mirrors[shard.index]
        copies = {key: m for key in keys if (m := mirrors.take(key)) is not None}
        # A closing turn whose copy the apply call just confirmed needs no read:
        # its hash is the copy's version and start, with nothing dropped or
        # dead-lettered (either would have moved the version past the copy),
        # and finalise_turns checks that version again as it publishes.
        known = {key: copy.turn_hash() for key, copy in copies.items()
                 if key in fresh and todo[key] == "closing"}
        reads = [key for key in keys if key not in known]
        replies = iter(await self._read_turns(shard, reads, copies) if reads else ())
        now = now_ms()
        settled, again = [], {}
        for key in keys:
            turn_hash: dict[Any, Any]  # str names from a copy, bytes from Redis
            if key in known:
                turn_hash, recs = known[key], None
            else:
                turn_hash = next(replies)
                recs = None if key in copies else next(replies)
            if not turn_hash:
                continue  # finalised by another worker already
            if todo[key] != "closing" and (b"closing" in turn_hash or "closing" in turn_hash):
                # An entry ended the turn before the cancel or the timeout: it
                # is finalised as that ending says, once ready (sweep).
                continue
            copy = copies.get(key)
            if copy is not None and not copy.matches(text_hash(turn_hash)):
                again[key] = todo[key]  # changed behind this worker: read it back
                continue
            try:
                outcome = self._settle(key, turn_hash, copy, recs, todo[key], now)
            except Exception:  # one turn that cannot be replayed must not block the others
                log.exception("could not settle turn", extra={"turn": key.encode()})
                continue
            if outcome is not None:
                settled.append((key, as_text(turn_hash.get(b"ver", b"0")), outcome))
        if not settled:
            return again
        call = build_finalise(shard, settled, self.options, self.config.consumer,
                              self._floor(shard))
        results = await self.scripts.finalise_turns(keys=call.keys, args=call.args)
        self.metrics.finalised(settled, results)
        again.update({key: todo[key] for (key, _, _), r in zip(settled, results, strict=True)
                      if r == -1})
        return again

    async def _read_turns(
        self, shard: Shard, keys: list[TurnKey], copies: dict[TurnKey, Mirror]
    ) -> list[Any]:
        """Each turn's hash, and its records unless this worker has a copy."""
        async with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                tk = key.encode()
                pipe.hgetall(shard.turn(tk))
                if key not in copies:
                    pipe.hgetall(shard.recs(tk))
            return list(await pipe.execute())

    def _settle(self, key: TurnKey, turn_hash: dict[Any, Any], copy: Mirror | None,
                recs: dict[Any, Any] | None, reason: Reason, now: int) -> Settled | None:
        """Render the turn from this worker's copy, or replay its stored records."""
        agui, limits = self.config.agui, self.config.limits
        with self.metrics.timed(self.metrics.merge_seconds):
            if copy is not None:
                self.metrics.settled.labels("mirror").inc()
                return render(key, copy.replay, turn_hash, reason, now, agui)
            self.metrics.settled.labels("replay").inc()
            return settle(key, turn_hash, recs or {}, reason, limits, now, agui)

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
            flags = await self.client.mget([shard.cancel(t.response_id) for t in turns])
            for key, flag in zip(turns, flags, strict=True):
                if flag is not None:
                    todo.setdefault(key, "cancel")
        for tk in expired:
            todo.setdefault(TurnKey.decode(as_text(tk)), "timeout")
        await self._publish_held_ends(shard, todo)
        if todo:
            await self.finalise(shard, todo)


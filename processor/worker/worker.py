"""``processor run``: one worker consuming every shard of a namespace.

The imperative shell. Per shard, a runner (``processor.worker.runner``) reads
batches with XREADGROUP, one ahead, decodes them (``processor.scripts.stored_calls``),
holds them (``processor.worker.held.path``) or stores them with one
``apply_entries`` call and finalises the turns that call reports ready
(``processor.worker.stored.storing``: from the worker's own mirror,
``processor.worker.stored.mirror``,
or a replay of the stored records, ``processor.engine.replay``; then one
``finalise_turns`` call). Between batches it sweeps the shard (timeouts,
cancellation keys, turns left ready by a dead worker) and reclaims entries
idle in a dead consumer's pending list (``processor.worker.recovery``). Which
entry merges where is decided by the data and the scripts, never here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import NoPermissionError, ResponseError

from processor.redis_io.connections import fast_stream_reads, until_done
from processor.redis_io.replies import Entry
from processor.scripts import Scripts, library
from processor.scripts.calls import BatchOptions
from processor.scripts.meta import Meta, check, create
from processor.wire import defaults
from processor.wire.keys import Namespace, Shard
from processor.worker.budget import HELD_BYTES, MIRROR_BYTES, read_bytes
from processor.worker.cancel_requests import CancelRequests
from processor.worker.config import WorkerConfig, default_consumer
from processor.worker.continuity import Continuity
from processor.worker.held.holds import Holds
from processor.worker.held.path import HeldPath
from processor.worker.inbox import Admitter
from processor.worker.live_progress import LivePublisher
from processor.worker.membership import Membership
from processor.worker.metrics import DeadLetterLog, Metrics
from processor.worker.paths import Paths
from processor.worker.recovery import Recovery
from processor.worker.runner import ShardRunner
from processor.worker.shard_state import ShardState
from processor.worker.shell import Shell, run_together
from processor.worker.stored.finalising import Finaliser
from processor.worker.stored.mirror import Mirrors
from processor.worker.stored.storing import StoredPath
from processor.worker.sweeping import Sweeper

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

__all__ = ["Worker", "WorkerConfig", "default_consumer"]

T = TypeVar("T")

log = logging.getLogger("processor.worker")


class Worker:
    """One consumer in each shard's group. ``await run()``; ``stop()`` drains.

    Made of parts it owns (docs/design.md, *The worker: parts it owns*): its
    ``Membership``, ``Admitter`` and ``CancelRequests``; one ``ShardState``
    and one ``ShardRunner`` per shard; and what the runners run:
    ``StoredPath``, ``HeldPath`` (given the stored path), ``Paths`` (a batch
    to one of them), ``Sweeper``, ``Recovery``, ``Continuity`` and, given to
    both paths, ``LivePublisher``. It only composes them, runs them together
    and retries their Redis calls."""

    def __init__(self, client: RedisClient, config: WorkerConfig,
                 metrics: Metrics | None = None) -> None:
        self.client = client
        fast_stream_reads(client)  # (its shard runners read entries raw: connections.read_raw)
        self.config = config
        self.metrics = metrics or Metrics()
        self.options: BatchOptions = config  # (what the script-call builders read of it)
        self.namespace = Namespace(config.namespace, config.shards)
        self.scripts = Scripts(client)
        self._stopping = asyncio.Event()
        self.dead_letters = DeadLetterLog()  # dead letters in the log, rate-limited
        shell = Shell(client, config, self.options, self.scripts, self.metrics,
                      self.dead_letters)
        # Byte budgets (processor.worker.budget): the worker's, shared by its shards.
        self.read_budget = read_bytes(config.shards, config.limits.max_entry_bytes)
        # Two caches of turns per shard, each with its own budgets: the mirrors
        # of stored turns (--mirror-turns, MIRROR_BYTES; 0 turns = always read
        # back) and the held turns (HELD_TURNS, HELD_BYTES).
        mirror_budget, held_budget = MIRROR_BYTES // config.shards, HELD_BYTES // config.shards
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
        async def apply(shard: Shard, entries: list[Entry],
                        deliveries: dict[str, int]) -> None:
            # (Paths needs the held and stored paths, which need continuity, which applies.)
            await self.paths.apply_isolated(shard, entries, deliveries)

        self.continuity = Continuity(shell, self.namespace, self._shards, self.membership,
                                     apply, self.stop, self._stopping, self.ensure_groups)
        self.live = LivePublisher(shell, self._shards, self.retrying)
        self.finaliser = Finaliser(shell, self._shards)
        self.stored = StoredPath(shell, self._shards, self.continuity, self.live, self.finaliser)
        self.held = HeldPath(shell, self._shards, self.membership, self.stored, self.continuity,
                             self.live, self.retrying)
        # Before a finalise reads its turns, the held path spills what it
        # holds of them (the stored path never calls the held path otherwise).
        self.finaliser.before_finalise = self.held.spill_ready
        self.paths = Paths(self._shards, self.held, self.stored, config.hold_turns)
        self.sweeper = Sweeper(shell, self._shards, self.held, self.finaliser)
        self.recovery = Recovery(shell, self.namespace, self._shards, self.membership,
                                 self.stored, self.paths.apply_isolated, self.retrying,
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
        """The namespace's record (scripts.meta), read by ``run``."""
        return self.continuity.meta

    @property
    def fatal(self) -> str | None:
        """Why the worker stopped by itself (``run`` returned)."""
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
        """Serve every shard until ``stop``. Raises
        ``Mismatch`` at once when the namespace's record
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
        (``processor run`` checks the group, host.run.open_namespace)."""
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
        """Load the producers' function library (``processor.scripts.library``).
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
        each counted and logged (``until_done``).
        Once stopping, it gives up: what was read stays pending for another
        worker to reclaim, and a SIGTERM never waits for Redis to return."""
        result: T = await until_done(fn, *args, give_up=lambda: self.stopping,
                                     on_retry=self._redis_down)
        return result

    def _redis_down(self, exc: BaseException | None) -> None:
        self.metrics.redis_error(exc)
        log.warning("redis unavailable, retrying", extra={"error": repr(exc)})

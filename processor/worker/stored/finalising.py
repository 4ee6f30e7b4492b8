"""Publishing the stored path's finished turns (``finalise_turns``): each
rendered from this worker's mirror of it, or replayed from its stored
records (``processor.engine.replay``), a few at a time by their stored
bytes, and read back when it changed meanwhile. ``Finaliser`` is one part
of ``Worker``: the stored path calls it for the turns an ``apply_entries``
call made ready, the sweeper for those a sweep found. What it needs of the
shard and of the held path is a protocol here (``StoredShard``,
``BeforeFinalise``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from processor.engine.records import text_hash
from processor.engine.replay import Reason, Settled, render, replay_render
from processor.redis_io.replies import as_text
from processor.scripts.stored_calls import Finalised, build_finalise, finalise_turns
from processor.wire.cancels import REASON_BYTES, reason_of
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.worker.budget import FINALISE_BYTES
from processor.worker.metrics import dead_letter_summary
from processor.worker.shell import Shell, now_ms
from processor.worker.stored.mirror import Mirror, Mirrors

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

log = logging.getLogger("processor.worker")


async def cancel_reasons(client: RedisClient, shard: Shard,
                         todo: Mapping[TurnKey, Reason]) -> dict[TurnKey, str | None]:
    """The reason of each turn ``todo`` finalises as cancelled: the first
    ``REASON_BYTES`` of its cancel key's value
    (``GETRANGE``, never the whole value: an administrator's plain ``SET``
    may be of any size), as text (``reason_of``).
    None for a key gone meanwhile (expired), empty, or not a string."""
    keys = [key for key, why in todo.items() if why == "cancel"]
    if not keys:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.getrange(shard.cancel(key.response_id), 0, REASON_BYTES - 1)
        raw = await pipe.execute(raise_on_error=False)
    reasons: dict[TurnKey, str | None] = {}
    for key, value in zip(keys, raw, strict=True):
        if isinstance(value, Exception):
            if not str(value).startswith("WRONGTYPE"):
                raise value  # (a refused right, a lost connection: the finalise retries)
            value = None  # an administrator's key of another type cancels, with no reason
        reasons[key] = reason_of(value)
    return reasons


class StoredShard(Protocol):
    """What the stored path keeps and reads of a shard
    (``ShardState``)."""

    @property
    def mirrors(self) -> Mirrors: ...

    def cancels_waiting(self, keys: Iterable[TurnKey]) -> None: ...

    def cancels_done(self, keys: Iterable[TurnKey]) -> None: ...

    def floor(self) -> str: ...

    def read_ahead_from(self) -> str: ...


#: Called with the turns a finalise is about to publish, before it reads
#: them: the held path spills those it holds entries of
#: (``HeldPath.spill_ready``). The stored
#: path never calls the held path otherwise.
BeforeFinalise = Callable[[Shard, dict[TurnKey, Reason]], Awaitable[None]]


async def _nothing_held(_shard: Shard, _todo: dict[TurnKey, Reason]) -> None:
    return None


class Finaliser:
    """The finalises of a worker's stored turns."""

    def __init__(self, shell: Shell, shards: Mapping[int, StoredShard]) -> None:
        self.shell = shell  # (the worker's client, settings, scripts and metrics, shared)
        self.shards = shards
        self.before_finalise: BeforeFinalise = _nothing_held

    async def finalise(
        self, shard: Shard, todo: dict[TurnKey, Reason], fresh: set[TurnKey] | None = None
    ) -> None:
        """Merge and publish finished turns; re-read any that changed meanwhile.
        ``fresh``: turns whose mirror the apply call that made them ready confirmed."""
        await self.before_finalise(shard, todo)
        self.shards[shard.index].cancels_done(
            key for key, reason in todo.items() if reason == "cancel")
        for _ in range(5):
            with self.shell.metrics.timed(self.shell.metrics.finalise_seconds):
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
            async with self.shell.client.pipeline(transaction=False) as pipe:
                for key in others:
                    pipe.hexists(shard.turn(key.encode()), "closing")
                ended = await pipe.execute()
            keys += [key for key, flag in zip(others, ended, strict=True) if not flag]
        if not keys:
            return {}
        reasons = await cancel_reasons(self.shell.client, shard, {k: todo[k] for k in keys})
        shard_mirrors = self.shards[shard.index].mirrors
        mirrors = {key: m for key in keys if (m := shard_mirrors.take(key)) is not None}
        # A closing turn whose mirror the apply call just confirmed needs no read:
        # its hash is the mirror's version and start, with nothing dropped or
        # dead-lettered (either would have moved the version past the mirror),
        # and finalise_turns checks that version again as it publishes.
        known = {key: mirror.turn_hash() for key, mirror in mirrors.items()
                 if key in fresh and todo[key] == "closing"}
        reads = [key for key in keys if key not in known]
        hashes = dict(zip(reads, await self._read_hashes(shard, reads), strict=True))
        again: dict[TurnKey, Reason] = {}
        # Settled a few at a time, by their stored bytes (processor.worker.budget):
        # a turn replayed from its records is read, merged and rendered here.
        chunk: list[TurnKey] = []
        size = 0
        for key in keys:
            turn_hash = hashes.get(key)
            stored = int(turn_hash.get(b"bytes", 0)) if turn_hash and key not in mirrors else 0
            if chunk and size + stored > FINALISE_BYTES:
                again.update(await self._finalise_chunk(shard, todo, chunk, known, hashes, mirrors,
                                                        reasons))
                chunk, size = [], 0
            chunk.append(key)
            size += stored
        if chunk:
            again.update(await self._finalise_chunk(shard, todo, chunk, known, hashes, mirrors,
                                                        reasons))
        return again

    async def _finalise_chunk(
        self, shard: Shard, todo: dict[TurnKey, Reason], keys: list[TurnKey],
        known: dict[TurnKey, dict[Any, Any]], hashes: dict[TurnKey, dict[Any, Any]],
        mirrors: dict[TurnKey, Mirror], reasons: dict[TurnKey, str | None],
    ) -> dict[TurnKey, Reason]:
        """Settle and publish ``keys`` (one finalise_turns call); the turns to
        retry. ``reasons``: the cancelled turns' (``cancel_reasons``)."""
        reads = [key for key in keys if key not in known and key not in mirrors and hashes[key]]
        records = dict(zip(reads, await self._read_records(shard, reads), strict=True))
        now = now_ms()
        settled, again = [], {}
        for key in keys:
            turn_hash: dict[Any, Any]  # str names from a mirror, bytes from Redis
            if key in known:
                turn_hash, recs = known[key], None
            else:
                turn_hash = hashes[key]
                recs = records.get(key)
            if not turn_hash:
                continue  # finalised by another worker already
            if todo[key] != "closing" and (b"closing" in turn_hash or "closing" in turn_hash):
                # An entry ended the turn before the cancel or the timeout: it
                # is finalised as that ending says, once ready (sweep).
                continue
            mirror = mirrors.get(key)
            if mirror is not None and not mirror.matches(text_hash(turn_hash)):
                again[key] = todo[key]  # changed behind this worker: read it back
                continue
            try:
                outcome = self._render(key, turn_hash, mirror, recs, todo[key], now,
                                       reasons.get(key))
            except Exception:  # one turn that cannot be replayed must not block the others
                log.exception("could not settle turn", extra={"turn": key.encode()})
                continue
            if outcome is not None:
                settled.append((key, as_text(turn_hash.get(b"ver", b"0")), outcome))
            recs = None
        records.clear()
        if not settled:
            return again
        state = self.shards[shard.index]
        call = build_finalise(shard, settled, self.shell.options, self.shell.config.consumer,
                              state.floor(), state.read_ahead_from())
        results = await finalise_turns(self.shell.scripts.finalise_turns, call)
        self.shell.metrics.finalised([outcome for _, _, outcome in settled], results)
        for (key, _, outcome), result in zip(settled, results, strict=True):
            if result is Finalised.PUBLISHED and outcome.dead_letters:
                self.shell.dead_letters.late(shard.index, key.response_id,
                                              dead_letter_summary(outcome.dead_letters))
        again.update({key: todo[key] for (key, _, _), r in zip(settled, results, strict=True)
                      if r is Finalised.CHANGED})
        # A cancel that must wait for an entry up to its cut: retried after
        # each step of the shard loop (Worker.retry_cancels), not a sweep later.
        self.shards[shard.index].cancels_waiting(
            key for (key, _, _), r in zip(settled, results, strict=True)
            if r is Finalised.NOT_YET and todo[key] == "cancel")
        return again

    async def _read_hashes(self, shard: Shard, keys: list[TurnKey]) -> list[Any]:
        """Each turn's hash."""
        return await self._hgetall([shard.turn(key.encode()) for key in keys])

    async def _read_records(self, shard: Shard, keys: list[TurnKey]) -> list[Any]:
        """Each turn's stored records."""
        return await self._hgetall([shard.recs(key.encode()) for key in keys])

    async def _hgetall(self, names: list[str]) -> list[Any]:
        """``HGETALL`` of each hash, in one pipeline."""
        if not names:
            return []
        async with self.shell.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(name)
            return list(await pipe.execute())

    def _render(self, key: TurnKey, turn_hash: dict[Any, Any], mirror: Mirror | None,
                recs: dict[Any, Any] | None, reason: Reason, now: int,
                cancel_reason: str | None = None) -> Settled | None:
        """Render the turn from this worker's mirror, or replay its stored records."""
        agui, limits = self.shell.config.agui, self.shell.config.limits
        with self.shell.metrics.timed(self.shell.metrics.merge_seconds):
            if mirror is not None:
                self.shell.metrics.settled.labels("mirror").inc()
                return render(key, mirror.replay, turn_hash, reason, now, agui,
                              cancel_reason=cancel_reason)
            self.shell.metrics.settled.labels("replay").inc()
            return replay_render(key, turn_hash, recs or {}, reason, limits, now, agui,
                                 cancel_reason)

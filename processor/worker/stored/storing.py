"""The worker's side of the stored path (the default; docs/design.md):
each batch stored with one ``apply_entries`` call, this worker's mirrors of
its turns fed meanwhile (``processor.worker.stored.mirror``), and the turns that call
or a sweep made ready published with ``finalise_turns``, from a mirror or
from a replay of the stored records (``processor.engine.replay``).
``StoredPath`` is one part of ``Worker``;
held turns (``processor.worker.held.path``) end here whenever holding
them stops being safe. The held path calls this one, never the reverse
(an import-linter contract): what the stored path needs of other parts is
a protocol here (``StoredShard``, ``StoredContinuity``, ``BeforeFinalise``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from processor.engine.records import text_hash
from processor.engine.replay import Reason, Settled, render, replay_render
from processor.redis_io.connections import handed_over
from processor.redis_io.replies import Entry, as_text
from processor.scripts.stored_calls import (
    Applied,
    ApplyCall,
    ApplyReply,
    Finalised,
    Version,
    apply_entries,
    build_apply,
    build_finalise,
    finalise_turns,
    parse_member,
    parse_versions,
)
from processor.wire.cancels import REASON_BYTES, reason_of
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.worker.budget import FINALISE_BYTES
from processor.worker.metrics import dead_letter_summary
from processor.worker.shell import Shell, now_ms
from processor.worker.stored.compaction import compact_turns
from processor.worker.stored.mirror import Ahead, Mirror, Mirrors

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


class StoredContinuity(Protocol):
    """What the stored path asks when Redis may have lost the namespace's
    state (``Continuity``)."""

    async def lost_under(self, shard: Shard, call: ApplyCall, counts: list[Any],
                         versions: dict[TurnKey, Version]) -> str | None: ...

    async def lose_shard_now(self, shard: Shard) -> set[TurnKey]: ...

    async def after_loss(self, shard: Shard, entries: list[Entry],
                         merged: set[str] | frozenset[str] = frozenset()) -> None: ...


class LiveProgress(Protocol):
    """Live progress of the turns a batch stored
    (``LivePublisher``)."""

    async def publish_live_stored(self, shard: Shard, applied: list[Applied],
                                  fresh: set[TurnKey]) -> None: ...


#: Called with the turns a finalise is about to publish, before it reads
#: them: the held path spills those it holds entries of
#: (``HeldPath.spill_ready``). The stored
#: path never calls the held path otherwise.
BeforeFinalise = Callable[[Shard, dict[TurnKey, Reason]], Awaitable[None]]


async def _nothing_held(_shard: Shard, _todo: dict[TurnKey, Reason]) -> None:
    return None


class StoredPath:
    """The stored path of a worker's shards."""

    def __init__(self, shell: Shell, shards: Mapping[int, StoredShard],
                 continuity: StoredContinuity, live: LiveProgress) -> None:
        self.shell = shell  # (the worker's client, settings, scripts and metrics, shared)
        self.shards = shards
        self.continuity = continuity
        self.live = live
        self.before_finalise: BeforeFinalise = _nothing_held

    async def store(
        self, shard: Shard, entries: list[Entry], deliveries: dict[str, int],
        call: ApplyCall | None = None, read_from: str = "",
    ) -> None:
        """Store a batch with ``apply_entries``, then finalise whatever it made
        ready. ``read_from``: the first id of the XREADGROUP > read the entries
        come from, if they do (``ApplyCall.read_from``)."""
        if call is None:
            call = build_apply(shard, entries, deliveries, self.shell.options, now_ms())
            call.read_from = read_from
        floor = self.shards[shard.index].floor()
        applying = apply_entries(self.shell.scripts.apply_entries, call.keys,
                                 call.argv(self.shell.config.consumer, floor))
        if call.newest:
            reply, fresh, lost = await self._follow_ahead(shard, call, applying)
        else:
            reply = await applying
            lost = await self.continuity.lost_under(shard, call, reply.counts,
                                                parse_versions(reply.versions))
            fresh = set() if lost else self._follow(shard, call, reply.versions)
        self.shell.metrics.applied(reply.counts)
        self._log_dead_letters(shard, call, reply.counts)
        if lost is not None:  # the namespace's state found lost under this call
            merged = await self.continuity.lose_shard_now(shard)
            if lost == "fenced":  # nothing of it applied: what Redis no longer has, to the DLQ
                await self.continuity.after_loss(shard, entries,
                                       {a.entry_id for a in call.applied if a.key in merged})
                return
        if self.shell.config.progress and call.applied:  # before any of them is published
            await self.live.publish_live_stored(shard, call.applied, fresh)
        todo: dict[TurnKey, Reason] = {parse_member(m): "closing" for m in reply.ready}
        for tk in reply.cancelled:
            todo.setdefault(TurnKey.decode(as_text(tk)), "cancel")
        if todo:
            await self.finalise(shard, todo, fresh)
        if reply.full:
            await self._compact(shard, [TurnKey.decode(as_text(tk)) for tk in reply.full])

    async def _follow_ahead(
        self, shard: Shard, call: ApplyCall, applying: Coroutine[Any, Any, ApplyReply]
    ) -> tuple[ApplyReply, set[TurnKey], str | None]:
        """``apply_entries``' reply and ``_follow``'s turns, for a batch
        read with ``XREADGROUP >``: the mirrors are fed while redis-server runs
        the script (``Mirrors.feed_ahead``), and kept
        only where its versions confirm them, exactly as ``_follow``
        would keep them. Last, what the reply says of the namespace's state
        (``Continuity.lost_under``), checked
        before the mirrors are settled: a lost turn is published from its mirror."""
        applied = call.applied
        mirrors = self.shards[shard.index].mirrors
        sent = asyncio.ensure_future(applying)
        ahead = Ahead()
        try:
            await handed_over()  # the call is with redis-server: feed meanwhile
            try:
                mirrors.feed_ahead(applied, ahead)
            except Exception:  # a mirror is only a shortcut (as in _follow)
                log.exception("could not follow the batch's turns", extra={"shard": shard.index})
                mirrors.forget(ahead)
                # Nothing fed: confirm keeps a mirror only of a turn the call
                # stored nothing of (update() with no entries does the same).
                ahead = Ahead()
            reply = await sent
        except BaseException:
            sent.cancel()
            mirrors.forget(ahead)  # a retry feeds the batch again
            raise
        versions = parse_versions(reply.versions)
        try:
            lost = await self.continuity.lost_under(shard, call, reply.counts, versions)
        except BaseException:
            mirrors.forget(ahead)  # a retry feeds the batch again
            raise
        if lost is not None:
            return reply, set(), lost  # (the mirrors are published, then dropped)
        try:
            fresh = mirrors.confirm(ahead, versions, call.dead_by_turn())
        except Exception:
            log.exception("could not follow the batch's turns", extra={"shard": shard.index})
            mirrors.forget(ahead)
            fresh = set()
        return reply, fresh, None

    def _follow(self, shard: Shard, call: ApplyCall, versions: list[Any]) -> set[TurnKey]:
        """Keep this worker's mirrors of the batch's turns (``processor.worker.stored.mirror``);
        returns the turns whose mirror is the state this very call left."""
        mirrors = self.shards[shard.index].mirrors
        try:
            return mirrors.update(call.applied, parse_versions(versions), call.newest,
                                  call.dead_by_turn())
        except Exception:  # a mirror is only a shortcut: without it the finalise reads back
            log.exception("could not follow the batch's turns", extra={"shard": shard.index})
            for entry in call.applied:
                mirrors.drop(entry.key)
            return set()

    async def _compact(self, shard: Shard, keys: list[TurnKey]) -> None:
        """Fold long turns' stored records into snapshots. Best effort: one that
        fails or loses a race leaves the records as they were (still correct),
        and the turn's next threshold crossing tries again."""
        try:
            shell = self.shell
            await compact_turns(shell.client, shell.scripts, shard, keys, shell.options)
        except Exception as exc:
            log.warning("compaction skipped", extra={"shard": shard.index, "error": repr(exc)})

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
        call = build_finalise(shard, settled, self.shell.options, self.shell.config.consumer,
                              self.shards[shard.index].floor())
        results = await finalise_turns(self.shell.scripts.finalise_turns, call)
        self.shell.metrics.finalised(settled, results)
        for (key, _, outcome), result in zip(settled, results, strict=True):
            if result is Finalised.PUBLISHED and outcome.dead_letters:
                self.log_late(shard, key, dead_letter_summary(outcome.dead_letters))
        again.update({key: todo[key] for (key, _, _), r in zip(settled, results, strict=True)
                      if r is Finalised.CHANGED})
        # A cancel that must wait for an entry up to its cut: retried after
        # each step of the shard loop (Worker.retry_cancels), not a sweep later.
        self.shards[shard.index].cancels_waiting(
            key for (key, _, _), r in zip(settled, results, strict=True)
            if r is Finalised.NOT_YET and todo[key] == "cancel")
        return again

    def _log_dead_letters(self, shard: Shard, call: ApplyCall, counts: list[Any]) -> None:
        """Log what ``apply_entries`` dead-lettered (rate-limited, metrics.DeadLetterLog):
        by reason, with the ids and turns of those the worker decided itself
        (decoding, routing, deliveries); the script's own (``turn_closed``
        of an ended turn, ``internal_error``) are counted, their ids are in the DLQ."""
        reasons = {as_text(counts[i])[4:]: int(counts[i + 1])
                   for i in range(0, len(counts) - 1, 2) if as_text(counts[i]).startswith("dlq:")}
        if not reasons:
            return
        known: dict[str, tuple[list[str], list[str]]] = {}
        for entry_id, reason, tk in call.dead_letters():
            ids, turns = known.setdefault(reason, ([], []))
            ids.append(entry_id)
            if tk:
                turns.append(TurnKey.decode(tk).response_id)
        for reason, count in reasons.items():
            ids, turns = known.get(reason, ([], []))
            self.shell.dead_letters.note(reason, shard.index, count, ids, turns)

    def log_late(self, shard: Shard, key: TurnKey, late: list[tuple[str, str, str]]) -> None:
        """Log the entries a finalise dead-lettered (found after the turn's end)."""
        by_reason: dict[str, list[str]] = {}
        for reason, entry_id, _ in late:
            by_reason.setdefault(reason, []).append(entry_id)
        for reason, ids in by_reason.items():
            self.shell.dead_letters.note(reason, shard.index, len(ids), ids, [key.response_id])

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

"""The worker's side of the stored path (docs/design.md): each batch
stored with one ``apply_entries`` call, this worker's mirrors of its turns
fed meanwhile (``processor.worker.stored.mirror``), and the turns that call
made ready handed to the ``Finaliser`` (``processor.worker.stored.finalising``).
``StoredPath`` is one part of ``Worker``; held turns
(``processor.worker.held.path``) end here whenever holding them stops being
safe. The held path calls this one, never the reverse (an import-linter
contract): what the stored path needs of other parts is a protocol
(``StoredShard``, ``StoredContinuity``, ``LiveProgress``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from processor.engine.replay import Reason
from processor.redis_io.connections import handed_over
from processor.redis_io.replies import Entry, as_text
from processor.scripts.stored_calls import (
    Applied,
    ApplyCall,
    ApplyReply,
    Version,
    apply_entries,
    build_apply,
    parse_member,
    parse_versions,
)
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.worker.shell import Shell, now_ms
from processor.worker.stored.compaction import compact_turns
from processor.worker.stored.finalising import Finaliser, StoredShard
from processor.worker.stored.mirror import Ahead

if TYPE_CHECKING:
    pass

log = logging.getLogger("processor.worker")


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


class StoredPath:
    """The stored path of a worker's shards."""

    def __init__(self, shell: Shell, shards: Mapping[int, StoredShard],
                 continuity: StoredContinuity, live: LiveProgress, finaliser: Finaliser) -> None:
        self.shell = shell  # (the worker's client, settings, scripts and metrics, shared)
        self.shards = shards
        self.continuity = continuity
        self.live = live
        self.finaliser = finaliser

    async def store(
        self, shard: Shard, entries: list[Entry], deliveries: dict[str, int],
        call: ApplyCall | None = None, read_from: str = "",
    ) -> None:
        """Store a batch with ``apply_entries``, then finalise whatever it made
        ready. ``read_from``: the first id of the XREADGROUP > read the entries
        come from, if they do (``ApplyCall.read_from``), or of the read the
        worker has read ahead and not taken in (a spill's)."""
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
            await self.finaliser.finalise(shard, todo, fresh)
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


"""The worker's side of held turns (``--hold-turns``; ``processor.worker.held.holds``,
docs/design.md *Held turns*): opening the turns a batch starts, feeding
their entries to this worker's memory only, publishing them with
``finalise_held`` and spilling them to ``apply_entries`` whenever holding
stops being safe (its ``Checkpointer`` and ``Spiller`` do those two
transitions; it decides when). ``HeldPath`` is one part of
``Worker``, run inside its shard runners; every
path out of holding ends in the stored path
(``StoredPath``, which it is given),
which decides nothing differently."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from processor.engine.replay import Reason, render, take_late
from processor.redis_io.replies import RawEntry, as_text
from processor.scripts.held_calls import (
    HeldEnd,
    HeldOutcome,
    build_finalise_held,
    build_open,
    finalise_held,
    open_turns,
)
from processor.scripts.stored_calls import ApplyCall
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.worker.continuity import Continuity
from processor.worker.held.batch import HeldCall
from processor.worker.held.checkpoint import Checkpointer
from processor.worker.held.per_call import FINALISE_TURN_ENTRIES, in_calls
from processor.worker.held.spill import Spiller
from processor.worker.live_progress import LivePublisher, Rendered
from processor.worker.membership import Membership
from processor.worker.shard_state import ShardState
from processor.worker.shell import Retrying, Shell
from processor.worker.stored.finalising import cancel_reasons
from processor.worker.stored.storing import StoredPath

log = logging.getLogger("processor.worker")


#: A held turn's entries have their idle time reset this often, as a share
#: of --reclaim-idle-ms: well before another worker may reclaim them.
REFRESH_SHARE = 1 / 3


@dataclass
class Finalising:
    """A batch's ``finalise_held`` calls, sent and not committed yet: their
    turns (still held until then), what they settle, and their answers (one future)."""

    keys: set[TurnKey]
    settled: list[HeldOutcome]
    reply: asyncio.Future[list[HeldEnd]]
    commit: asyncio.Future[None] | None = None  # (its commit, run once the reply is in)


class HeldPath:
    """The held path of a worker's shards; given the stored path, which it
    hands whatever stops being held (and which never calls this)."""

    def __init__(self, shell: Shell, shards: Mapping[int, ShardState], membership: Membership,
                 stored: StoredPath, continuity: Continuity, live: LivePublisher,
                 retrying: Retrying) -> None:
        self.shell = shell  # (the worker's client, settings, scripts and metrics, shared)
        self.shards = shards
        self.membership = membership
        self.stored = stored
        self.continuity = continuity
        self.live = live  # live progress (processor.worker.live_progress)
        self.retrying = retrying
        self.checkpointer = Checkpointer(shell, shards, live, retrying)
        self.spiller = Spiller(shell, shards, stored, continuity, live)
        self._finalising: dict[int, Finalising] = {}  # per shard: the batch finalise in flight

    def holds_on(self, shard: Shard) -> bool:
        """Whether to hold the turns of what is read from ``shard`` now:
        holding is on (``WorkerConfig.hold_turns``, --hold-turns) and no other worker reads
        the shard (``Membership.sole_reader``). On a shared shard a turn's
        entries reach several workers, each would hold a part of it and
        spill it when refused at its finalise, which costs more than storing
        every entry. Such a shard's turns are stored."""
        return self.shell.config.hold_turns and self.membership.sole_reader(shard.index)

    async def apply_held(self, shard: Shard, entries: list[RawEntry], call: HeldCall) -> None:
        """Hold what can be held of a batch (``call``: grouped for holding),
        store the rest, publish what ended."""
        state = self.shards[shard.index]
        holds = state.holds
        await self.open_batch(shard, call)  # what the reader did not open already (open_ahead)
        going = self._finalising.get(shard.index)
        if going is not None and not going.keys.isdisjoint(call.held.turns):
            await self.settle(shard)  # (an entry after a turn's end: it is late once published)
        routed = holds.route(entries, call.held)
        state.floor_marks.routed(as_text(entries[0][0]), as_text(entries[-1][0]))
        if routed.stored:
            await self.stored.store(shard, routed.stored, {}, None, as_text(entries[0][0]))
        if routed.broken:  # the stored path dead-letters what broke them
            await self.spill(shard, routed.broken, "dead letter")

        async def finalise(rendered: Rendered) -> None:
            ended: dict[TurnKey, Reason] = {
                key: "closing" for key in routed.held
                if (held := holds.turns.get(key)) and held.ended}
            await self.settle(shard)  # (one finalise in flight per shard)
            if ended:
                await self._finalise_held(shard, ended, rendered, defer=True)

        if self.shell.config.progress and routed.held:  # its last events go with its outcome
            await self.live.publish_live_held(shard, routed.held, finalise)
        else:
            await finalise({})

    async def open_batch(self, shard: Shard, call: HeldCall) -> None:
        """``open_turns`` for the batch's turns this worker knows nothing of.
        The reader and the applier may both open (``open_ahead``): one
        at a time, so that no turn is opened twice."""
        async with self.shards[shard.index].opening:
            if call.opened:  # (the reader's: the applier need not look again)
                return
            holds = self.shards[shard.index].holds
            fresh = holds.to_open(call.held)
            if fresh:
                opened = build_open(shard, fresh, self.shell.options, call.now_ms,
                                    self.shell.config.consumer)
                reply = await open_turns(self.shell.scripts.open_turns, opened, list(fresh))
                holds.opened(reply.held, reply.started, time.monotonic())
            call.opened = True

    async def open_ahead(self, shard: Shard, call: ApplyCall | HeldCall | None) -> None:
        """Open a held batch's new turns as soon as it is read, while the
        applier is still busy with the batch before: the round trip then
        overlaps the applier's Python instead of stalling it (redis-server
        answers the reader's XREADGROUP first). Best effort: whatever this
        does not open, the applier opens (``apply_held``)."""
        if not isinstance(call, HeldCall):
            return
        try:
            await self.open_batch(shard, call)
        except Exception:  # the applier tries again, and its failures count
            log.debug("opening ahead failed", exc_info=True, extra={"shard": shard.index})

    async def _finalise_held(
        self, shard: Shard, todo: dict[TurnKey, Reason], rendered: Rendered | None = None,
        defer: bool = False, reasons: Mapping[TurnKey, str | None] | None = None,
    ) -> list[TurnKey]:
        """Publish held turns, ended (``closing``), cancelled or timed out,
        with what is held of them; spill any that finalise_held refuses.
        ``rendered``: their merged responses as the batch's live step
        rendered them, used for a turn that holds nothing more since (so
        it is not rendered twice). Returns the turns published.

        The turns go in calls of about ``--batch`` entries (``per_call``),
        sent one after the other and committed together once all answered.
        With ``defer`` (a batch's ended turns) they are sent and this
        returns at once: redis-server runs them while the worker merges the
        next batch, and ``settle`` commits it before anything next
        reads or changes the held turns (the next finalise, a spill, a
        sweep's, a take-back or a reclaim; the next batch first if it has
        an entry of one of them). ``reasons``: the cancelled turns' reasons
        (``cancel_reasons``)."""
        state = self.shards[shard.index]
        if state.unknown_pending():
            # One of them may be a held turn's: finalise_held's argument needs
            # every entry pending here held (and a cancel, the newest entry
            # routed). The stored path waits for them.
            waits = [key for key, reason in todo.items() if reason != "timeout"]
            await self.spiller.spill(shard, waits, "unknown pending")
            todo = {key: reason for key, reason in todo.items() if reason == "timeout"}
        holds, now = state.holds, int(time.time() * 1000)
        routed = state.floor_marks.routed_to
        settled: list[HeldOutcome] = []
        broken: list[TurnKey] = []
        for key, reason in todo.items():
            held = holds.turns.get(key)
            if held is None:  # (spilled meanwhile, or the shard's state forgotten)
                continue
            if not held.catch_up():
                broken.append(key)
                continue
            late = take_late(held.replay)  # dead-lettered from the stream, as stored
            known = rendered.get(key) if rendered else None
            if known is not None and known.entries != len(held.ids):
                known = None  # (fed since: its events would not end at its merge)
            with self.shell.metrics.timed(self.shell.metrics.merge_seconds):
                outcome = render(key, held.replay, held.turn_hash(), reason, now,
                                 self.shell.config.agui, known.response if known else None,
                                 (reasons or {}).get(key))
            if outcome is not None:
                settled.append(HeldOutcome(
                    key, held.ids, late, outcome, routed if reason == "cancel" else "",
                    known.events if known else [], known.spoken if known else 0, held.version))
        if broken:
            await self.spiller.spill(shard, broken, "dead letter")
        if not settled:
            return []
        calls = [build_finalise_held(shard, part, self.shell.options, self.shell.config.consumer,
                                     self.live.speaker)
                 for part in in_calls(settled, lambda one: len(one.ids) + FINALISE_TURN_ENTRIES,
                                      self.shell.config.batch)]

        async def finalise() -> list[HeldEnd]:
            """The calls one after the other (redis-server serves its other
            clients between them), each retried unchanged until its outcome
            is known: their answers, in the order of ``settled``."""
            ended: list[HeldEnd] = []
            for call in calls:
                ended += await self.retrying(finalise_held, self.shell.scripts.finalise_held, call)
            return ended

        reply = asyncio.ensure_future(finalise())
        if defer:
            going = Finalising({key for key, *_ in settled}, settled, reply)
            going.commit = asyncio.ensure_future(self._settle(shard, going))
            self._finalising[shard.index] = going
            return []
        return await self._commit(shard, settled, await reply)

    async def settle(self, shard: Shard) -> None:
        """Until the shard's batch finalise in flight, if any, is committed
        (see ``_finalise_held``; but in the commit's own spills)."""
        going = self._finalising.get(shard.index)
        if going is not None and going.commit is not None \
                and asyncio.current_task() is not going.commit:
            await asyncio.shield(going.commit)

    async def _settle(self, shard: Shard, going: Finalising) -> None:
        """Commit a batch finalise once its reply is in (a task of its own,
        started with the call). One that failed (not a connection error:
        those it retries) leaves its turns held and ended: they spill when
        due (``--hold-ms``), and the stored path publishes them; a spill of
        refused turns that failed leaves their entries to be taken back."""
        try:
            await self._commit(shard, going.settled, await going.reply)
        except Exception as exc:  # (a task of its own: nothing above it would log this)
            self.shell.metrics.step_failed(exc)
            log.warning("finalising held turns failed: what is still held spills when due",
                        exc_info=True, extra={"shard": shard.index, "turns": len(going.keys)})
        finally:
            if self._finalising.get(shard.index) is going:
                del self._finalising[shard.index]

    def abandon(self, shard: Shard) -> None:
        """Stop the shard's finalise in flight (its runner stops: what it
        held stays pending, for a reclaim)."""
        going = self._finalising.pop(shard.index, None)
        if going is not None:
            going.reply.cancel()
            if going.commit is not None:
                going.commit.cancel()

    async def _commit(self, shard: Shard, settled: list[HeldOutcome],
                      results: list[HeldEnd]) -> list[TurnKey]:
        """What finalise_held calls did: the turns they published are let go,
        those they refused spill. Returns the turns published."""
        holds = self.shards[shard.index].holds
        self.shell.metrics.finalised([one.outcome for one in settled], results)
        published, refused, cancelled, acked, reasons = [], [], [], 0, []
        for (key, ids, late, *_), result in zip(settled, results, strict=True):
            if result is HeldEnd.CANCELLED:  # before its end was published: cut at the end
                cancelled.append(key)
            elif result is HeldEnd.PUBLISHED:
                holds.take(key)
                published.append(key)
                acked += len(ids)
                reasons += [reason for _, reason, _ in late]
                if late:
                    self.shell.dead_letters.late(shard.index, key.response_id,
                                                 [(reason, i, "") for i, reason, _ in late])
            else:
                refused.append(key)
        if published:
            self.shell.metrics.held_published(len(published), acked, reasons)
        # Retried (each a step of its own): from _settle, a task of its own,
        # nothing above would retry a connection error, and the ended turns
        # would stay held until --hold-ms. A spill sent again skips the
        # turns it took already (their entries, if not stored, taken back).
        if refused:
            await self.retrying(self.spiller.spill, shard, refused, "refused")
        if cancelled:  # (the stored path publishes them cancelled, from the cut)
            await self.retrying(self.spiller.spill, shard, cancelled, "cancelled")
        return published

    async def spill(self, shard: Shard, keys: list[TurnKey], why: str) -> None:
        """Hand held turns to apply_entries: their entries are stored and
        acked there (the XACK fence skips any that were applied already), and
        the turns go on as any stored turn (the finalise in flight committed
        first: ``settle``)."""
        await self.settle(shard)
        await self.spiller.spill(shard, keys, why)

    async def spill_due(self, shard: Shard, everything: bool = False) -> None:
        """Spill the turns held too long or over the bounds (all of them
        with ``everything``: stopping, or the shard read by another worker),
        and reset the idle time of what stays held."""
        holds = self.shards[shard.index].holds
        if not holds.turns:
            return
        now = time.monotonic()
        keys = list(holds.turns) if everything else holds.due(now, self.shell.config.hold_ms / 1000)
        if keys:
            await self.settle(shard)  # (the finalise in flight committed first)
        if keys and not everything:
            keys = await self.checkpointer.checkpoint(shard, keys, now)
        if keys:
            await self.spill(shard, keys, "all" if everything else "due")
        every = self.shell.config.reclaim_idle_ms / 1000 * REFRESH_SHARE
        if ids := holds.stale(now, every):
            await self.spiller.refresh(shard, ids)

    async def publish_held_ends(self, shard: Shard, todo: dict[TurnKey, Reason]) -> None:
        """Of a sweep's turns, publish the held ones that were cancelled or
        timed out from what is held (removed from ``todo``)."""
        holds = self.shards[shard.index].holds.turns
        held: dict[TurnKey, Reason] = {key: why for key, why in todo.items()
                                       if why != "closing" and key in holds}
        if held:
            await self.settle(shard)
            reasons = await cancel_reasons(self.shell.client, shard, held)
            for key in await self._finalise_held(shard, held, reasons=reasons):
                del todo[key]

    async def spill_ready(self, shard: Shard, todo: dict[TurnKey, Reason]) -> None:
        """Spill the turns about to be finalised on the stored path that this
        worker still holds entries of: another consumer stored the rest (and
        its end), and the watermark skips this worker's own held entries
        (includes/watermark.lua), so they must be stored first."""
        held = [key for key in todo if key in self.shards[shard.index].holds.turns]
        if held:
            await self.spill(shard, held, "stored elsewhere")

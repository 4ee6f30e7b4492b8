"""What a worker does when Redis loses what the worker relies on
(docs/reliability.md, *When Redis loses state*):

- **A consumer group vanished** (``XGROUP DESTROY``, the stream deleted)
  while the namespace's record is intact: it is put back at the newest
  entry this worker knows was delivered (the last it read on that shard,
  never lower; raised there if another worker put it back lower), and the
  entries this worker had pending (held, or read and not yet applied) are
  made pending to it again, in one step (``recreate_group.lua``), so the
  XACK fences and the watermark work on them as before. The scripts that
  ack (``apply_entries``, ``finalise_held``) fail loudly on a missing group
  (``includes/require_group``) rather than read XACK's 0 as "applied by
  another consumer"; the step is then run again.
- **The namespace's state is gone**: its record (processor.scripts.meta) is missing
  or has another epoch, which is what a Redis restarted without persistence
  looks like. Said once at error level, on ``/readyz`` for
  ``STATE_LOST_READY_S`` and in ``processor_state_lost_total``. Every
  turn this worker knew in flight (held, or with a mirror: mirror.py) is
  published as error ``state_lost`` with what it had
  (``publish_lost_turns.lua``); entries it had read and not applied, which
  Redis no longer has, go to the DLQ with their fields (``state_lost``);
  then the record and the groups are written again and work goes on. Turns
  it did not know of cannot be told apart from new ones: a documented limit.

``Continuity`` is one part of ``Worker``.
What concerns one shard's turns runs in that shard's applier, between
steps, like every other state change of the shard (``Continuity.lose_shard_now``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from redis.exceptions import ResponseError

from processor.engine.replay import render
from processor.redis_io.connections import is_redis_failure
from processor.redis_io.replies import Entry, as_text, entry_of
from processor.scripts.lost_calls import (
    LostOutcome,
    build_publish_lost,
    build_recreate_group,
    publish_lost_turns,
    recreate_group,
)
from processor.scripts.meta import Meta, create, read
from processor.scripts.stored_calls import ApplyCall, Version
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace, Shard
from processor.worker.membership import Membership
from processor.worker.shard_state import ShardState
from processor.worker.shell import Apply, Shell
from processor.worker.stored.mirror import Mirror

log = logging.getLogger("processor.worker")

#: Seconds ``/readyz`` says the namespace's state was lost, after the worker found it.
STATE_LOST_READY_S = 60.0
#: The DLQ reason of entries a worker had when Redis lost the namespace's state.
STATE_LOST = "state_lost"
#: The ``detail`` of a ``state_lost`` dead letter: read, not applied, and gone from Redis.
STATE_LOST_DETAIL = ("read before Redis lost the namespace's state (a restart without "
                     "persistence?), not applied: Redis no longer has it")
#: ... or held for a turn another worker published as state_lost first, without it.
STATE_LOST_ELSEWHERE = ("held when Redis lost the namespace's state; its turn was published "
                        "as state_lost by another worker, without it")


def is_nogroup(exc: BaseException) -> bool:
    """Whether Redis answered that the stream or its consumer group is missing."""
    return isinstance(exc, ResponseError) and "NOGROUP" in str(exc)


class Continuity:
    """A vanished group and a lost namespace state, for the worker's shards
    (one of the parts ``Worker`` is made of)."""

    def __init__(self, shell: Shell, namespace: Namespace, shards: Mapping[int, ShardState],
                 membership: Membership, apply: Apply, stop: Callable[[], None],
                 stopping: asyncio.Event, ensure_groups: Callable[[], Awaitable[None]]) -> None:
        self.shell = shell  # (the worker's client, settings, scripts and metrics, shared)
        self.namespace = namespace
        self.shards = shards
        self.membership = membership
        self.apply = apply  # the worker's: a batch, or one by one if the batch fails
        self.stop = stop  # the worker's
        self._stopping = stopping
        self.ensure_groups = ensure_groups  # the worker's
        self.meta: Meta | None = None  # the namespace's record (scripts.meta), read by run()
        self.fatal: str | None = None  # why the worker stopped by itself (run() returned)
        self.generation = 0  # one more each time the namespace's state was found lost
        self._loss_lock = asyncio.Lock()
        self._regroup_lock = asyncio.Lock()
        self.state_lost_at: float | None = None  # monotonic time the state was found lost
        self.state_lost_why = ""
        # After a loss, the groups come back only at this (monotonic) time:
        # ``_state_lost`` says why.
        self._regroup_at: float | None = None

    def readiness(self) -> str | None:
        """What ``/readyz`` adds: the namespace's state lost, for a while after."""
        if self.state_lost_at is None:
            return None
        age = time.monotonic() - self.state_lost_at
        if age > STATE_LOST_READY_S:
            return None
        return (f"the namespace's state in Redis was lost {age:.0f}s ago "
                f"({self.state_lost_why}); turns in flight were published as state_lost")

    # ------------------------------------------------------------ the record

    async def watch_namespace(self) -> None:
        """Read the namespace's record once a beat period until stopping
        (``_check_namespace``), and put the groups back when due after a
        loss. A failed step is tried again at the next."""
        while True:
            try:
                await asyncio.wait_for(self._stopping.wait(), self.membership.beat_period)
                return
            except TimeoutError:
                pass
            try:
                if self._regroup_at is not None and time.monotonic() >= self._regroup_at:
                    await self.ensure_groups()  # the streams are new: from their start
                    self._regroup_at = None
                await self._check_namespace()
            except Exception as exc:
                if not is_redis_failure(exc):  # a bug or an odd reply: never the worker's end
                    self.shell.metrics.step_failed(exc)
                    log.exception("reading the namespace's record failed unexpectedly")

    async def _check_namespace(self) -> None:
        """The namespace's state lost (``_state_lost``), or the record
        now saying another shard count than this worker serves (resharded
        while it ran: it stops, ``fatal``)."""
        if not await self.namespace_lost("the namespace's record changed"):
            meta = self.meta
            if meta is not None:
                self._refuse_changed(meta)

    def _refuse_changed(self, meta: Meta) -> None:
        cfg = self.shell.config
        if meta.shards == cfg.shards or self.fatal:
            return
        self.fatal = (f"the record of namespace {meta.namespace!r} now says {meta.shards} "
                      f"shard(s), this worker serves {cfg.shards}: restart it")
        log.error("namespace changed under this worker: stopping", extra={"error": self.fatal})
        self.stop()

    async def namespace_lost(self, why: str) -> bool:
        """Whether the namespace's state is gone: its record is missing or
        has another epoch than the one this worker started with (then
        ``_state_lost`` has dealt with it). One ``HGETALL``."""
        if self.meta is None:  # (not started by run(): nothing to compare with)
            return False
        meta = await read(self.shell.client, self.shell.config.namespace)
        if meta is not None and meta.epoch == self.meta.epoch:
            if meta.shards != self.meta.shards:
                self.meta = meta
                self._refuse_changed(meta)
            return False
        await self._state_lost(why)
        return True

    async def _state_lost(self, why: str) -> None:
        """The namespace's state is gone: say so once, and have every shard's
        applier publish the turns it knew (``lose_shard_now``); then a
        new record (a new epoch: other workers learn of it too).

        The groups come back two beat periods later, from the watcher, not at
        once: every other worker reads the record once a beat period, so by
        then each has found the loss too and published the turns it knew.
        A worker that read entries written after the loss before it found it
        would take a turn another worker knew for a new one, and publish it
        complete with only those entries (until then its reads find no group,
        which is a finding of its own)."""
        async with self._loss_lock:
            before = self.meta
            meta = await read(self.shell.client, self.shell.config.namespace)
            if before is None or (meta is not None and meta.epoch == before.epoch):
                return  # dealt with already, by another task of this worker
            if meta is None:
                found = "the namespace's record is missing"
            else:
                found = f"the namespace's record has another epoch ({meta.epoch})"
            log.error("the namespace's state in Redis is gone: Redis lost its data (restarted "
                      "without persistence?). Turns in flight that this worker knew are "
                      "published as state_lost; others cannot be known (docs/reliability.md)",
                      extra={"namespace": before.namespace, "error": f"{found}; {why}",
                             "epoch": before.epoch})
            self.shell.metrics.state_lost.inc()
            self.state_lost_at, self.state_lost_why = time.monotonic(), found
            self.generation += 1
            for state in self.shards.values():
                state.mark_lost(True)
            cfg = self.shell.config
            self.meta = await create(self.shell.client, cfg.namespace, cfg.shards, cfg.group)
            self._refuse_changed(self.meta)
            self._regroup_at = time.monotonic() + 2 * self.membership.beat_period

    async def lose_shard_now(self, shard: Shard) -> set[TurnKey]:
        """In ``shard``'s applier: if the namespace's state was found lost
        and this shard's known turns are not published yet, publish them
        (returns the turns published)."""
        state = self.shards[shard.index]
        if not state.lost:
            return set()
        published = await self._lose_shard(shard)
        state.mark_lost(False)
        return published

    async def _lose_shard(self, shard: Shard) -> set[TurnKey]:
        """Publish every turn of ``shard`` this worker knew in flight as
        ``state_lost`` with what it had, then forget everything it kept of
        the shard (the reader opens nothing meanwhile)."""
        state = self.shards[shard.index]
        holds, mirrors = state.holds, state.mirrors
        async with state.opening:
            now = int(time.time() * 1000)
            agui = self.shell.config.agui
            turns: list[LostOutcome] = []
            entries: dict[TurnKey, list[Any]] = {}
            for key, held in holds.turns.items():
                if not held.ids:  # opened for a batch not routed yet: the stored path has it
                    continue
                entries[key] = held.entries
                held.catch_up()  # (an entry that broke it: published without what follows)
                outcome = render(key, held.replay, held.turn_hash(), "lost", now, agui)
                if outcome is not None:
                    turns.append((key, list(held.ids), outcome))
            for key, mirror in mirrors.turns.items():
                if key not in holds.turns:
                    outcome = render(key, mirror.replay, mirror.turn_hash(), "lost", now, agui)
                    if outcome is not None:
                        turns.append((key, [], outcome))
            published: set[TurnKey] = set()
            for i in range(0, len(turns), 100):
                chunk = turns[i:i + 100]
                call = build_publish_lost(shard, chunk, self.shell.options)
                done = await publish_lost_turns(self.shell.scripts.publish_lost_turns, call)
                self.shell.metrics.finalised([outcome for _, _, outcome in chunk], done)
                published.update(key for (key, _, _), ok in zip(chunk, done, strict=True) if ok)
            # A turn another worker published first (both had parts of it while
            # they shared the shard): what this one held goes to the DLQ; of a
            # mirror, which keeps no entries, a note of what is missing.
            late = [entry_of(e) for key, held_entries in entries.items()
                    if key not in published for e in held_entries]
            if late:
                await self._dead_letter_lost_state(shard, late, STATE_LOST_ELSEWHERE)
            await self._note_lost_mirrors(shard, [
                (key, mirror) for key, mirror in mirrors.turns.items()
                if key not in published and key not in holds.turns])
            held_turns = sum(1 for _, ids, _ in turns if ids)
            state.forget()  # (whatever is pending to it now is taken back)
        if turns:
            log.warning("published the turns this worker knew in flight as state_lost",
                        extra={"shard": shard.index, "turns": len(published),
                               "held": held_turns, "mirrors": len(turns) - held_turns})
        return published

    async def _note_lost_mirrors(self, shard: Shard, mirrors: list[tuple[TurnKey, Mirror]]) -> None:
        """Mirrors of turns another worker published as state_lost first: a
        mirror keeps the merge, not the entries, so one dead letter per turn
        says which entries (first .. last id, how many) the published turn
        lacks; their data is gone."""
        if not mirrors:
            return
        async with self.shell.client.pipeline(transaction=False) as pipe:
            for key, mirror in mirrors:
                life = mirror.replay.life
                ids = ["response_id", key.response_id]
                if key.attempt_id:
                    ids += ["attempt_id", key.attempt_id]
                pipe.execute_command(
                    "XADD", shard.dlq, "MAXLEN", "~", self.shell.options.dlq_maxlen, "*", *ids,
                    "reason", STATE_LOST, "detail",
                    f"{life.counts.entries} entries ({life.first_id} .. {life.last_id}) this "
                    "worker had merged into its mirror of the turn, which another worker "
                    "published as state_lost without them; their data is gone",
                    "source_id", life.first_id or "0-0", "deliveries", "0")
            await pipe.execute()
        self.shell.metrics.dead_lettered([STATE_LOST] * len(mirrors))
        self.shell.dead_letters.note(STATE_LOST, shard.index, len(mirrors), [],
                               [key.response_id for key, _ in mirrors])

    async def lost_under(self, shard: Shard, call: ApplyCall, counts: list[Any],
                          versions: dict[TurnKey, Version]) -> str | None:
        """What an ``apply_entries`` reply says of the namespace's state,
        checked (``namespace_lost``) only when Redis answered as only a
        loss (or a rare race) makes it: ``"fenced"`` when not one entry of
        the call was acked (all were pending to this consumer in a group
        that was since replaced), ``"vanished"`` when a turn this worker had
        a mirror of had no state before the call; None otherwise."""
        given = len(call.entries) // 8
        fenced = given > 0 and sum(int(counts[i + 1]) for i in range(0, len(counts) - 1, 2)) == 0
        if not fenced and not self.shards[shard.index].mirrors.vanished(versions):
            return None
        if not await self.namespace_lost("Redis answered for turns this worker knew as if "
                                          "their state were gone"):
            return None
        return "fenced" if fenced else "vanished"

    async def after_loss(self, shard: Shard, entries: list[Entry],
                          merged: set[str] | frozenset[str] = frozenset()) -> None:
        """A batch read before the namespace's state was found lost: what is
        pending to this consumer now (read from the new streams) is applied;
        the rest, which Redis no longer has, goes to the DLQ with its fields
        (``state_lost``): not merged, not silently gone (``merged``: ids that
        are in a turn published as state_lost already)."""
        await self.lose_shard_now(shard)
        cfg = self.shell.config
        first, last = as_text(entries[0][0]), as_text(entries[-1][0])
        try:
            found = await self.shell.client.xpending_range(shard.updates, cfg.group, min=first,
                                                     max=last, count=len(entries) * 2,
                                                     consumername=cfg.consumer)
        except ResponseError as exc:
            if not is_nogroup(exc):
                raise
            found = []
        pending = {as_text(p["message_id"]): int(p["times_delivered"]) for p in found}
        keep = [e for e in entries if as_text(e[0]) in pending]
        gone = [e for e in entries
                if as_text(e[0]) not in pending and as_text(e[0]) not in merged]
        if keep:
            await self.apply(shard, keep, pending)
        if gone:
            await self._dead_letter_lost_state(shard, gone, STATE_LOST_DETAIL)

    async def _dead_letter_lost_state(self, shard: Shard, entries: list[Entry],
                                      detail: str) -> None:
        """Entries this worker has in memory and Redis no longer has, to the
        DLQ with their fields as the producer wrote them (``state_lost``),
        from where ``processor dlq replay`` can bring them back."""
        ids = [as_text(entry_id) for entry_id, _ in entries]
        async with self.shell.client.pipeline(transaction=False) as pipe:
            for entry_id, fields in entries:
                flat = [part for pair in fields.items() for part in pair]
                pipe.execute_command(
                    "XADD", shard.dlq, "MAXLEN", "~", self.shell.options.dlq_maxlen, "*", *flat,
                    "reason", STATE_LOST, "detail", detail,
                    "source_id", as_text(entry_id), "deliveries", "1")
            # (one read since the loss is pending in the new group: done with)
            pipe.xack(shard.updates, self.shell.config.group, *ids)
            await pipe.execute(raise_on_error=False)
        self.shell.metrics.dead_lettered([STATE_LOST] * len(ids))
        self.shell.dead_letters.note(STATE_LOST, shard.index, len(ids), ids)

    # ------------------------------------------------------------ the group

    async def group_vanished(self, shard: Shard) -> bool:
        """Redis answered NOGROUP on ``shard``: True when the namespace's
        whole state is gone (``_state_lost``); else the group is put
        back and this consumer's pending entries restored
        (``recreate_group.lua``), and the caller may run its step again."""
        async with self._regroup_lock:
            if self._regroup_at is not None:  # the state was lost: back when due
                return True
            if await self.namespace_lost(f"the consumer group of {shard.updates} is gone"):
                return True
            cfg = self.shell.config
            state = self.shards[shard.index]
            last, ids = state.last_read, state.pending_here()
            regrouped = await recreate_group(
                self.shell.scripts.recreate_group,
                build_recreate_group(shard, cfg.group, last, cfg.consumer, ids))
            fields = {"shard": shard.index, "group": cfg.group, "last_delivered":
                      regrouped.delivered, "restored": regrouped.claimed,
                      "pending_here": len(ids)}
            if regrouped.status == "kept":  # another worker, or another task here, put it back
                log.info("consumer group put back already; this worker's pending entries "
                         "restored", extra=fields)
                return False
            self.shell.metrics.groups_recreated.labels(str(shard.index)).inc()
            if last == "0":
                log.error("consumer group vanished (XGROUP DESTROY?): recreated at the "
                          "stream's start, as this worker read nothing there: entries "
                          "already merged come back as turn_closed dead letters", extra=fields)
            else:
                log.error("consumer group vanished (XGROUP DESTROY?): recreated at the "
                          "newest entry this worker read there, its pending entries "
                          "restored; entries pending to other consumers are not "
                          "(docs/reliability.md)", extra=fields)
            return False

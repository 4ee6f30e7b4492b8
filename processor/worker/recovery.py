"""What a worker does about entries that are pending but not being applied:
its own, delivered by a read whose reply was lost (take-back), and a dead
worker's, idle in the group's pending list (reclaim); and leaving the group
cleanly. ``Recovery`` is one part of ``Worker``:
these run inside its shard runners, between batches, and apply through the
same transitions."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from redis.exceptions import ResponseError

from processor.redis_io.client import ids_arg
from processor.redis_io.connections import TRANSIENT
from processor.redis_io.read_budget import ReadBudget, ReplyTooLarge, bounded
from processor.redis_io.replies import Entry, as_text
from processor.scripts.lost_calls import (
    ENTRY_LOST,
    build_dead_letter_lost,
    dead_letter_lost,
    lost_turns_of,
)
from processor.scripts.stored_calls import build_dead_letters
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace, Shard
from processor.wire.stream_ids import id_order
from processor.worker.budget import read_count
from processor.worker.membership import Membership
from processor.worker.shard_state import ShardState
from processor.worker.shell import Apply, Retrying, Shell
from processor.worker.stored.storing import StoredPath

log = logging.getLogger("processor.worker")

#: Lost entry ids listed in one log line (the DLQ has every one).
LOST_IDS_LOGGED = 20
#: Turns marked per dead_letter_lost call (two keys each).
LOST_MARK_CHUNK = 1000


class Recovery:
    """Take-back, reclaim and leaving, for the worker's shards (one of the
    parts ``Worker`` is made of)."""

    def __init__(self, shell: Shell, namespace: Namespace, shards: Mapping[int, ShardState],
                 membership: Membership, stored: StoredPath, apply: Apply, retrying: Retrying,
                 read_budget: int) -> None:
        self.shell = shell  # (the worker's client, settings, scripts and metrics, shared)
        self.namespace = namespace
        self.shards = shards
        self.membership = membership
        self.stored = stored  # (dead letters decided here go through apply_entries)
        self.apply = apply  # the worker's: a batch, or one by one if the batch fails
        self.retrying = retrying  # the worker's
        self.read_budget = read_budget  # bytes of one read's reply (processor.worker.budget)

    async def take_back(self, shard: Shard) -> None:
        """Apply what this consumer was delivered but never received, now,
        rather than after --reclaim-idle-ms (a Redis restart or a dropped
        connection would otherwise hold the shard's watermark, so every turn
        of the shard, that long). Each shard loop reads, applies and acks in
        turn, so this consumer's pending entries of a shard are all orphans
        when its loop is back here (or ones left pending on purpose after a
        failure: applying them again is what a reclaim would do). A take-back
        that fails part way goes on, when tried again, after the part it
        did (``ShardState.took_back``): every one of those entries is held
        or applied, and reading them all again at each try, over a
        connection that loses replies, could fail for ever."""
        cfg = self.shell.config
        state = self.shards[shard.index]
        start = state.take_back_from
        count = state.read_count
        # Held entries (held turns) are pending on purpose, not orphans. The
        # set is made once: nothing holds more while this runs (the shard's
        # batches are applied and its apply loop waits for the next), and an
        # entry a spill here stops holding is acked, so no read returns it.
        held = state.held_ids()
        while True:
            # Delivery counts before payloads: an entry over --max-deliveries
            # (one whose reading or applying keeps failing, a MemoryError
            # among them) is dead-lettered unread.
            await self._dead_letter_redelivered(shard, start, count, held)
            budget = ReadBudget(self.read_budget)
            try:
                with bounded(budget):
                    reply: Any = await self.shell.client.xreadgroup(cfg.group, cfg.consumer,
                                                         {shard.updates: start}, count=count)
            except ReplyTooLarge:
                if count > 1:  # one, then as many as fit at its size
                    count = 1
                else:  # the next one alone is past the budget: never read whole
                    await self._dead_letter_unreadable(shard, start, budget.limit)
                continue
            found = [entry for _stream, entries in reply or [] for entry in entries]
            if not found:
                break
            count = read_count(self.read_budget, cfg.batch, budget.bytes, len(found))
            start = as_text(found[-1][0])
            entries = [(i, f) for i, f in found if f and as_text(i) not in held]
            gone = [as_text(i) for i, f in found if not f]
            if gone:  # deleted while pending: their data is gone
                await self._entries_lost(shard, gone, [], "take back")
            if entries:
                log.info("took back undelivered entries",
                         extra={"shard": shard.index, "count": len(entries)})
                state.read_batch(entries)
                try:
                    await self.apply(shard, entries, await self._deliveries(shard, entries))
                finally:
                    state.batch_done(entries)
            state.took_back(start)
            state.floor_marks.taken_back(start)  # (past what a lost read delivered)
        state.orphans_taken_back()

    async def _pending_after(self, shard: Shard, start: str, count: int) -> list[Any]:
        """This consumer's pending entries after ``start`` ("0": all), oldest
        first, at most ``count``, with their delivery counts (no payload)."""
        return list(await self.shell.client.xpending_range(
            shard.updates, self.shell.config.group, min="-" if start == "0" else "(" + start,
            max="+", count=count, consumername=self.shell.config.consumer))

    async def _dead_letter_redelivered(self, shard: Shard, start: str, count: int,
                                       held: set[str]) -> None:
        """Dead-letter, unread, this consumer's pending entries after ``start``
        delivered more than --max-deliveries times (``held`` ones excepted)."""
        cfg = self.shell.config
        over = [(as_text(p["message_id"]), int(p["times_delivered"]))
                for p in await self._pending_after(shard, start, count)
                if int(p["times_delivered"]) > cfg.max_deliveries
                and as_text(p["message_id"]) not in held]
        if over:
            detail = "delivered {} times without being acked (limit {})"
            await self.stored.store(shard, [], {}, build_dead_letters(shard, [
                (i, "max_deliveries", detail.format(n, cfg.max_deliveries), n)
                for i, n in over], self.shell.options))

    async def _dead_letter_unreadable(self, shard: Shard, start: str, limit: int) -> None:
        """The entry after ``start`` pending to this consumer is alone past the
        read budget (far over --max-entry-bytes: processor.worker.budget.read_bytes
        leaves room for any valid one): dead-letter it ``too_large``, unread."""
        pending = await self._pending_after(shard, start, 1)
        if not pending:
            return
        entry_id, n = as_text(pending[0]["message_id"]), int(pending[0]["times_delivered"])
        detail = f"the entry is over {limit} bytes, the worker's read budget: not read"
        log.warning("entry past the read budget, dead-lettered unread",
                    extra={"shard": shard.index, "entry_id": entry_id})
        await self.stored.store(shard, [], {}, build_dead_letters(
            shard, [(entry_id, "too_large", detail, n)], self.shell.options))

    async def _deliveries(self, shard: Shard, entries: list[Entry]) -> dict[str, int]:
        """How many times each of this consumer's pending entries was delivered."""
        pending = await self.shell.client.xpending_range(
            shard.updates, self.shell.config.group, min=entries[0][0], max=entries[-1][0],
            count=len(entries) * 2, consumername=self.shell.config.consumer,
        )
        return {as_text(p["message_id"]): int(p["times_delivered"]) for p in pending}

    async def reclaim(self, shard: Shard) -> None:
        """Take over entries idle in any consumer's pending list (a dead worker's)."""
        cfg = self.shell.config
        await self.claim_departed(shard)
        # XAUTOCLAIM scans at most 10 * count pending entries per call: go on
        # from where the last call stopped, so idle entries behind many
        # in-flight ones are found too.
        try:
            with bounded(ReadBudget(self.read_budget)):  # (processor.worker.budget)
                reply = await self.shell.client.xautoclaim(
                    shard.updates, cfg.group, cfg.consumer, min_idle_time=cfg.reclaim_idle_ms,
                    start_id=self.shards[shard.index].reclaim_cursor,
                    count=self.shards[shard.index].read_count,
                )
        except ReplyTooLarge:
            # Claimed for this consumer, the reply cut: taken back, bounded
            # and delivery counts first, before the next read.
            self.shards[shard.index].reply_lost()
            return
        except Exception:
            # Claimed for this consumer, maybe, and the reply lost (an outage,
            # or a MemoryError reading it): taken back before the next read.
            self.shards[shard.index].reply_lost()
            raise
        self.shards[shard.index].reclaiming(as_text(reply[0]))
        entries = [(i, f) for i, f in reply[1] if f is not None]
        # Entries deleted from the stream while pending (a trim): Redis 7 takes
        # them out of the pending list and lists their ids apart, to this
        # caller only; Redis 6.2 returns a nil entry, without its id, and
        # leaves it pending to this consumer, whose take-back names it.
        removed = [as_text(i) for i in reply[2]] if len(reply) > 2 else []
        if removed:
            await self.retrying(self._entries_lost, shard, [], removed, "reclaim")
        if any(f is None for _i, f in reply[1]):
            self.shards[shard.index].reply_lost()
        await self._apply_claimed(shard, entries)

    async def claim_departed(self, shard: Shard) -> None:
        """Take over at once what consumers that left the live set still have
        pending on ``shard`` (their beats stopped for --worker-ttl and they have
        not read since: dead), instead of after --reclaim-idle-ms. A turn a dead
        worker held, cancelled meanwhile, waits for exactly those entries
        (docs/design.md, *Cancellation*). Only with shard affinity: without
        beats no worker knows who is alive."""
        membership, cfg = self.membership, self.shell.config
        if not membership.enabled:
            return
        live = {*membership.live, cfg.consumer}
        for info in await self.shell.client.xinfo_consumers(shard.updates, cfg.group):
            name = as_text(info["name"])
            if name in live or not info["pending"] or info["idle"] < membership.ttl_ms:
                continue
            pending = await self.shell.client.xpending_range(
                shard.updates, cfg.group, min="-", max="+",
                count=self.shards[shard.index].read_count, consumername=name)
            ids = await self._gone_before_claim(shard, [as_text(p["message_id"]) for p in pending])
            if not ids:
                continue
            try:
                with bounded(ReadBudget(self.read_budget)):
                    claimed: Any = await self.shell.client.xclaim(
                        shard.updates, cfg.group, cfg.consumer, min_idle_time=0,
                        message_ids=ids_arg(ids))
            except ReplyTooLarge:
                self.shards[shard.index].reply_lost()  # claimed, the reply cut: taken back
                return
            except Exception:
                self.shards[shard.index].reply_lost()
                raise
            entries = [(i, f) for i, f in claimed if f]
            if any(not f for _i, f in claimed):  # (6.2: deleted since; taken back, named there)
                self.shards[shard.index].reply_lost()
            log.info("took over a departed worker's entries",
                     extra={"shard": shard.index, "consumer": name, "count": len(entries)})
            await self._apply_claimed(shard, entries)

    async def _gone_before_claim(self, shard: Shard, ids: list[str]) -> list[str]:
        """Of ``ids``, pending to a departed consumer when listed, those still
        in the stream (to claim); the others are dead-lettered ``entry_lost``
        if, and only if, they are still pending (dead_letter_lost.lua XACKs
        them, atomically): an entry another worker claimed, applied and acked
        since it was listed is trimmed too, and was merged, not lost (telling
        the two apart after the XCLAIM, by the entry's absence alone, called
        such merged entries lost and marked their shard's open turns). An
        entry XCLAIM then does not return was acked by another meanwhile;
        or, on Redis 7, deleted from the stream (a trim, an XDEL, never the
        worker's own, which keeps every pending entry) in the instant between
        this check and the XCLAIM, which drops it unreported: not told apart."""
        async with self.shell.client.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.xrange(shard.updates, entry_id, entry_id)
            found = await pipe.execute()
        gone = [i for i, there in zip(ids, found, strict=True) if not there]
        if gone:
            await self.retrying(self._entries_lost, shard, gone, [], "departed worker")
        return [i for i, there in zip(ids, found, strict=True) if there]

    async def _apply_claimed(self, shard: Shard, entries: list[Entry]) -> None:
        """Apply entries this consumer just claimed from another."""
        if not entries:
            return
        # Pending to this consumer now, neither held nor applied until applied
        # below: no floor for the watermark meanwhile (ShardState.floor); if
        # applying them fails, they are taken back before the next read.
        self.shards[shard.index].claim(True)
        try:
            deliveries = await self._deliveries(shard, entries)
            self.shell.metrics.read(shard.index, len(entries), "reclaim")
            log.info("reclaimed entries", extra={"shard": shard.index, "count": len(entries)})
            self.shards[shard.index].read_batch(entries)
            try:
                await self.apply(shard, entries, deliveries)
            finally:
                self.shards[shard.index].batch_done(entries)
        except BaseException:
            self.shards[shard.index].reply_lost()
            raise
        finally:
            self.shards[shard.index].claim(False)

    async def _entries_lost(self, shard: Shard, pending: list[str], removed: list[str],
                            where: str) -> None:
        """Entries deleted from the stream while pending (``pending``: still
        pending to this consumer; ``removed``: XAUTOCLAIM took them out of the
        pending list): their data is gone. Each gets an ``entry_lost`` dead
        letter (no fields), the metric and one warning with the ids; and the
        turns that may have had one of them are marked, so that they end as
        ``entries_lost`` rather than complete without it
        (``lost_turns_of`` says which)."""
        lost = [*pending, *removed]
        turns = lost_turns_of(lost, await self._active_turns(shard))
        first = min(lost, key=id_order)
        script = self.shell.scripts.dead_letter_lost
        chunk = turns[:LOST_MARK_CHUNK]
        call = build_dead_letter_lost(shard, pending, removed, chunk, first, self.shell.options)
        ids, marked = await dead_letter_lost(script, call)
        for i in range(LOST_MARK_CHUNK, len(turns) if ids else 0, LOST_MARK_CHUNK):
            chunk = turns[i:i + LOST_MARK_CHUNK]
            call = build_dead_letter_lost(shard, [], [], chunk, first, self.shell.options)
            marked += (await dead_letter_lost(script, call)).marked
        if not ids:
            return  # (another consumer acked them first)
        self.shell.metrics.lost_entries.labels(str(shard.index)).inc(len(ids))
        self.shell.metrics.dead_lettered([ENTRY_LOST] * len(ids))
        log.warning("entries deleted from the stream while pending: their data is gone",
                    extra={"shard": shard.index, "where": where, "count": len(ids),
                           "entry_ids": ids[:LOST_IDS_LOGGED], "turns_marked": marked})

    async def _active_turns(self, shard: Shard) -> dict[TurnKey, tuple[int, str]]:
        """Each active turn of ``shard`` with its start (ms) and the padded id
        of the entry that ended it ("" if none): what lost_turns_of needs."""
        members = [TurnKey.decode(as_text(tk))
                   for tk in await self.shell.client.zrange(shard.active, 0, -1)]
        found: dict[TurnKey, tuple[int, str]] = {}
        for i in range(0, len(members), LOST_MARK_CHUNK):
            chunk = members[i:i + LOST_MARK_CHUNK]
            async with self.shell.client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.hmget(shard.turn(key.encode()), "started", "ended")
                replies = await pipe.execute()
            for key, (started, ended) in zip(chunk, replies, strict=True):
                if started is not None:
                    found[key] = (int(as_text(started)), as_text(ended) if ended else "")
        return found

    async def leave(self) -> None:
        """Remove this consumer from each group once it holds no pending entry."""
        for shard in self.namespace.all():
            try:
                info = await self.shell.client.xpending_range(
                    shard.updates, self.shell.config.group, min="-", max="+", count=1,
                    consumername=self.shell.config.consumer,
                )
                if not info:
                    await self.shell.client.xgroup_delconsumer(
                        shard.updates, self.shell.config.group, self.shell.config.consumer
                    )
            except (*TRANSIENT, ResponseError) as exc:
                log.warning("could not remove consumer", extra={"error": repr(exc)})


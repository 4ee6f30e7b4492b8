"""Held turns (``--hold-turns``): a turn's entries kept pending in the
stream, merged only in this worker's memory, and acked all at once when the
turn is published (docs/design.md, *Held turns*).

Pure bookkeeping: which turns of a batch this worker holds, what it holds
of each (the merge so far, and the entries as read, which a *spill* hands
to ``apply_entries`` when holding a turn stops being safe or cheap), and
which held turns are due to spill. The I/O is the worker's
(``processor.worker.held.path``).

A turn is held only from its first entry on (``open_turns`` says whether
any consumer started it before); once spilled, it takes the
``apply_entries`` path for good.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from processor.engine.lifecycle import DUPLICATE, Limits, TurnLife
from processor.engine.replay import Replay
from processor.engine.shown import Shown
from processor.ingest.decode import EntryError, decode_plain, decode_stream_entry, entry_size
from processor.redis_io.replies import Entry, RawEntry, as_text, fields_of
from processor.scripts.stored_calls import Applied
from processor.wire.ids import TurnKey
from processor.wire.stream_ids import after, id_order
from processor.worker.held.batch import HeldBatch, Part, Run, entry_order, part_entries
from processor.worker.stored.mirror import TurnCopy

_json = msgspec.json.Encoder()

#: Bytes, named apart from the ``bytes`` field of ``Holds`` (a class
#: scope where ``bytes`` is that field).
Blob = bytes

#: Turns remembered as taking the ``apply_entries`` path (so that their next
#: entries need no ``open_turns`` call), per shard; forgotten all at once.
OLD_TURNS = 10_000


@dataclass(kw_only=True)
class Held(TurnCopy):
    """What this worker holds of one turn (a ``TurnCopy``
    never stored: version 0).

    Its plain updates may wait in ``pending`` (their JSON texts, not
    decoded yet: the last ``len(pending)`` of ``entries`` and ``ids``)
    while the turn is open and they stay within its limits (so each one
    would be merged): ``catch_up`` decodes them together and feeds them
    before anything reads the replay. One that turns out to be an entry
    ``apply_entries`` dead-letters breaks the turn, which must then spill
    (the stored path dead-letters it in its place)."""

    key: TurnKey
    since: float  # monotonic seconds when it was opened
    refreshed: float = 0.0  # when its entries' idle time was last reset (0: never)
    # Its last checkpoint (checkpoint_held): the snapshot stored, and its
    # newest entry ('' = none). A spill follows the turn from there.
    checkpoint: bytes = b""
    checkpoint_id: str = ""
    entries: list[RawEntry] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    size: int = 0  # bytes of its entries (and of its last checkpoint's snapshot)
    pending: list[bytes] = field(default_factory=list)  # plain updates not fed yet
    broken: bool = False  # holds an entry apply_entries dead-letters: spill it
    # How many more plain updates, and bytes of them, may wait in pending:
    # what the turn's limits leave once everything pending is fed.
    room_updates: int = 0
    room_bytes: int = 0
    # Live progress (processor.engine.live): what its events said so far
    # (False: silent, see processor.worker.live_progress), how many updates its
    # log holds, and how many publish_live calls for it ran (the call's token).
    shown: Shown | Literal[False] = field(default_factory=Shown)
    logged: int = 0
    spoken: int = 0

    def __post_init__(self) -> None:
        self._reroom()

    @property
    def ended(self) -> bool:
        """Whether an entry ended it (end, error, a limit): ready to publish."""
        return self.replay.life.outcome is not None

    def take_run(self, run: Run) -> None:
        """Hold a run of plain updates: all of them wait when the turn has
        room for all (the usual case), else each waits or is fed as the room
        left says, one after the other."""
        if len(run.texts) <= self.room_updates and run.size <= self.room_bytes:
            self.pending += run.texts
            self.fresh += run.texts
            self.room_updates -= len(run.texts)
            self.room_bytes -= run.size
            self.entries += run.entries
            self.ids += run.ids
        else:
            for raw, text, entry_id, size in zip(run.entries, run.texts, run.ids, run.sizes(),
                                                 strict=True):
                if self.room_updates and size <= self.room_bytes:
                    self.pending.append(text)
                    self.room_updates -= 1
                    self.room_bytes -= size
                else:
                    self._feed_fields(entry_id, fields_of(raw))
                self.fresh.append(text)
                self.entries.append(raw)
                self.ids.append(entry_id)
        self.size += run.size

    def take_single(self, raw: RawEntry, entry: Applied) -> None:
        """Feed a decoded entry now, after what is pending."""
        merged = True
        if self.catch_up():
            merged = self.replay.feed(entry.entry_id, entry.record, entry.size) is not DUPLICATE
            self._reroom()
        if entry.record.update is not None and merged:  # (a repeat is merged nowhere)
            self.fresh.append(_json.encode(entry.record.update))
        self.entries.append(raw)
        self.ids.append(entry.entry_id)
        self.size += entry.size

    def catch_up(self) -> bool:
        """Feed the pending plain updates, decoded together (or one by one
        if that fails); False if the turn is broken (it must spill)."""
        pending = self.pending
        if pending and not self.broken:
            self.pending = []
            n = len(pending)
            updates = decode_plain(pending)
            # (The room left for pending entries is what they will not take.)
            life = self.replay.life
            size = life.limits.max_turn_bytes - life.bytes - self.room_bytes
            ids, entries = self.ids, self.entries

            def prefix(k: int) -> tuple[int, str]:  # (only when a usage does not fit)
                fed = entries[len(entries) - n:len(entries) - n + k]
                return sum(entry_size(fields_of(e)) for e in fed), ids[k - n - 1]

            fed = 0 if updates is None else self.replay.feed_updates(
                updates, ids[-n], ids[-1], size, prefix)
            if fed < n:  # the rest one by one, as apply_entries decodes each
                for entry_id, entry in zip(ids[fed - n:], entries[fed - n:], strict=True):
                    if not self._feed_now(entry_id, fields_of(entry)):
                        break
            self._reroom()
        return not self.broken

    def _feed_fields(self, entry_id: str, fields: dict[Any, Any]) -> None:
        """Feed a plain update now (no room for it to wait), after what is pending."""
        if self.catch_up() and self._feed_now(entry_id, fields):
            self._reroom()

    def _feed_now(self, entry_id: str, fields: dict[Any, Any]) -> bool:
        """Feed one entry as ``apply_entries`` would decode it; False (and
        the turn broken) if it would dead-letter it."""
        try:
            _key, record, size = decode_stream_entry(
                fields, max_entry_bytes=self.replay.life.limits.max_entry_bytes)
        except EntryError:
            self.broken = True
            self.room_updates = 0
            return False
        self.replay.feed(entry_id, record, size)
        return True

    def _reroom(self) -> None:
        life = self.replay.life
        if life.outcome is not None or self.broken:
            self.room_updates = 0
            return
        limits = life.limits
        self.room_updates = limits.max_turn_updates - life.counts.updates
        self.room_bytes = limits.max_turn_bytes - life.bytes


@dataclass
class Routed:
    """Where a batch's entries go."""

    held: list[TurnKey]  # turns fed this batch
    stored: list[Entry]  # entries for apply_entries, in batch order
    broken: list[TurnKey] = field(default_factory=list)  # held turns to spill (Held.broken)


@dataclass
class Holds:
    """One shard's held turns, oldest first, bounded in number and bytes."""

    limits: Limits
    max_turns: int
    max_bytes: int
    turns: dict[TurnKey, Held] = field(default_factory=dict)
    old: set[TurnKey] = field(default_factory=set)
    bytes: int = 0
    last: tuple[int, int] = (0, 0)  # the newest entry routed (batches arrive in id order)
    stale_at: float = 0.0  # (monotonic) no held turn is stale before: stale() need not look

    def to_open(self, batch: HeldBatch) -> dict[TurnKey, dict[str, str]]:
        """The batch's turns this worker knows nothing of yet, in first-seen
        order, with their first entry's correlation ids (for synthesis.started,
        as ``apply_entries`` would publish it).

        A turn whose first entry is a plain update ``apply_entries`` would
        dead-letter is not held: the stored path starts a turn at its first
        entry it applies, and never for one that only ever dead-letters.
        Holding it would publish its ``synthesis.started`` and leave it
        active until it timed out."""
        if len(self.old) > OLD_TURNS:
            self.old.clear()
        turns, old = self.turns, self.old
        fresh: dict[TurnKey, dict[str, str]] = {}
        for key, parts in batch.turns.items():
            if key in turns or key in old:
                continue
            first = parts[0]
            if not isinstance(first, Run):
                fresh[key] = first[1].record.ids
            elif self._decodes(first.entries[0]):
                fresh[key] = {}
            else:
                old.add(key)
        return fresh

    def _decodes(self, entry: RawEntry) -> bool:
        """Whether ``apply_entries`` would decode a plain update (its JSON
        is read only now: a run's are decoded together later)."""
        try:
            decode_stream_entry(fields_of(entry),
                                max_entry_bytes=self.limits.max_entry_bytes)
        except EntryError:
            return False
        return True

    def opened(self, statuses: dict[TurnKey, bool], started: str, now: float) -> None:
        """open_turns' answer: True for each turn now held, False for the others."""
        for key, held in statuses.items():
            if held:
                self.turns[key] = Held(replay=Replay(TurnLife(key, self.limits)), started=started,
                                       key=key, since=now)
            else:
                self.old.add(key)

    def route(self, entries: list[RawEntry], batch: HeldBatch) -> Routed:
        """Feed the entries of held turns (a run of plain updates may wait,
        see ``Held``); the rest are stored (an entry that failed to
        decode is dead-lettered by ``apply_entries``, which moves its turn's
        version: a held turn then spills at its finalise). A batch routed
        again (its reply lost, the same call retried) feeds nothing twice."""
        turns = self.turns
        fed: list[TurnKey] = []
        stored = list(batch.failed)  # (a copy: a batch may be routed again)
        seen = self._routed(entries)
        size = 0
        for key, parts in batch.turns.items():
            held = turns.get(key)
            if held is None:
                stored += [e for part in parts for e in part_entries(part)]
                continue
            before = held.size
            for part in parts if seen is None else _after(parts, seen):
                if isinstance(part, Run):
                    held.take_run(part)
                else:
                    held.take_single(*part)
            if held.size != before:  # (every entry has a size: something was fed)
                fed.append(key)
                size += held.size - before
        self.bytes += size
        if len(stored) > 1:  # in batch order, as apply_entries would have had them
            stored.sort(key=entry_order)
        return Routed(fed, stored, [key for key in fed if turns[key].broken])

    def _routed(self, entries: list[RawEntry]) -> tuple[int, int] | None:
        """Move the last id routed to this batch's; return the one before if
        this batch starts at or below it (routed before), else None."""
        if not entries:
            return None
        first, last = (id_order(as_text(entries[i][0])) for i in (0, -1))
        before = self.last
        self.last = max(before, last)
        return before if first <= before else None

    def checkpointed(self, key: TurnKey, version: int, snap: Blob, now: float) -> None:
        """``checkpoint_held`` stored the turn's merge and acked its entries:
        it holds none now, under its new version, held again from ``now``
        (so last in the order ``due`` reads)."""
        held = self.turns.pop(key)
        self.turns[key] = held
        held.checkpoint, held.checkpoint_id = snap, held.ids[-1]
        held.version = version
        # (What it holds now: the snapshot, kept for a spill, then its next
        # entries; the holds' byte bound counts both.)
        self.bytes += len(snap) - held.size
        held.size = len(snap)
        held.entries.clear()
        held.ids.clear()
        held.fresh.clear()  # (said before the checkpoint: the log holds them)
        held.logged = 0  # (of the entries held from now on, those a spill stores)
        held.since, held.refreshed = now, 0.0

    def take(self, key: TurnKey) -> Held | None:
        held = self.turns.pop(key, None)
        if held is not None:
            self.bytes -= held.size
        return held

    def stale(self, now: float, every: float) -> list[str]:
        """The ids of the entries of turns held or last refreshed ``every``
        seconds ago or more, whose idle time the holder now resets (so that
        no worker reclaims what is held on purpose); marks them refreshed."""
        if now < self.stale_at:
            return []
        ids: list[str] = []
        soonest = now + every  # (a turn opened from now on is stale no sooner)
        for held in self.turns.values():
            at = max(held.since, held.refreshed) + every
            if at <= now:
                held.refreshed = now
                ids += held.ids
            elif at < soonest:
                soonest = at
        self.stale_at = soonest
        return ids

    def due(self, now: float, hold_s: float) -> list[TurnKey]:
        """Turns to spill now: held longer than ``hold_s``, or the oldest
        over the bounds in number and bytes."""
        keys: list[TurnKey] = []
        count, size = len(self.turns), self.bytes
        for key, held in self.turns.items():
            if now - held.since < hold_s and count <= self.max_turns and size <= self.max_bytes:
                break
            keys.append(key)
            count, size = count - 1, size - held.size
        return keys


def _after(parts: list[Part], seen: tuple[int, int]) -> list[Part]:
    """The parts of a batch routed again, less the entries routed before
    (at or below ``seen``)."""
    out: list[Part] = []
    for part in parts:
        if isinstance(part, Run):
            keep = [i for i, entry_id in enumerate(part.ids) if id_order(entry_id) > seen]
            if keep:
                out.append(part.subset(keep))
        elif id_order(part[1].entry_id) > seen:
            out.append(part)
    return out


@dataclass
class Floor:
    """The ``floor`` of includes/watermark.lua for one shard: the oldest id
    this consumer may have pending there without having held or applied it.
    Its batches are read in id order, one ahead of the applier; a batch read
    but not yet routed is unknown, and so is anything after the last one read
    (a read whose reply is on its way)."""

    unrouted: deque[str] = field(default_factory=deque)  # first ids, oldest first
    last: str = ""  # the last id read
    routed_to: str = ""  # the last id of the newest batch routed ("" none yet)

    def read(self, first: str, last: str) -> None:
        self.unrouted.append(first)
        self.last = last

    def routed(self, first: str, last: str) -> None:
        """The batch from ``first`` to ``last`` is held or applied (or failed:
        its entries are then pending to this consumer, which takes them back)."""
        if self.unrouted and self.unrouted[0] == first:
            self.unrouted.popleft()
        if not self.routed_to or id_order(last) > id_order(self.routed_to):
            self.routed_to = last

    def taken_back(self, last: str) -> None:
        """This consumer's pending entries up to ``last`` are held or applied
        (a take-back): some may be after the last read, whose reply was lost."""
        if not self.last or id_order(last) > id_order(self.last):
            self.last = last

    def value(self) -> str:
        if self.unrouted:
            return self.unrouted[0]
        return after(self.last) if self.last else ""

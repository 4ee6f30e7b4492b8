"""What a worker keeps of one shard: one ``ShardState`` per shard,
made by the worker and read and changed only by that shard's loop (its
reader and its applier, ``processor.worker.runner``) and the paths it
runs (held, stored, recovery, continuity). Plain data, the small
questions asked of it and the methods that change it: each field is
written by this class's own methods only (the turns' holds and mirrors by
their own classes); no I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from processor.engine.shown import Shown
from processor.redis_io.replies import Entry, RawEntry, as_text
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.wire.stream_ids import after, id_order
from processor.worker.held.holds import Floor, Holds
from processor.worker.stored.mirror import Mirrors


class HandedLive(NamedTuple):
    """A spilled turn's live state, from the held path to the stored path's
    first publish of it (processor.worker.live_progress)."""

    shown: Shown | Literal[False]  # what its events said (False: silent)
    logged: int  # how many of its updates its live log holds
    spoken: int  # how many publish_live calls for it ran


@dataclass(eq=False)
class ShardState:
    """One shard's state in this worker."""

    shard: Shard
    holds: Holds  # the held turns (processor.worker.held)
    mirrors: Mirrors  # the mirrors of stored turns (processor.worker.stored.mirror)
    read_count: int  # the COUNT of the shard's next read (processor.worker.budget)
    hold_turns: bool = False  # --hold-turns: a floor is given the watermark
    floor_marks: Floor = field(default_factory=Floor)  # what the floor is computed from
    opening: asyncio.Lock = field(default_factory=asyncio.Lock)  # one open_turns at a time
    cursor: int = 0  # where the next sweep's slice of active turns starts
    active: int = 0  # active turns, as last swept
    reclaim_cursor: str = "0-0"  # where the next XAUTOCLAIM starts
    last_read: str = "0"  # the newest entry read ("0": none)
    # Entries may be pending to this consumer that it never received: a
    # read whose reply a connection error lost (and, at start, a previous
    # process with the same consumer name). Taken back before the next read.
    orphans: bool = True
    # Where the take-back goes on from: "0", or the newest entry of its
    # part that is done, when a failure cut it (its next try goes on there
    # rather than read again every entry held or applied since "0").
    take_back_from: str = "0"
    claimed: bool = False  # reclaimed entries being applied (recovery.py)
    lost: bool = False  # the namespace's state was lost: known turns still to publish
    # Cancelled turns whose finalise answered "not yet" (stored path).
    waiting_cancels: set[TurnKey] = field(default_factory=set)
    # Batches read (or taken over) and not yet applied.
    unapplied: list[list[RawEntry] | list[Entry]] = field(default_factory=list)
    # Spilled turns' live state, until the stored path's first publish of them.
    live_handed: dict[TurnKey, HandedLive] = field(default_factory=dict)

    @property
    def index(self) -> int:
        return self.shard.index

    @property
    def held_turns(self) -> list[TurnKey]:
        """The turns held now, oldest first."""
        return list(self.holds.turns)

    @property
    def mirrored_turns(self) -> list[TurnKey]:
        """The stored turns this worker has a mirror of now, oldest first."""
        return list(self.mirrors.turns)

    def unknown_pending(self) -> bool:
        """Whether entries may be pending to this consumer here that it
        neither holds nor has applied (taken back before its next read)."""
        return self.orphans or self.claimed

    def floor(self) -> str:
        """The ``floor`` this consumer gives the watermark (includes/watermark.lua):
        none without --hold-turns, nor while it may have pending entries it
        neither holds nor has applied (a lost reply or a failed apply: it
        takes them back first; entries it reclaimed, until applied)."""
        if not self.hold_turns or self.unknown_pending():
            return ""
        return self.floor_marks.value()

    def held_ids(self) -> set[str]:
        """The ids of every entry this worker holds here."""
        return {i for held in self.holds.turns.values() for i in held.ids}

    def read_batch(self, entries: list[RawEntry] | list[Entry]) -> None:
        """A batch read (or taken over) and not yet applied."""
        if entries:
            self.unapplied.append(entries)

    def read_ahead_from(self) -> str:
        """The first entry id of the oldest read this worker has not taken
        in yet ('' none): read ahead of its applier, not routed (holding
        turns) or not applied (storing every entry), or a read whose reply
        was lost (after the last read: taken back later). A cancel's cut
        leaves it out (includes/cancel_cut.lua)."""
        if self.hold_turns and self.floor_marks.unrouted:
            return self.floor_marks.unrouted[0]
        if not self.hold_turns and self.unapplied:
            return as_text(self.unapplied[0][0][0])
        return after(self.last_read) if self.orphans and self.last_read != "0" else ""

    def read_done(self, last: str, count: int) -> None:
        """A read delivered entries up to ``last``; the next reads ``count``."""
        self.last_read, self.read_count = last, count

    def reply_lost(self, *, cut: bool = False) -> None:
        """Entries may be pending to this consumer that it never received
        (a reply lost to an error, or ``cut`` past its byte budget: then the
        next read takes one entry first): taken back before the next read."""
        self.orphans = True
        self.take_back_from = "0"  # (they may be older than where a take-back was)
        if cut:
            self.read_count = 1

    def took_back(self, last: str) -> None:
        """The take-back is done with this consumer's pending entries up to ``last``."""
        self.take_back_from = last

    def orphans_taken_back(self) -> None:
        self.orphans = False
        self.take_back_from = "0"

    def reclaiming(self, cursor: str) -> None:
        """The next XAUTOCLAIM starts at ``cursor``."""
        self.reclaim_cursor = cursor

    def claim(self, claimed: bool) -> None:
        """Reclaimed entries are being applied (True) or were (False)."""
        self.claimed = claimed

    def swept(self, start: int, size: int, sliced: int, count: int) -> None:
        """A sweep looked at ``sliced`` active turns from ``start`` (of a
        slice of ``size``) and counted ``count``: the next starts after
        them, or from the first once this one reached the end."""
        self.active = count
        self.cursor = 0 if start + size >= count else start + sliced

    def mark_lost(self, lost: bool) -> None:
        """The namespace's state was found lost (True) and this shard's known
        turns are still to publish, or they are published (False)."""
        self.lost = lost

    def cancels_waiting(self, keys: Iterable[TurnKey]) -> None:
        """Cancelled turns whose finalise must wait for an entry up to their cut."""
        self.waiting_cancels.update(keys)

    def cancels_done(self, keys: Iterable[TurnKey]) -> None:
        """Cancelled turns finalised: no longer waiting."""
        self.waiting_cancels.difference_update(keys)

    def cancels_still_waiting(self, keys: Iterable[TurnKey]) -> None:
        """Of the waiting cancelled turns, only ``keys`` still wait."""
        self.waiting_cancels.intersection_update(keys)

    def hand_live(self, key: TurnKey, state: HandedLive) -> None:
        """A spilled turn's live state, until the stored path publishes it."""
        self.live_handed[key] = state

    def take_handed(self, key: TurnKey) -> HandedLive | None:
        """A spilled turn's live state, handed to the stored path's publish."""
        return self.live_handed.pop(key, None)

    def batch_done(self, entries: list[RawEntry] | list[Entry]) -> None:
        batches = self.unapplied
        for i, batch in enumerate(batches):
            if batch is entries:
                del batches[i]
                return

    def pending_here(self) -> list[str]:
        """Every entry this consumer has pending here as far as it knows:
        those it holds and those it read and has not applied yet."""
        ids = self.held_ids()
        for batch in self.unapplied:
            ids.update(as_text(entry[0]) for entry in batch)
        return sorted(ids, key=id_order)

    def forget(self) -> None:
        """Forget everything kept of the shard's turns and reads (the
        namespace's state was lost: continuity.py); whatever is pending to
        this consumer now is taken back before the next read."""
        holds, mirrors = self.holds, self.mirrors
        holds.turns.clear()
        holds.old.clear()
        holds.bytes, holds.last = 0, (0, 0)
        for key in list(mirrors.turns):
            mirrors.drop(key)
        self.floor_marks = Floor()
        self.orphans = True
        self.take_back_from = "0"
        self.last_read = "0"
        self.reclaim_cursor = "0-0"

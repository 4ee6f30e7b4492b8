"""A batch read for holding (``--hold-turns``), grouped per turn.

Each turn's entries of the batch, in arrival order, are *runs* of plain
updates (just ``response_id`` and ``update``, ASCII, within the entry
limit: what producers send for nearly every delta), their JSON not
decoded, and *singles*: any other entry, decoded as ``apply_entries``
would decode it. An entry that fails to decode, or belongs to another
shard, is left to ``apply_entries`` (it dead-letters it).

Why runs: a worker holding turns is bound by its own Python, and a batch
holds a turn's updates by the dozen. Grouping takes one short step per
entry; what a run's entries need (their texts, ids, sizes, the ASCII
check) is then taken in C-level passes over the run (``map``, ``join``),
and a held turn takes a run in one step (``processor.worker.held.holds.Held.take_run``).
``group_each`` is the reference, one entry at a time as
``apply_entries`` decodes it; ``group_batch`` must give what it gives
(``tests/worker/test_held_batch.py``).

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from processor.ingest.decode import (
    PLAIN_NAMES,
    EntryError,
    decode_stream_entry,
    peek_plain,
    recent_turn,
)
from processor.ingest.entry_fields import entry_shard
from processor.redis_io.replies import Entry, RawEntry, as_text, entries_of, entry_of, fields_of
from processor.scripts.calls import BatchOptions
from processor.scripts.stored_calls import Applied
from processor.wire.ids import TurnKey, shard_of
from processor.wire.keys import Shard
from processor.wire.stream_ids import id_order

_ids = itemgetter(0)


class Run:
    """Consecutive plain updates of one turn in a batch (no other entry of
    the turn between them), their JSON not decoded, each entry as read.
    Each entry's size is ``base + len(text)``."""

    __slots__ = ("base", "checked", "entries", "ids", "size", "texts")

    def __init__(self) -> None:
        self.entries: list[RawEntry] = []
        self.texts: list[Any] = []  # each entry's update field, bytes once checked
        self.ids: list[str] = []
        self.base = 0
        self.size = 0
        self.checked = False

    def check(self, base: int, max_entry_bytes: int) -> bool:
        """Take the ids and size (``base``: an entry's size less its text);
        False if any entry is not a plain update after all (its text not
        bytes, not ASCII, or over the limit)."""
        texts = self.texts
        if len(texts) == 1:  # (many live turns: one update of each per batch)
            return self._check_one(base, max_entry_bytes)
        try:
            joined = b"".join(texts)
        except TypeError:  # a str value: not as Redis returns it
            return False
        if not joined.isascii() or set(map(type, texts)) != {bytes}:
            return False
        # (Within the limit all together: each is. Else look at each.)
        if len(joined) + base > max_entry_bytes and max(map(len, texts)) + base > max_entry_bytes:
            return False
        raw_ids = list(map(_ids, self.entries))
        try:
            self.ids = list(map(bytes.decode, raw_ids))
        except TypeError:  # ids as str (never from Redis): one at a time
            self.ids = list(map(as_text, raw_ids))
        self.base = base
        self.size = len(joined) + base * len(texts)
        self.checked = True
        return True

    def _check_one(self, base: int, max_entry_bytes: int) -> bool:
        """``check`` of a run of one entry, without its joins and maps."""
        text = self.texts[0]
        if text.__class__ is not bytes or not text.isascii() \
                or len(text) + base > max_entry_bytes:
            return False
        entry_id = self.entries[0][0]
        self.ids = [entry_id.decode() if entry_id.__class__ is bytes else as_text(entry_id)]
        self.base = base
        self.size = len(text) + base
        self.checked = True
        return True

    def sizes(self) -> list[int]:
        base = self.base
        return [base + len(text) for text in self.texts]

    def subset(self, keep: list[int]) -> Run:
        """A checked run of the entries at positions ``keep`` only."""
        run = Run()
        run.entries = [self.entries[i] for i in keep]
        run.texts = [self.texts[i] for i in keep]
        run.ids = [self.ids[i] for i in keep]
        run.base, run.checked = self.base, True
        run.size = sum(run.sizes())
        return run


#: A single: an entry as read, and as decoded.
Single = tuple[RawEntry, Applied]
Part = Run | Single


@dataclass
class HeldBatch:
    """A batch read for holding, as ``group_batch`` groups it."""

    turns: dict[TurnKey, list[Part]] = field(default_factory=dict)  # first-seen order
    failed: list[Entry] = field(default_factory=list)  # for apply_entries, in batch order


@dataclass
class HeldCall:
    """A batch read with XREADGROUP > grouped for holding (``decode_batch``):
    ``held`` has each turn's entries of this shard, and the entries left to
    ``apply_entries`` (it dead-letters them; their call is built when needed)."""

    held: HeldBatch
    now_ms: int = 0  # when it was read: the time of its synthesis.started events
    opened: bool = False  # its new turns were opened (open_turns answered)


def decode_batch(
    shard: Shard, entries: list[RawEntry], options: BatchOptions, now_ms: int
) -> HeldCall:
    """A batch read with XREADGROUP > grouped for holding (``--hold-turns``,
    ``group_batch``)."""
    return HeldCall(group_batch(entries, shard.index, options.shards,
                                options.limits.max_entry_bytes), now_ms)


def group_batch(entries: list[RawEntry], shard: int, shards: int,
                max_entry_bytes: int) -> HeldBatch:
    """``entries`` (one XREADGROUP > reply as ``read_raw``
    gives it, in id order) grouped per turn.

    One step per entry: an entry of just ``response_id`` and ``update``
    (in either order) whose response id names a turn seen lately joins its
    turn's current run, checked with the run (``Run.check``); anything
    else is classified by ``_add_one``, as ``group_each`` does. A
    run that fails its check is classified again one entry at a time."""
    batch = HeldBatch()
    turns = batch.turns
    open_runs: dict[TurnKey, Run] = {}  # each turn's run still being added to
    recent = recent_turn
    for entry in entries:
        flat = entry[1]
        if len(flat) == 4:
            first = flat[0]
            if first == b"response_id":
                key = recent(flat[1]) if flat[2] == b"update" else None
                text = flat[3]
            elif first == b"update":
                key = recent(flat[3]) if flat[2] == b"response_id" else None
                text = flat[1]
            else:
                key = None
            if key is not None:
                run = open_runs.get(key)
                if run is None:
                    run = open_runs[key] = _new_run(turns, key)
                run.entries.append(entry)
                run.texts.append(text)
                continue
        _add_one(batch, open_runs, entry, max_entry_bytes)
    _check_runs(batch, shard, shards, max_entry_bytes)
    return batch


def group_each(entries: list[RawEntry], shard: int, shards: int,
               max_entry_bytes: int) -> HeldBatch:
    """The reference for ``group_batch``: every entry classified on
    its own (``peek_plain``, else ``decode_stream_entry``)."""
    batch = HeldBatch()
    open_runs: dict[TurnKey, Run] = {}
    for entry in entries:
        _add_one(batch, open_runs, entry, max_entry_bytes)
    _check_runs(batch, shard, shards, max_entry_bytes)
    return batch


def _add_one(batch: HeldBatch, open_runs: dict[TurnKey, Run], raw: RawEntry,
             max_entry_bytes: int) -> None:
    """One entry classified as ``apply_entries`` would decode it: joined to
    its turn's run (a plain update), or a single that ends the run."""
    entry = entry_of(raw)
    fields = entry[1]
    plain = peek_plain(fields, max_entry_bytes)
    if plain is not None:
        key = plain[0]
        run = open_runs.get(key)
        if run is None:
            run = open_runs[key] = _new_run(batch.turns, key)
        run.entries.append(raw)
        run.texts.append(plain[1])
        return
    try:
        key, record, size = decode_stream_entry(fields, max_entry_bytes=max_entry_bytes)
    except EntryError:
        batch.failed.append(entry)
        return
    open_runs.pop(key, None)  # the turn's next plain update starts a new run
    applied = Applied(key, as_text(entry[0]), record, size)
    batch.turns.setdefault(key, []).append((raw, applied))


def _new_run(turns: dict[TurnKey, list[Part]], key: TurnKey) -> Run:
    """A new run, the turn's last part so far."""
    run = Run()
    parts = turns.get(key)
    if parts is None:
        turns[key] = [run]
    else:
        parts.append(run)
    return run


def _check_runs(batch: HeldBatch, shard: int, shards: int, max_entry_bytes: int) -> None:
    """Check every run (one that fails is classified again entry by entry),
    and leave a turn of another shard to apply_entries whole."""
    regrouped = False
    for key, parts in batch.turns.items():
        if shards > 1 and not _ours(key, parts, shard, shards):
            batch.failed += [e for part in parts for e in part_entries(part)]
            parts.clear()
            regrouped = True
            continue
        base = PLAIN_NAMES + len(key.response_id)
        if all(not isinstance(part, Run) or part.check(base, max_entry_bytes)
               for part in parts):
            continue
        parts[:] = _split(batch, parts, base, max_entry_bytes)
        regrouped = True
    if regrouped:
        # Turns in the order of their first entry still theirs, as entry by
        # entry (a turn whose first run failed may now start later).
        kept = sorted(((key, parts) for key, parts in batch.turns.items() if parts),
                      key=lambda turn: entry_order(_first_entry(turn[1][0])))
        batch.turns.clear()
        batch.turns.update(kept)
        batch.failed.sort(key=entry_order)


def _split(batch: HeldBatch, parts: list[Part], base: int, max_entry_bytes: int) -> list[Part]:
    """A turn's parts with each run that failed its check classified again
    one entry at a time (its plain entries in runs of their own)."""
    out: list[Part] = []
    for part in parts:
        if not isinstance(part, Run) or part.checked:  # a single, or a run that passed
            out.append(part)
            continue
        again = HeldBatch()
        open_runs: dict[TurnKey, Run] = {}
        for entry in part.entries:
            _add_one(again, open_runs, entry, max_entry_bytes)
        batch.failed += again.failed
        for found in again.turns.values():  # (one turn: all of the run's)
            for piece in found:
                if isinstance(piece, Run):
                    piece.check(base, max_entry_bytes)  # peek_plain passed each: it holds
                out.append(piece)
    return out


def _ours(key: TurnKey, parts: list[Part], shard: int, shards: int) -> bool:
    """Whether the turn's entries belong to this shard. A plain update's
    routing id is its response id; a single's is computed from its fields
    (``turn_id`` when it has no response id)."""
    for part in parts:
        if isinstance(part, Run):
            if shard_of(key.response_id, shards) != shard:
                return False
        elif entry_shard(fields_of(part[0]), shards) != shard:
            return False
    return True


def _first_entry(part: Part) -> RawEntry:
    return part.entries[0] if isinstance(part, Run) else part[0]


def part_entries(part: Part) -> list[Entry]:
    """A part's entries, in the usual shape."""
    return entries_of(part.entries if isinstance(part, Run) else [part[0]])


def entry_order(entry: RawEntry | Entry) -> tuple[int, int]:
    """An entry as read, by its stream id's order."""
    return id_order(as_text(entry[0]))

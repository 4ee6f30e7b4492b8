"""Finishing a turn from its stored state: the replay the worker runs before
``finalise_turns``, and the compaction of a turn's stored records into one
snapshot. Pure: the same stored records give the same response as
``processor merge`` of the same entries, compacted or not.

A turn's ``recs`` hash holds one record per applied entry (field = entry id)
and, once compacted, a ``Snapshot`` under the field ``STATE``: the
``TurnLife`` after every record up to its
``cover`` entry id, which those records were replaced by.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from processor.engine import agui
from processor.engine import events as ev
from processor.engine.lifecycle import (
    DUPLICATE,
    LATE,
    Limits,
    TurnLife,
    Verdict,
    finish,
    late_detail,
)
from processor.engine.merge import Turn
from processor.redis_io.replies import as_text
from processor.wire.ids import TurnKey
from processor.wire.models import Counts, Event, Record, Response, Status, Update
from processor.wire.stream_ids import id_order

#: Why a turn is finalised: its closing entry, a cancel key, its timeout, or
#: the namespace's state lost in Redis (a worker publishing what it had).
Reason = Literal["closing", "cancel", "timeout", "lost"]


class Stored(msgspec.Struct, array_like=True):
    """What ``apply_entries`` keeps per entry: its size (for the byte limit) and record."""

    size: int
    record: Record


#: The ``recs`` field of a turn's snapshot (never an entry id, which is ``<ms>-<seq>``).
STATE = "state"


class Snapshot(msgspec.Struct, array_like=True):
    """A turn's ``TurnLife`` after every stored record up to ``cover``.
    Only taken while the turn has no outcome, so it holds no late records.
    (Array-like: a snapshot written before a trailing field was added loads
    with its default, and a reader that predates it ignores it.)"""

    cover: str  # the last entry id folded in
    turn: bytes  # Turn.to_bytes()
    counts: Counts
    size: int  # bytes of the entries folded (for the byte limit)
    first_id: str | None
    last_id: str | None
    # TurnLife.next_n: the number the turn's next numbered entry should carry
    # (docs/contract.md §3.4). Last, so snapshots taken before it load.
    next_n: int | None = None


class Compaction(msgspec.Struct):
    """What ``compact_turn`` needs: replace ``folded`` by ``state``."""

    expected: str  # cover of the snapshot it extends ("" = none)
    cover: str
    folded: list[str]
    state: bytes


_stored_encoder = msgspec.msgpack.Encoder()
_stored_decoder = msgspec.msgpack.Decoder(Stored)
_snapshot_decoder = msgspec.msgpack.Decoder(Snapshot)
_pack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


def encode_stored(size: int, record: Record) -> bytes:
    return _stored_encoder.encode(Stored(size, record))


def text_hash(turn_hash: dict[Any, Any]) -> dict[str, str]:
    """A hash as read from Redis (bytes or str names and values), as text."""
    return {as_text(k): as_text(v) for k, v in turn_hash.items()}


class Settled(msgspec.Struct):
    """What ``finalise_turns`` publishes for one turn."""

    status: Status
    # msgpack [merged entry fields, terminal event entry fields(, AG-UI entries)]
    outputs: bytes
    dead_letters: bytes  # msgpack array of DLQ entry field arrays
    # The entry whose replay ended the turn (end, error, limit), "" when the
    # cancel or the timeout did. finalise_turns publishes only once every
    # earlier entry of the stream is acked, so the replay had all of them.
    ending: str = ""



class Replay:
    """A turn's records fed in entry-id order through ``TurnLife``,
    remembering what a finalise publishes besides the merge: the records
    found after the turn's end (dead letters) and the entry that ended it."""

    __slots__ = ("duplicates", "ending", "late", "life")

    def __init__(self, life: TurnLife) -> None:
        self.life = life
        self.late: list[tuple[str, Record, Verdict]] = []
        self.ending = ""
        # The entries dropped as repeats of a number (docs/contract.md §3.4):
        # merged nowhere, so no live log may carry their updates either.
        self.duplicates: set[str] = set()

    def feed(self, entry_id: str, record: Record, size: int) -> Verdict:
        verdict = self.life.feed(entry_id, record, size)
        if verdict in LATE:
            self.late.append((entry_id, record, verdict))
        elif verdict is DUPLICATE:
            self.duplicates.add(entry_id)
        if not self.ending and self.life.outcome is not None:
            self.ending = entry_id
        return verdict

    def feed_updates(self, updates: list[Update], first_id: str, last_id: str,
                     size: int, prefix: Callable[[int], tuple[int, str]]) -> int:
        """``TurnLife.feed_updates``: those fed are merged, so none is
        late and none ends the turn."""
        return self.life.feed_updates(updates, first_id, last_id, size, prefix)


def replay(key: TurnKey, recs: dict[Any, Any], limits: Limits) -> Replay:
    """Replay a turn's stored records (``recs`` as read from Redis) in entry-id order."""
    records = {as_text(k): v for k, v in recs.items()}
    life, _cover = resume(key, limits, records)
    done = Replay(life)
    for entry_id in sorted(records, key=id_order):
        stored = _stored_decoder.decode(records[entry_id])
        done.feed(entry_id, stored.record, stored.size)
    return done


def replay_render(
    key: TurnKey,
    turn_hash: dict[Any, Any],
    recs: dict[Any, Any],
    reason: Reason,
    limits: Limits,
    now_ms: int,
    with_agui: bool = False,
    cancel_reason: str | None = None,
) -> Settled | None:
    """Replay a turn's stored records in entry-id order and render its outputs
    (``render``)."""
    return render(key, replay(key, recs, limits), turn_hash, reason, now_ms, with_agui,
                  cancel_reason=cancel_reason)


def render(
    key: TurnKey,
    done: Replay,
    turn_hash: dict[Any, Any],
    reason: Reason,
    now_ms: int,
    with_agui: bool = False,
    response: Response | None = None,
    cancel_reason: str | None = None,
) -> Settled | None:
    """End a replayed turn as ``reason`` says and render what ``finalise_turns``
    publishes. Consumes ``done`` (cancels or expires its life). ``response``:
    its merged response if the caller has it already (nothing fed since),
    so that it is not rendered again. ``cancel_reason``: for a ``cancel``, the
    reason read from its key (``processor.wire.cancels.reason_of``).

    Returns None when a ``closing`` turn turns out not to be finished (its
    closing record is not in the state any more), which only a concurrent
    finalisation can cause; the caller then leaves it alone.
    """
    life = done.life
    if reason == "cancel":
        life.cancel(cancel_reason)
    elif reason == "timeout":
        life.expire()
    elif reason == "lost":
        life.state_lost()
    if life.outcome is None:
        return None
    lost = turn_hash.get(b"lost", turn_hash.get("lost"))
    if lost is not None:  # (dead_letter_lost.lua: an entry it may have had is gone)
        life.entries_lost(as_text(lost))
    counters = {as_text(k): int(v) for k, v in turn_hash.items() if as_text(v).isdigit()}
    life.counts.dropped += counters.get("dropped", 0)
    life.counts.dlq += counters.get("dlq", 0)
    started_ms = counters.get("started", now_ms)
    response, meta, final = finish(life, started_ms, now_ms, 0, response)[1:]
    merged = ev.merged_entry(key, life.outcome, response, meta)
    outputs: list[Any] = [struct_fields(merged), event_fields(key, final)]
    if with_agui:  # published with the terminal event, so exactly once too
        run = agui.project(response, meta, life.outcome.status)
        outputs.append(agui.entry_fields(key, run))
    dead = [_late_fields(key, entry_id, record, late_detail(verdict, life.outcome), verdict)
            for entry_id, record, verdict in done.late]
    return Settled(life.outcome.status, _pack.encode(outputs), _pack.encode(dead), done.ending)


def resume(key: TurnKey, limits: Limits, records: dict[str, Any]) -> tuple[TurnLife, str]:
    """The turn's life from its snapshot, if ``records`` (entry id -> stored
    record, plus ``STATE``) has one, which is popped; and its cover ("" if none).
    Every record left is after the cover: compaction deleted the others."""
    life = TurnLife(key, limits)
    blob = records.pop(STATE, None)
    if blob is None:
        return life, ""
    snap = _snapshot_decoder.decode(blob)
    life.turn = Turn.from_bytes(snap.turn)
    life.counts = snap.counts
    life.bytes = snap.size
    life.first_id, life.last_id = snap.first_id, snap.last_id
    life.next_n = snap.next_n
    return life, snap.cover


def plan_compaction(
    key: TurnKey, recs: dict[Any, Any], watermark: str | None, limits: Limits, minimum: int = 1
) -> Compaction | None:
    """Fold the turn's stored records below ``watermark`` (the shard's oldest
    pending entry, None when nothing was pending) into a new snapshot.

    Folding stops before the first record that would end the turn (end,
    error, a limit): a snapshot never has an outcome, so what follows it is
    replayed exactly as before. None when fewer than ``minimum`` records fold.
    ``compact_turn`` checks that the records it replaces are still exactly
    these and all below the watermark, so a stale plan changes nothing.
    """
    records = {as_text(k): v for k, v in recs.items()}
    life, previous = resume(key, limits, records)
    bound = id_order(watermark) if watermark else None
    folded: list[str] = []
    for entry_id in sorted(records, key=id_order):
        if bound is not None and id_order(entry_id) >= bound:
            break
        stored = _stored_decoder.decode(records[entry_id])
        if stored.record.kind != "update" or life.ends_turn(stored.record, stored.size):
            break
        life.feed(entry_id, stored.record, stored.size)
        folded.append(entry_id)
    if not folded or len(folded) < minimum:
        return None
    cover = folded[-1]
    return Compaction(previous, cover, folded, snapshot(life, cover))


def resumed(key: TurnKey, limits: Limits, snap: bytes) -> Replay:
    """A turn's replay from its stored snapshot alone (what ``resume``
    makes of a recs hash holding only ``state``)."""
    life, _cover = resume(key, limits, {STATE: snap})
    return Replay(life)


def snapshot(life: TurnLife, cover: str) -> bytes:
    """The stored snapshot of a turn without an outcome after every entry
    up to ``cover`` (what ``resume`` reads back): a compaction's, or a
    held turn's checkpoint (``checkpoint_held``)."""
    return _pack.encode(Snapshot(cover, life.turn.to_bytes(), life.counts, life.bytes,
                                 life.first_id, life.last_id, life.next_n))


def struct_fields(struct: msgspec.Struct) -> list[str]:
    """A flat field/value list of a Struct's set fields, for XADD."""
    out: list[str] = []
    for name, value in msgspec.structs.asdict(struct).items():
        if value is not None:
            out += [name, value]
    return out


def event_fields(key: TurnKey, event: Event) -> list[str]:
    """The fields of an ``events`` stream entry; the event JSON comes last."""
    fields = ["type", event_type(event), "response_id", key.response_id, "synthesis_id",
              key.synthesis_id()]
    if key.attempt_id:
        fields += ["attempt_id", key.attempt_id]
    return [*fields, "event", ev.encode_event(event).decode()]


def event_type(event: Event) -> str:
    """The ``type`` tag of an event Struct."""
    return str(type(event).__struct_config__.tag)


def _late_fields(key: TurnKey, entry_id: str, record: Record, detail: str,
                 verdict: Verdict) -> list[str]:
    """A DLQ entry for a record found after its turn ended (rebuilt from the record)."""
    fields = ["response_id", key.response_id, "kind", record.kind]
    if key.attempt_id:
        fields += ["attempt_id", key.attempt_id]
    for name, value in record.ids.items():
        if name != "attempt_id":
            fields += [name, value]
    if record.update is not None:
        fields += ["update", _json.encode(record.update).decode()]
    return [*fields, "reason", verdict.value, "detail", detail,
            "source_id", entry_id, "deliveries", "1"]


def take_late(done: Replay) -> list[tuple[str, str, str]]:
    """The entries found after the turn's end, as (id, reason, detail),
    taken out of ``done`` (so ``render`` publishes none of them): for a
    caller whose script dead-letters them from the stream's copy, with their
    original fields (``finalise_held``: held entries are still in the stream)."""
    outcome = done.life.outcome
    late = [(entry_id, verdict.value, late_detail(verdict, outcome))
            for entry_id, _record, verdict in done.late]
    done.late = []
    return late

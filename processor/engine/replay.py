"""Finishing a turn from its state: the replay of its stored records in
entry-id order (or a held turn's own, fed as it went), and the rendering of
what its finalise publishes. Pure: the same stored records give the same
response as ``processor merge`` of the same entries, compacted or not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from processor.engine import agui
from processor.engine import events as ev
from processor.engine.events import event_fields, struct_fields
from processor.engine.lifecycle import (
    DUPLICATE,
    LATE,
    Limits,
    TurnLife,
    Verdict,
    finish,
    late_detail,
)
from processor.engine.records import STATE, decode_stored, resume
from processor.redis_io.replies import as_text
from processor.wire.ids import TurnKey
from processor.wire.models import Record, Update
from processor.wire.outputs import Response, Status
from processor.wire.stream_ids import id_order

#: Why a turn is finalised: its closing entry, a cancel key, its timeout, or
#: the namespace's state lost in Redis (a worker publishing what it had).
Reason = Literal["closing", "cancel", "timeout", "lost"]


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


_pack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


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
        stored = decode_stored(records[entry_id])
        done.feed(entry_id, stored.record, stored.size)
    return done


def resumed(key: TurnKey, limits: Limits, snap: bytes) -> Replay:
    """A turn's replay from its stored snapshot alone (what ``resume``
    makes of a recs hash holding only ``state``)."""
    life, _cover = resume(key, limits, {STATE: snap})
    return Replay(life)


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

"""Finishing a turn from its stored state: the replay the worker runs before
``finalise_turns``. Pure: the same stored records give the same response as
``processor merge`` of the same entries.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from processor import agui
from processor import events as ev
from processor.connections import as_text
from processor.ids import TurnKey
from processor.lifecycle import Limits, TurnLife, Verdict
from processor.models import Record, Status

Reason = Literal["closing", "cancel", "timeout"]


class Stored(msgspec.Struct, array_like=True):
    """What ``apply_entries`` keeps per entry: its size (for the byte limit) and record."""

    size: int
    record: Record


_stored_encoder = msgspec.msgpack.Encoder()
_stored_decoder = msgspec.msgpack.Decoder(Stored)
_pack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


def encode_stored(size: int, record: Record) -> bytes:
    return _stored_encoder.encode(Stored(size, record))


def id_order(entry_id: str) -> tuple[int, int]:
    """Stream ids sort by (ms, seq) as numbers."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


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



def settle(
    key: TurnKey,
    turn_hash: dict[Any, Any],
    recs: dict[Any, Any],
    reason: Reason,
    limits: Limits,
    now_ms: int,
    with_agui: bool = False,
) -> Settled | None:
    """Replay a turn's stored records in entry-id order and render its outputs.

    Returns None when a ``closing`` turn turns out not to be finished (its
    closing record is not in the state any more), which only a concurrent
    finalisation can cause; the caller then leaves it alone.
    """
    life = TurnLife(key, limits)
    late: list[tuple[str, Record, Verdict]] = []
    records = {as_text(k): v for k, v in recs.items()}
    ending = ""
    for entry_id in sorted(records, key=id_order):
        stored = _stored_decoder.decode(records[entry_id])
        verdict = life.feed(entry_id, stored.record, stored.size)
        if verdict in (Verdict.TURN_CLOSED, Verdict.TURN_LIMIT):
            late.append((entry_id, stored.record, verdict))
        if not ending and life.outcome is not None:
            ending = entry_id
    if reason == "cancel":
        life.cancel()
    elif reason == "timeout":
        life.expire()
    if life.outcome is None:
        return None
    counters = {as_text(k): int(v) for k, v in turn_hash.items() if as_text(v).isdigit()}
    life.counts.dropped += counters.get("dropped", 0)
    life.counts.dlq += counters.get("dlq", 0)
    started_ms = counters.get("started", now_ms)
    response = life.response()
    meta = life.meta(response, started_ms, now_ms)
    merged = ev.merged_entry(key, life.outcome, response, meta)
    final = ev.terminal(key, life.turn.state.ids, life.outcome, response, meta.counts, 0, now_ms)
    outputs: list[Any] = [struct_fields(merged), event_fields(key, final)]
    if with_agui:  # published with the terminal event, so exactly once too
        run = agui.project(response, meta, life.outcome.status)
        outputs.append(agui.entry_fields(key, run))
    dead = [_late_fields(key, entry_id, record, verdict) for entry_id, record, verdict in late]
    return Settled(life.outcome.status, _pack.encode(outputs), _pack.encode(dead), ending)


def struct_fields(struct: msgspec.Struct) -> list[str]:
    """A flat field/value list of a Struct's set fields, for XADD."""
    out: list[str] = []
    for name, value in msgspec.structs.asdict(struct).items():
        if value is not None:
            out += [name, value]
    return out


def event_fields(key: TurnKey, event: ev.Event) -> list[str]:
    """The fields of an ``events`` stream entry; the event JSON comes last."""
    fields = ["type", event_type(event), "response_id", key.response_id, "synthesis_id",
              key.synthesis_id()]
    if key.attempt_id:
        fields += ["attempt_id", key.attempt_id]
    return [*fields, "event", ev.encode_event(event).decode()]


def event_type(event: ev.Event) -> str:
    """The ``type`` tag of an event Struct."""
    return str(type(event).__struct_config__.tag)


def _late_fields(key: TurnKey, entry_id: str, record: Record, verdict: Verdict) -> list[str]:
    """A DLQ entry for a record found after its turn ended (rebuilt from the record)."""
    fields = ["response_id", key.response_id, "kind", record.kind]
    if key.attempt_id:
        fields += ["attempt_id", key.attempt_id]
    for name, value in record.ids.items():
        if name != "attempt_id":
            fields += [name, value]
    if record.update is not None:
        fields += ["update", _json.encode(record.update).decode()]
    detail = ("the turn reached its limits and ended" if verdict is Verdict.TURN_LIMIT
              else "the entry came after the turn's end")
    return [*fields, "reason", verdict.value, "detail", detail, "source_id", entry_id,
            "deliveries", "1"]

"""The stored path's scripts: ``apply_entries.lua`` (store a batch's
entries as records), ``finalise_turns.lua`` (publish finished turns),
``compact_turn.lua`` (fold a long turn's records): their KEYS/ARGV from a
batch, and ``apply_entries``' reply as named values."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from processor.engine import events as ev
from processor.engine.compaction import Compaction
from processor.engine.records import encode_stored
from processor.engine.replay import Settled
from processor.ingest.decode import EntryError, decode_stream_entry
from processor.ingest.entry_fields import entry_shard
from processor.redis_io.replies import as_text
from processor.scripts.calls import BatchOptions, ScriptCall, id_list, msgpack_str
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.wire.models import Record
from processor.wire.outputs import Event

if TYPE_CHECKING:
    from processor.redis_io.client import Script

_pack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


class Applied(NamedTuple):
    """One entry of a batch that ``apply_entries`` was asked to store."""

    key: TurnKey
    entry_id: str
    record: Record
    size: int


@dataclass(frozen=True)
class Version:
    """A turn's version as one ``apply_entries`` call left it."""

    before: int
    after: int
    stored: int
    started: str


class ApplyReply(NamedTuple):
    """What ``apply_entries`` answers (its header's ``Returns``)."""

    cancelled: list[Any]  # tks of turns it found cancelled, to finalise
    ready: list[Any]  # closing members (``parse_member``) of turns made ready
    counts: list[Any]  # its counters (stored, dead-lettered, ...; metrics)
    full: list[Any]  # tks of turns past the compaction threshold
    versions: list[Any]  # flat versions (``parse_versions``)


async def apply_entries(script: Script, keys: list[str], args: list[Any]) -> ApplyReply:
    """Run ``apply_entries`` (``ApplyCall.keys`` and ``ApplyCall.argv``)."""
    return ApplyReply(*await script(keys=keys, args=args))


@dataclass
class ApplyCall:
    """``apply_entries``' KEYS/ARGV. The entries' values travel as one msgpack
    array (the last ARGV): one bulk string instead of eight per entry, which
    is what the client spent most of a batch's time packing."""

    keys: list[str]
    head: list[Any]
    entries: list[Any]  # flat, 7 values per entry (see apply_entries.lua), bytes as msgpack_str
    applied: list[Applied] = field(default_factory=list)  # the entries asked to be stored
    # Read by one XREADGROUP ">": in id order, and newer than every entry
    # delivered before (processor.worker.stored.mirror need not check their order).
    newest: bool = False
    now_ms: int = 0  # when it was built: the time of its synthesis.started events
    # The first entry id of the XREADGROUP > read these entries came from ("":
    # not such a read): a cancel this call finds first cuts the turn there.
    read_from: str = ""

    def dead_letters(self) -> list[tuple[str, str, str]]:
        """``(entry id, reason, tk or "")`` of each entry this call asks
        ``apply_entries`` to dead-letter (decided here: decoding, routing,
        deliveries); never a payload."""
        found = []
        flat = self.entries
        for i in range(0, len(flat) - 6, 7):
            if flat[i + 2] == "d":
                ti = flat[i + 1]
                tk = as_text(self.head[_HEAD + 2 * (ti - 1)]) if ti else ""
                found.append((as_text(flat[i]), as_text(flat[i + 3]), tk))
        return found

    def dead_by_turn(self) -> dict[TurnKey, int]:
        """How many entries of each turn this call asks ``apply_entries`` to
        dead-letter (each moves a started turn's version, as a record does:
        ``processor.worker.stored.mirror`` keeps its mirror across them)."""
        counts: dict[TurnKey, int] = {}
        for _, _, tk in self.dead_letters():
            if tk:
                key = TurnKey.decode(tk)
                counts[key] = counts.get(key, 0) + 1
        return counts

    def argv(self, consumer: str = "", floor: str = "") -> list[Any]:
        """The ARGV, with the calling consumer and its floor (``floor`` of
        includes/watermark.lua, given only with --hold-turns) in their place."""
        head = self.head
        return [*head[:_HEAD], consumer, floor, self.read_from, *head[_HEAD:],
                _pack.encode(self.entries)]


#: ``apply_entries``' ARGV, in order (its header documents each): the head
#: built with the batch, the three values given when it is sent (``ApplyCall.argv``),
#: then two per turn from ``APPLY_TURNS`` on, and last the entries.
APPLY_HEAD = ("group", "events_maxlen", "dlq_maxlen", "turns", "max_turn_updates",
              "max_turn_bytes", "dlq_fields_max", "ready_limit", "compact_threshold",
              "done_ttl")


APPLY_SENT = ("consumer", "floor", "read_from")


_HEAD = len(APPLY_HEAD)  # ARGV values before the consumer and its floor


#: The ARGV index (1-based, as Lua counts) of the first turn's tk: ``TURNS`` there.
APPLY_TURNS = _HEAD + len(APPLY_SENT) + 1


class _Turns:
    """The distinct turns of a batch, numbered from 1 in first-seen order."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self.index: dict[TurnKey, int] = {}
        self.keys: list[str] = []
        self.args: list[Any] = []

    def number(self, key: TurnKey, ts: int) -> int:
        n = self.index.get(key)
        if n is None:
            n = self.index[key] = len(self.index) + 1
            self.keys += self.shard.turn_keys(key)
            # Turn-level ids are left null: apply_entries fills in the ones
            # the turn has (first applied wins), on this and every event.
            started = ev.started(key, {}, ts)
            self.args += [key.encode(), _pack.encode(_started_fields(key, started))]
        return n


def _started_fields(key: TurnKey, started: Event) -> list[str | msgspec.Raw]:
    """``event_fields`` of a turn's ``synthesis.started``, its JSON packed as
    the msgpack str it is encoded to (never decoded)."""
    fields: list[str | msgspec.Raw] = ["type", "synthesis.started", "response_id",
                                       key.response_id, "synthesis_id", key.synthesis_id()]
    if key.attempt_id:
        fields += ["attempt_id", key.attempt_id]
    return [*fields, "event", msgpack_str(_json.encode(started))]


def build_apply(
    shard: Shard,
    entries: list[tuple[Any, dict[Any, Any]]],
    deliveries: dict[str, int],
    options: BatchOptions,
    now_ms: int,
) -> ApplyCall:
    """KEYS/ARGV of ``apply_entries`` for entries read from ``shard``."""
    turns = _Turns(shard)
    per_entry: list[Any] = []
    applied: list[Applied] = []
    for raw_id, fields in entries:
        entry_id = as_text(raw_id)
        count = deliveries.get(entry_id, 1)
        per_entry += _entry_args(shard, turns, entry_id, fields, count, options, now_ms, applied)
    keys = [shard.updates, shard.events, shard.dlq, shard.active, shard.closing, *turns.keys]
    head = _apply_head(options, len(turns.index))
    return ApplyCall(keys, [*head, *turns.args], per_entry, applied, now_ms=now_ms)


def _apply_head(options: BatchOptions, turns: int) -> list[Any]:
    """``apply_entries``' ARGV head (``APPLY_HEAD``) for a call of ``turns`` turns."""
    lim = options.limits
    values = {"group": options.group, "events_maxlen": options.events_maxlen,
              "dlq_maxlen": options.dlq_maxlen, "turns": turns,
              "max_turn_updates": lim.max_turn_updates, "max_turn_bytes": lim.max_turn_bytes,
              "dlq_fields_max": options.dlq_fields_max, "ready_limit": options.ready_limit,
              "compact_threshold": options.compact_threshold, "done_ttl": options.done_ttl}
    return [values[name] for name in APPLY_HEAD]


def build_dead_letters(
    shard: Shard, rows: list[tuple[str, str, str, int]], options: BatchOptions,
) -> ApplyCall:
    """KEYS/ARGV of ``apply_entries`` dead-lettering entries by id, unread:
    ``(entry id, reason, detail, deliveries)`` each. The script acks each
    (one another consumer acked is skipped) and copies it, whole, inside
    Redis (includes/dead_letter.lua): the worker never loads its payload."""
    per_entry: list[Any] = []
    for entry_id, reason, detail, deliveries in rows:
        per_entry += [entry_id, 0, "d", reason, detail, deliveries, ""]
    keys = [shard.updates, shard.events, shard.dlq, shard.active, shard.closing]
    return ApplyCall(keys, _apply_head(options, 0), per_entry)


_new_tuple = tuple.__new__  # Applied(...) without NamedTuple's Python-level __new__


def _entry_args(
    shard: Shard,
    turns: _Turns,
    entry_id: str,
    fields: dict[Any, Any],
    deliveries: int,
    options: BatchOptions,
    now_ms: int,
    applied: list[Applied],
) -> list[Any]:
    if deliveries > options.max_deliveries:
        limit = options.max_deliveries
        detail = f"delivered {deliveries} times without being acked (limit {limit})"
        return [entry_id, 0, "d", "max_deliveries", detail, deliveries, ""]
    try:
        key, record, size = decode_stream_entry(
            fields, max_entry_bytes=options.limits.max_entry_bytes
        )
    except EntryError as exc:
        n = turns.number(exc.turn, now_ms) if exc.turn else 0
        return [entry_id, n, "d", exc.reason, exc.detail, deliveries, ""]
    expected = entry_shard(fields, options.shards) if options.shards > 1 else 0
    if expected != shard.index:
        detail = f"the turn belongs to shard {expected}, not {shard.index}"
        return [entry_id, 0, "d", "wrong_shard", detail, deliveries, ""]
    n = turns.number(key, now_ms)
    op = "u" if record.kind == "update" else "e"
    ids = _turn_ids(record.ids) if record.ids else b""  # most entries carry none
    applied.append(_new_tuple(Applied, (key, entry_id, record, size)))
    return [entry_id, n, op, msgpack_str(encode_stored(size, record)), size, deliveries,
            msgpack_str(ids) if ids else ""]


def _turn_ids(ids: dict[str, str]) -> bytes:
    """An entry's turn-level correlation ids for ``apply_entries`` to remember
    (msgpack [name, JSON value, ...]); attempt_id is part of the turn key."""
    flat = id_list(ids)
    return _pack.encode(flat) if flat else b""


def parse_versions(flat: list[Any]) -> dict[TurnKey, Version]:
    """``apply_entries``' fifth reply: flat ``[tk, before, after, stored, started, ...]``."""
    return {
        TurnKey.decode(as_text(flat[i])): Version(int(flat[i + 1]), int(flat[i + 2]),
                                                  int(flat[i + 3]), as_text(flat[i + 4]))
        for i in range(0, len(flat) - 4, 5)
    }


def parse_member(member: Any) -> TurnKey:
    """A ``closing`` zset member ``<padded id>|<tk>`` -> its turn key."""
    return TurnKey.decode(as_text(member).partition("|")[2])


def build_finalise(
    shard: Shard, settled: list[tuple[TurnKey, str, Settled]], options: BatchOptions,
    consumer: str = "", floor: str = "", ahead: str = "",
) -> ScriptCall:
    """KEYS/ARGV of ``finalise_turns``: (turn, version read, outputs) per turn;
    the calling consumer and its floor as in ``ApplyCall.argv``; ``ahead``:
    the first entry id of the read it has read ahead of its applier, if any
    (a cancel's cut leaves that read out)."""
    call = ScriptCall(
        [shard.merged, shard.events, shard.dlq, shard.active, shard.closing, shard.updates],
        [options.merged_maxlen, options.events_maxlen, options.dlq_maxlen, options.done_ttl,
         len(settled), options.group, consumer, floor, ahead],
    )
    for key, version, outcome in settled:
        tk = key.encode()
        call.keys += [shard.turn(tk), shard.recs(tk), shard.done(tk), shard.live(tk)]
        call.args += [tk, version, outcome.status, outcome.outputs, outcome.dead_letters,
                      outcome.ending]
    if options.agui:  # last, so the per-turn key layout stays as it is
        call.keys.append(shard.agui)
    return call


def build_compact(
    shard: Shard, key: TurnKey, plan: Compaction, options: BatchOptions
) -> ScriptCall:
    """KEYS/ARGV of ``compact_turn`` for one turn's planned compaction."""
    tk = key.encode()
    return ScriptCall(
        [shard.updates, shard.turn(tk), shard.recs(tk), shard.done(tk)],
        [options.group, plan.expected, plan.cover, plan.state, *plan.folded],
    )


class Finalised(IntEnum):
    """What ``finalise_turns`` did with a turn (and ``compact_turn``, with
    ``PUBLISHED`` for compacted)."""

    PUBLISHED = 1
    GONE = 0  # already done, or gone
    CHANGED = -1  # its version moved since it was read: read it again
    NOT_YET = 2  # an entry before its end (or a cancel's cut) is pending, or it is held


async def finalise_turns(script: Script, call: ScriptCall) -> list[Finalised]:
    """Run ``finalise_turns``: one outcome per turn, in the call's order."""
    return [Finalised(int(r)) for r in await script(keys=call.keys, args=call.args)]


async def compact_turn(script: Script, call: ScriptCall) -> Finalised:
    """Run ``compact_turn`` (``PUBLISHED``: compacted)."""
    return Finalised(int(await script(keys=call.keys, args=call.args)))

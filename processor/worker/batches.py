"""Script arguments for a batch: domain objects in, KEYS/ARGV out.

Pure functions between the worker (which does the I/O) and the Lua
transitions (which do the atomic state changes). Nothing here talks to Redis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, get_args

import msgspec

from processor.engine import events as ev
from processor.engine.lifecycle import Limits
from processor.engine.render import (
    Compaction,
    Settled,
    encode_stored,
    event_fields,
    event_type,
)
from processor.ingest.decode import EntryError, decode_stream_entry
from processor.ingest.entry_fields import entry_shard
from processor.redis_io.replies import as_text
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.wire.models import TURN_IDS, Event
from processor.wire.stream_ids import id_order
from processor.worker.stored.mirror import Applied, Version

_pack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


class BatchOptions(Protocol):
    """What the script-call builders read of a worker's settings: a view of
    its ``WorkerConfig`` (processor.worker.config), where each has its one
    default."""

    @property
    def group(self) -> str: ...
    @property
    def shards(self) -> int: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def max_deliveries(self) -> int: ...
    @property
    def events_maxlen(self) -> int: ...
    @property
    def dlq_maxlen(self) -> int: ...
    @property
    def merged_maxlen(self) -> int: ...
    @property
    def dlq_fields_max(self) -> int: ...
    @property
    def ready_limit(self) -> int: ...
    @property
    def done_ttl(self) -> int: ...
    @property
    def agui(self) -> bool: ...
    @property
    def compact_threshold(self) -> int: ...
    @property
    def live_ttl(self) -> int: ...


@dataclass
class ScriptCall:
    keys: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)


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
        ``processor.worker.stored.mirror`` keeps its copy across them)."""
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


#: The msgpack str headers of lengths below 256 (fixstr, then str 8), made once.
_STR_HEADS = [bytes((0xA0 | n,)) if n < 32 else b"\xd9" + bytes((n,)) for n in range(256)]


def msgpack_str(value: bytes) -> msgspec.Raw:
    """Bytes as a msgpack *str*: Redis's Lua cmsgpack cannot decode the bin
    types msgspec writes for bytes, and a str is kept byte for byte."""
    n = len(value)
    if n < 0x100:
        head = _STR_HEADS[n]  # most records: no header to build
    elif n < 0x10000:
        head = b"\xda" + n.to_bytes(2, "big")
    else:
        head = b"\xdb" + n.to_bytes(4, "big")
    return msgspec.Raw(head + value)


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
    """``event_fields`` of a turn's
    ``synthesis.started``, its JSON packed as the msgpack str it is encoded
    to (never decoded: ``live_fields``)."""
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
    lim = options.limits
    keys = [shard.updates, shard.events, shard.dlq, shard.active, shard.closing, *turns.keys]
    values = {"group": options.group, "events_maxlen": options.events_maxlen,
              "dlq_maxlen": options.dlq_maxlen, "turns": len(turns.index),
              "max_turn_updates": lim.max_turn_updates, "max_turn_bytes": lim.max_turn_bytes,
              "dlq_fields_max": options.dlq_fields_max, "ready_limit": options.ready_limit,
              "compact_threshold": options.compact_threshold, "done_ttl": options.done_ttl}
    head = [values[name] for name in APPLY_HEAD]
    return ApplyCall(keys, [*head, *turns.args], per_entry, applied, now_ms=now_ms)


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
    lim = options.limits
    keys = [shard.updates, shard.events, shard.dlq, shard.active, shard.closing]
    head = [options.group, options.events_maxlen, options.dlq_maxlen, 0,
            lim.max_turn_updates, lim.max_turn_bytes, options.dlq_fields_max,
            options.ready_limit, options.compact_threshold, options.done_ttl]
    return ApplyCall(keys, head, per_entry)


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
    flat = _id_list(ids)
    return _pack.encode(flat) if flat else b""


def _id_list(ids: dict[str, str]) -> list[str]:
    """Turn-level correlation ids as the scripts remember them: [name, JSON value, ...]."""
    flat: list[str] = []
    for name in TURN_IDS:
        value = ids.get(name)
        if value is not None and name != "attempt_id":
            flat += [name, _json.encode(value).decode()]
    return flat


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
    consumer: str = "", floor: str = "",
) -> ScriptCall:
    """KEYS/ARGV of ``finalise_turns``: (turn, version read, outputs) per turn;
    the calling consumer and its floor as in ``ApplyCall.argv``."""
    call = ScriptCall(
        [shard.merged, shard.events, shard.dlq, shard.active, shard.closing, shard.updates],
        [options.merged_maxlen, options.events_maxlen, options.dlq_maxlen, options.done_ttl,
         len(settled), options.group, consumer, floor],
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


def build_open(
    shard: Shard, turns: dict[TurnKey, dict[str, str]], options: BatchOptions, now_ms: int,
    consumer: str,
) -> ScriptCall:
    """KEYS/ARGV of ``open_turns`` for the turns a held batch starts (with
    their first entry's correlation ids), held by ``consumer``."""
    keys = [shard.events, shard.active]
    rows = []
    for key, ids in turns.items():
        tk = key.encode()
        keys += [shard.turn(tk), shard.done(tk), shard.cancel(key.response_id)]
        rows.append((tk, event_fields(key, ev.started(key, ids, now_ms))))
    return ScriptCall(keys, [options.events_maxlen, len(turns), _pack.encode(rows), consumer])


def parse_opened(turns: list[TurnKey], flat: list[Any]) -> dict[TurnKey, bool]:
    """``open_turns``' first reply for ``turns`` (as sent, in order): flat
    ``[tk, "held" | "old", ...]``, one pair per turn."""
    return {key: as_text(status) == "held"
            for key, status in zip(turns, flat[1::2], strict=True)}


#: A held turn to publish: its key, its held entry ids, the entries found
#: after its end as (id, reason, detail) (``render.take_late``), its outputs,
#: and for a cancel the newest entry id the worker has routed ("" unknown).
class HeldOutcome(NamedTuple):
    """A held turn in a ``finalise_held`` call."""

    key: TurnKey
    ids: list[str]  # the entries held of it (since its last checkpoint)
    late: list[tuple[str, str, str]]  # entries after its end: (id, reason, detail)
    outcome: Settled
    routed: str  # for a cancel, the newest entry id routed ('' = not a cancel)
    found: list[Event]  # its last live events
    spoken: int  # publish_live calls for it that ran
    version: int  # its version: 0, or its last checkpoint's


class HeldCheckpoint(NamedTuple):
    """A held turn in a ``checkpoint_held`` call."""

    key: TurnKey
    version: int  # its version now (0, or its last checkpoint's)
    after: int  # its version once checkpointed
    updates: int  # `n`, as apply_entries would have counted its updates
    size: int  # `bytes`: its entries' bytes, as apply_entries would have counted them
    snapshot: bytes  # render.Snapshot, msgpack
    cover: str  # the newest entry in the snapshot
    ids: list[str]  # the entries held of it, acked by the call
    names: dict[str, str]  # its correlation ids


def build_checkpoint_held(shard: Shard, turns: list[HeldCheckpoint], options: BatchOptions,
                          consumer: str) -> ScriptCall:
    """KEYS/ARGV of ``checkpoint_held``."""
    keys = [shard.updates, shard.active]
    rows = []
    for turn in turns:
        tk = turn.key.encode()
        keys += [shard.turn(tk), shard.recs(tk), shard.done(tk), shard.cancel(turn.key.response_id)]
        rows.append((tk, str(turn.version), turn.after, turn.updates, turn.size,
                     msgpack_str(turn.snapshot), turn.cover, turn.ids, _id_list(turn.names)))
    return ScriptCall(keys, [options.group, consumer, len(turns), _pack.encode(rows)])


def build_finalise_held(
    shard: Shard, settled: list[HeldOutcome], options: BatchOptions, consumer: str,
    speaker: str = "",
) -> ScriptCall:
    """KEYS/ARGV of ``finalise_held``, one ``HeldOutcome`` per turn (its
    last live events said by ``speaker``, the worker's ``publish_live`` token)."""
    keys = [shard.merged, shard.events, shard.dlq, shard.active, shard.updates]
    rows = []
    for key, ids, late, outcome, routed, found, spoken, version in settled:
        tk = key.encode()
        keys += [shard.turn(tk), shard.done(tk), shard.live(tk), shard.cancel(key.response_id),
                 shard.recs(tk)]
        rows.append((tk, str(version), outcome.status, msgpack_str(outcome.outputs),
                     msgpack_str(outcome.dead_letters), ids, outcome.ending, late, routed,
                     live_fields(key, found), spoken))
    if options.agui:
        keys.append(shard.agui)
    return ScriptCall(keys, [options.merged_maxlen, options.events_maxlen, options.dlq_maxlen,
                             options.done_ttl, len(settled), options.group, consumer,
                             options.dlq_fields_max, _pack.encode(rows), speaker])


#: A turn published from memory after the namespace's state was lost: its
#: key, the ids of its entries this worker held, its outputs (``reason="lost"``).
LostOutcome = tuple[TurnKey, list[str], Settled]


def build_publish_lost(
    shard: Shard, turns: list[LostOutcome], options: BatchOptions,
) -> ScriptCall:
    """KEYS/ARGV of ``publish_lost_turns``, one ``LostOutcome`` per turn."""
    keys = [shard.merged, shard.events, shard.dlq, shard.active, shard.closing, shard.updates]
    rows = []
    for key, ids, outcome in turns:
        tk = key.encode()
        keys += [shard.turn(tk), shard.recs(tk), shard.done(tk), shard.live(tk)]
        rows.append((tk, outcome.status, msgpack_str(outcome.outputs),
                     msgpack_str(outcome.dead_letters), ids))
    if options.agui:
        keys.append(shard.agui)
    return ScriptCall(keys, [options.merged_maxlen, options.events_maxlen, options.dlq_maxlen,
                             options.done_ttl, len(turns), options.group, _pack.encode(rows)])


#: The DLQ reason, and its ``detail``, of an entry deleted while pending.
ENTRY_LOST = "entry_lost"
ENTRY_LOST_DETAIL = ("the entry was deleted from the stream while it was pending (a trim or "
                     "an XDEL): its data is gone")


def build_dead_letter_lost(
    shard: Shard, pending: list[str], removed: list[str], turns: list[TurnKey], first: str,
    options: BatchOptions,
) -> ScriptCall:
    """KEYS/ARGV of ``dead_letter_lost``: ids still pending to this consumer
    (acked there), ids already out of the pending list, the turns to mark
    with ``first``, the oldest lost id."""
    keys = [shard.updates, shard.dlq]
    for key in turns:
        tk = key.encode()
        keys += [shard.turn(tk), shard.done(tk)]
    return ScriptCall(keys, [options.group, options.dlq_maxlen, ENTRY_LOST, ENTRY_LOST_DETAIL,
                             len(pending), len(turns), first, *pending, *removed])


def lost_turns_of(
    lost: list[str], active: dict[TurnKey, tuple[int, str]],
) -> list[TurnKey]:
    """The turns that may have had one of the ``lost`` entries: those open
    when it was written. ``active``: each active turn of the shard with the
    time it started (ms; Redis's clock when its first entry was applied or
    it was opened, so its first entry was written no later) and the padded
    id of the entry that ended it ("" when none yet). A turn is marked when
    it started at or before a lost entry's time and had not ended before
    that entry. Turns started later are not, although the lost entry may
    have been their first one (written before, applied late): nothing tells
    them apart from turns that began after it; a turn all of whose entries
    were lost never started and cannot be known (docs/reliability.md)."""
    times = [id_order(entry_id) for entry_id in lost]
    marked = []
    for key, (started, ended) in active.items():
        end = id_order(ended) if ended else None  # (padded: int() reads the zeros)
        if any(started <= ms and (end is None or end > (ms, seq)) for ms, seq in times):
            marked.append(key)
    return marked


class LiveTurn(NamedTuple):
    """One turn in a ``publish_live`` call (``publish_live.lua``)."""

    key: TurnKey
    events: list[Event]  # its live events (seq 0)
    updates: bytes  # the updates since its last log entry, one JSON array text
    spoken: int  # how many of the caller's calls for the turn ran before (0: the first)
    renew: bool  # give its live log its TTL again


#: Each event class's ``type`` tag (``event_type``).
_TAGS: dict[type, str] = {cls: str(cls.__struct_config__.tag) for cls in get_args(Event)}


def build_publish_live(
    shard: Shard, turns: list[LiveTurn], options: BatchOptions, speaker: str
) -> ScriptCall:
    """``publish_live``'s KEYS/ARGV for the turns' events and updates, said by
    ``speaker`` (the worker's token in the turns' ``live`` field)."""
    packed = [[live_fields(key, found), msgpack_str(updates), spoken, int(renew), key.encode()]
              for key, found, updates, spoken, renew in turns]
    return ScriptCall(keys=[shard.events],
                      args=[options.events_maxlen, options.live_ttl, len(turns), speaker,
                            _pack.encode(packed), shard.tag])


def live_fields(key: TurnKey, found: list[Event]) -> list[list[str | msgspec.Raw]]:
    """The ``events`` stream entries' fields of a turn's live events
    (``event_fields`` of each, the turn's part made once;
    each event's JSON packed as the msgpack str it is, never decoded)."""
    if not found:
        return []
    same = ["response_id", key.response_id, "synthesis_id", key.synthesis_id()]
    if key.attempt_id:
        same += ["attempt_id", key.attempt_id]
    encode = _json.encode  # (ev.encode_event's encoding, without its call)
    return [["type", _TAGS.get(e.__class__) or event_type(e), *same, "event",
             msgpack_str(encode(e))] for e in found]


def updates_json(texts: list[bytes]) -> bytes:
    """Update JSON texts as one JSON array text."""
    return b"[" + b",".join(texts) + b"]"

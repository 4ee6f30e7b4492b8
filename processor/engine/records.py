"""A turn's stored state in Redis, its codec: the record ``apply_entries``
keeps per entry and the snapshot that replaces the records up to its
``cover`` (a compaction's, or a held turn's checkpoint). Pure.

A turn's ``recs`` hash holds one record per applied entry (field = entry id)
and, once compacted, a ``Snapshot`` under the field ``STATE``: the
``TurnLife`` after every record up to its ``cover`` entry id, which those
records were replaced by.
"""

from __future__ import annotations

from typing import Any

import msgspec

from processor.engine.lifecycle import Limits, TurnLife
from processor.engine.merge import Turn
from processor.redis_io.replies import as_text
from processor.wire.ids import TurnKey
from processor.wire.models import Record
from processor.wire.outputs import Counts


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


_stored_encoder = msgspec.msgpack.Encoder()
_stored_decoder = msgspec.msgpack.Decoder(Stored)
_snapshot_decoder = msgspec.msgpack.Decoder(Snapshot)
_pack = msgspec.msgpack.Encoder()


def encode_stored(size: int, record: Record) -> bytes:
    return _stored_encoder.encode(Stored(size, record))


def decode_stored(blob: Any) -> Stored:
    """A record as ``encode_stored`` wrote it."""
    return _stored_decoder.decode(blob)


def text_hash(turn_hash: dict[Any, Any]) -> dict[str, str]:
    """A hash as read from Redis (bytes or str names and values), as text."""
    return {as_text(k): as_text(v) for k, v in turn_hash.items()}


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


def snapshot(life: TurnLife, cover: str) -> bytes:
    """The stored snapshot of a turn without an outcome after every entry
    up to ``cover`` (what ``resume`` reads back): a compaction's, or a
    held turn's checkpoint (``checkpoint_held``)."""
    return _pack.encode(Snapshot(cover, life.turn.to_bytes(), life.counts, life.bytes,
                                 life.first_id, life.last_id, life.next_n))

"""Compaction: a turn's stored records below the shard's watermark folded
into one snapshot (``compact_turn.lua`` replaces them). Pure: a turn
replayed from the snapshot and the records after it gives the same
response as from every record.
"""

from __future__ import annotations

from typing import Any

import msgspec

from processor.engine.lifecycle import Limits
from processor.engine.records import decode_stored, resume, snapshot
from processor.redis_io.replies import as_text
from processor.wire.ids import TurnKey
from processor.wire.stream_ids import id_order


class Compaction(msgspec.Struct):
    """What ``compact_turn`` needs: replace ``folded`` by ``state``."""

    expected: str  # cover of the snapshot it extends ("" = none)
    cover: str
    folded: list[str]
    state: bytes


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
        stored = decode_stored(records[entry_id])
        if stored.record.kind != "update" or life.ends_turn(stored.record, stored.size):
            break
        life.feed(entry_id, stored.record, stored.size)
        folded.append(entry_id)
    if not folded or len(folded) < minimum:
        return None
    cover = folded[-1]
    return Compaction(previous, cover, folded, snapshot(life, cover))

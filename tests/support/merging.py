"""Merging test entries in-process: one turn's entries (dicts as a test
writes them) decoded and fed through ``Turn``, without
the worker or the offline CLI. Shared by the merge property tests, the worked
merge cases and the interop tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from processor.engine.live_growth import live_progress
from processor.engine.merge import Turn
from processor.engine.shown import Shown
from processor.ingest.decode import decode_entry
from processor.wire.ids import TurnKey
from processor.wire.models import Record
from processor.wire.outputs import Event, Response


def update_entry(turn: str, **update: Any) -> dict[str, Any]:
    """An update entry of ``turn``: the update given as keyword arguments."""
    return {"response_id": turn, "update": update}


def decoded(entries: list[dict[str, Any]]) -> tuple[TurnKey, list[Record]]:
    """The records of one turn's entries (all of them decode)."""
    records = []
    key = None
    for entry in entries:
        key, record = decode_entry(entry)
        records.append(record)
    assert key is not None
    return key, records


def merged(key: TurnKey, records: list[Record]) -> Turn:
    """A turn with ``records`` applied in order."""
    turn = Turn(key)
    for record in records:
        turn.apply(record)
    return turn


def merge_entries(entries: list[dict[str, Any]]) -> Response:
    """The merged response of one turn's entries."""
    key, records = decoded(entries)
    return merged(key, records).finish()


def merge_entries_resumed(entries: list[dict[str, Any]]) -> Response:
    """The merged response of one turn's entries, the turn's state saved and
    loaded again (``to_bytes``/``from_bytes``) before each record: what a
    worker that stores the state between batches gets."""
    key, records = decoded(entries)
    turn = Turn(key)
    for record in records:
        turn = Turn.from_bytes(turn.to_bytes())
        turn.apply(record)
    return turn.finish()


def live_batches(key: TurnKey, records: list[Record], cuts: list[int], now: int
                 ) -> Iterator[tuple[list[Event], Turn]]:
    """A turn's records fed in batches ending at ``cuts`` (and at the last),
    as the worker feeds them: after each batch, the turn's live events
    (``live_progress``, against what the earlier ones said, at time ``now``)
    and the turn."""
    turn, shown = Turn(key), Shown()
    bounds = sorted({min(c, len(records)) for c in cuts} | {len(records)})
    start = 0
    for end in bounds:
        for record in records[start:end]:
            turn.apply(record)
        start = end
        found, shown = live_progress(key, turn.state.ids, shown, turn, now)
        yield found, turn

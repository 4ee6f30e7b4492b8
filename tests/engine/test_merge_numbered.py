"""Properties of numbered turns (docs/contract.md §3.4) on random turns:
numbering a whole turn changes nothing but its counts; entries lost and
doubled at random never make a turn that lost one say ``completed``; and
the stored path's replay of the arrived entries, compacted anywhere, gives
what ``processor merge`` gives. (The merge's other properties:
``test_merge_properties.py``.)"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import deliveries, numbered, turns

from processor.engine.compaction import plan_compaction
from processor.engine.events import encode_response
from processor.engine.lifecycle import Limits
from processor.engine.offline import merge_lines
from processor.engine.records import STATE, encode_stored
from processor.engine.replay import replay
from processor.ingest.decode import decode_entry, entry_size

PROPERTY = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _offline(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """``processor merge`` of one turn's entries, as JSON."""
    (result,) = merge_lines([json.dumps(entry) for entry in entries]).results()
    return json.loads(msgspec.json.encode(result))


def _without_numbers(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if k not in ("duplicates", "missing")}


@PROPERTY
@given(turns())
def test_numbering_a_whole_turn_changes_nothing_but_its_counts(
        entries: list[dict[str, Any]]) -> None:
    plain, counted = _offline(entries), _offline(numbered(entries))
    assert counted["status"] == plain["status"] == "completed"
    assert counted["response"] == plain["response"]
    assert counted["meta"] == plain["meta"]
    assert counted["meta"]["counts"]["duplicates"] == counted["meta"]["counts"]["missing"] == 0
    assert [{**e, "ts": 0} for e in counted["events"]] == [{**e, "ts": 0} for e in plain["events"]]


@PROPERTY
@given(st.data())
def test_a_numbered_turn_missing_an_entry_never_completes(data: st.DataObject) -> None:
    """Entries lost and doubled at random: the merge is that of the entries
    that arrived, each once; the numbers never seen below the highest one
    seen are counted missing, and such a turn ends ``entries_lost`` where
    it would have completed or timed out (its end lost too)."""
    entries = data.draw(turns(), label="turn")
    arrived, fates = data.draw(deliveries(entries), label="deliveries")
    if not arrived:
        return  # (a turn none of whose entries arrived never started: nothing to say)
    got = _offline(arrived)
    once = [e for e, fate in zip(entries, fates, strict=True) if fate != "lost"]
    reference = _offline(once)
    seen = [i for i, fate in enumerate(fates) if fate != "lost"]
    missing = sum(1 for i in range(seen[-1]) if fates[i] == "lost")
    end_doubled = fates[-1] == "doubled"
    doubled = sum(1 for fate in fates if fate == "doubled") - end_doubled
    counts = got["meta"]["counts"]
    assert (counts["missing"], counts["duplicates"]) == (missing, doubled)
    assert got["response"] == reference["response"]
    assert _without_numbers({**counts, "dlq": 0}) == _without_numbers(reference["meta"]["counts"])
    assert counts["dlq"] == end_doubled  # the end's copy comes after the end: turn_closed
    if missing:
        assert got["status"] == "error"
        assert got["meta"]["error"]["code"] == "entries_lost"
        assert f"{missing} numbered entr" in got["meta"]["error"]["message"]
        assert got["events"][-1]["counts"]["missing"] == missing
    else:
        assert got["status"] == reference["status"]
        assert got["meta"]["error"] == reference["meta"]["error"]
    assert got["status"] != "completed" or "lost" not in fates


@PROPERTY
@given(st.data())
def test_a_numbered_turn_replays_the_same_from_its_stored_records_compacted_anywhere(
        data: st.DataObject) -> None:
    """The worker's stored path: a turn's records replayed (replay),
    compacted at any point first, give what ``processor merge`` gives: the
    next number a snapshot expects travels in it (``next_n``)."""
    entries = data.draw(turns(), label="turn")
    arrived, _fates = data.draw(deliveries(entries), label="deliveries")
    if not arrived:
        return
    want = _offline(arrived)
    key = None
    recs: dict[str, bytes] = {}
    for i, entry in enumerate(arrived, start=1):
        key, record = decode_entry(entry)
        recs[f"{i}-0"] = encode_stored(entry_size(entry), record)
    assert key is not None
    limits = Limits()
    for cut in sorted(data.draw(st.sets(st.integers(1, len(arrived)), max_size=2), label="cuts")):
        plan = plan_compaction(key, recs, f"{cut + 1}-0", limits)
        if plan is not None:
            for entry_id in plan.folded:
                del recs[entry_id]
            recs[STATE] = plan.state
    done = replay(key, recs, limits)
    if done.life.outcome is None:
        done.life.expire()
    response = done.life.response()
    meta = done.life.meta(response, None, None)
    assert json.loads(encode_response(response)) == want["response"]
    assert json.loads(msgspec.json.encode(meta.counts)) == want["meta"]["counts"]
    assert (meta.error.code if meta.error else None) == (
        want["meta"]["error"]["code"] if want["meta"]["error"] else None)

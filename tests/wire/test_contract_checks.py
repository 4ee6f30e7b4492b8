"""tests/support/contract.py, which every integration test's outputs go through,
accepts what the merge publishes and refuses what breaks the schema (it
compiles the schema with fastjsonschema: this keeps it honest)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.contract import check_event_entry, check_merged_entry
from support.turn_reference import offline_results, simple_turn


def _published() -> tuple[list[dict[str, Any]], dict[str, str]]:
    [turn] = offline_results(simple_turn("c1", 3), progress=True).values()
    line = turn.line
    merged = {"response_id": "c1", "synthesis_id": "c1:synthesis", "status": line["status"],
              "response": json.dumps(line["response"]), "meta": json.dumps(line["meta"])}
    return line["events"], merged


def _entry(event: dict[str, Any]) -> dict[str, str]:
    return {"type": event["type"], "response_id": event["response_id"],
            "synthesis_id": event["synthesis_id"], "event": json.dumps(event)}


def test_what_the_merge_publishes_passes_and_a_broken_event_does_not() -> None:
    events, _ = _published()
    for event in events:
        entry = _entry(event)
        copy = dict(entry)
        assert check_event_entry(entry) == event
        assert entry == copy  # checked, not changed (no defaults filled in)
    chunk = next(e for e in events if e["type"] == "synthesis.chunk")
    for broken in ({k: v for k, v in chunk.items() if k != "seq"}, {**chunk, "seq": "3"},
                   {**chunk, "delta": 7}, {**chunk, "type": "no.such.type"}):
        with pytest.raises(AssertionError):
            check_event_entry(_entry(broken))
    with pytest.raises(AssertionError, match="does not match `processor schema`"):
        check_event_entry({**_entry(chunk), "type": 5})  # type: ignore[dict-item]


def test_a_merged_entry_with_a_broken_response_does_not_pass() -> None:
    _, merged = _published()
    copy = dict(merged)
    check_merged_entry(merged)
    assert merged == copy
    response = json.loads(merged["response"])
    for broken in ({**response, "messages": "none"}, {**response, "messages": [{"role": 5}]}):
        with pytest.raises(AssertionError, match="does not match `processor schema`"):
            check_merged_entry({**merged, "response": json.dumps(broken)})
    with pytest.raises(AssertionError):
        check_merged_entry({k: v for k, v in merged.items() if k != "status"})

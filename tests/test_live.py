"""Live progress events (:mod:`processor.engine.live`), pure: over random turns cut
into random batches, a reader that applies the events holds exactly the
merge, per message: text, reasoning, every call's arguments and every
result; and a turn that only grows gives plain appends."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from merging import decoded
from strategies import turns

from processor.engine.live import Shown, arguments_text, live_events, message_text, replay_texts
from processor.engine.merge import Turn
from processor.wire.models import Response

_json = msgspec.json.Encoder()


def _as_dicts(events: list[Any]) -> list[dict[str, Any]]:
    return [msgspec.json.decode(_json.encode(e)) for e in events]


def _calls(events: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    for e in events:
        if e["type"] == "tool_call.chunk":
            where = (e["message_id"], e["index"])
            out[where] = e["delta"] if e["replace"] else out.get(where, "") + e["delta"]
    return out


def _results(events: list[dict[str, Any]]) -> dict[tuple[str, int], Any]:
    return {(e["message_id"], e["index"]): e["result"] for e in events
            if e["type"] == "tool_result"}


def _expected(response: Response, kind: str) -> dict[str, str]:
    return {m.message_id or "": text for m in response.messages
            if (text := message_text(m, kind))}


def _nonempty(found: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in found.items() if v}


def _run(entries: list[dict[str, Any]], cuts: list[int]) -> tuple[list[dict[str, Any]], Response]:
    """The live events of a turn fed in batches ending at ``cuts``, and its merge."""
    key, records = decoded(entries)
    turn, shown = Turn(key), Shown()
    events: list[dict[str, Any]] = []
    bounds = sorted({min(c, len(records)) for c in cuts} | {len(records)})
    start = 0
    for end in bounds:
        for record in records[start:end]:
            turn.apply(record)
        start = end
        found, shown = live_events(key, turn.state.ids, shown, turn.finish(), 0)
        events += _as_dicts(found)
    return events, turn.finish()


@settings(max_examples=300, deadline=None)
@given(turns(), st.lists(st.integers(0, 60), max_size=8))
def test_a_reader_of_the_live_events_holds_exactly_the_merge(
    entries: list[dict[str, Any]], cuts: list[int]
) -> None:
    events, response = _run(entries, cuts)
    assert _nonempty(replay_texts(events)) == _expected(response, "text")
    assert _nonempty(replay_texts(events, "reasoning.chunk")) == _expected(
        response, "text_reasoning")
    calls = {(m.message_id, i): arguments_text(c.arguments) for m in response.messages
             for i, c in enumerate(c for c in m.contents if c.type == "function_call")}
    assert {k: v for k, v in _calls(events).items() if k in calls} == calls
    results = {(m.message_id, i): c.result for m in response.messages
               for i, c in enumerate(c for c in m.contents if c.type == "function_result")}
    assert {k: v for k, v in _results(events).items() if k in results} == results
    assert all(e["seq"] == 0 for e in events)  # numbered when published


@settings(max_examples=200, deadline=None)
@given(turns(agents=1, idless=False, interleave=False, relabel=False, extras=False),
       st.lists(st.integers(0, 60), max_size=8))
def test_a_turn_that_only_grows_is_told_in_appends_each_message_once_per_batch(
    entries: list[dict[str, Any]], cuts: list[int]
) -> None:
    events, response = _run(entries, cuts)
    chunks = [e for e in events if e["type"] == "synthesis.chunk"]
    assert not any(e["replace"] for e in chunks)
    texts: dict[str, str] = {}
    for e in chunks:
        texts[e["message_id"]] = texts.get(e["message_id"], "") + e["delta"]
    assert _nonempty(texts) == _expected(response, "text")


def test_nothing_new_says_nothing_and_a_batch_is_one_chunk_per_message() -> None:
    rid = "r"
    entries = [{"response_id": rid, "update": {"message_id": "m1", "role": "assistant",
                                               "contents": [{"type": "text", "text": t}]}}
               for t in ("a", "b", "c")]
    key, records = decoded(entries)
    turn = Turn(key)
    for record in records:
        turn.apply(record)
    first, shown = live_events(key, {}, Shown(), turn.finish(), 5)
    assert [(type(e).__name__, getattr(e, "delta", None)) for e in first] == [
        ("Step", None), ("SynthesisChunk", "abc")]
    again, _ = live_events(key, {}, shown, turn.finish(), 6)
    assert again == []


def test_a_message_whose_reasoning_began_first_gets_its_reasoning_chunk_first() -> None:
    """In one batch, a message's chunks come in its contents' order
    (reasoning, then text), as a UI that adds parts in arrival order
    (the AI SDK's) must show them: else the merged order differs."""
    entries = [{"response_id": "r", "update": {"message_id": "m1", "role": "assistant",
                                               "contents": [{"type": kind, "text": text}]}}
               for kind, text in (("text_reasoning", "hmm"), ("text", "Hi"))]
    key, records = decoded(entries)
    turn = Turn(key)
    for record in records:
        turn.apply(record)
    events, _ = live_events(key, {}, Shown(), turn.finish(), 5)
    assert [type(e).__name__ for e in events] == ["Step", "ReasoningChunk", "SynthesisChunk"]
    turn.apply(decoded([{"response_id": "r", "update": {
        "message_id": "m2", "role": "assistant", "contents": [
            {"type": "text", "text": "a"}, {"type": "function_call", "call_id": "c"},
            {"type": "text_reasoning", "text": "b"}]}}])[1][0])
    events, _ = live_events(key, {}, Shown(), turn.finish(), 6)
    assert [(type(e).__name__, getattr(e, "message_id", None)) for e in events[1:]] == [
        ("ReasoningChunk", "m1"), ("SynthesisChunk", "m1"),
        ("SynthesisChunk", "m2"), ("ReasoningChunk", "m2"), ("ToolCallChunk", "m2")]

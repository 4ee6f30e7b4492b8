"""The AI SDK's UI message stream of a turn (``processor.engine.ui_messages``),
pure: over random turns cut into random batches and ended at a random
batch (completed, cancelled or failed), a client reading the chunks (the
AI SDK's ``processUIMessageStream``, ``ui_messages.Reader``) from the
start, joined late from a snapshot, or after the end ends with the merged
response's parts, and live holds each message's text and reasoning as
merged so far after every batch. (tests/serve/test_serve_ai_sdk.py checks the
same with the real ``ai`` package over HTTP.)"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, note, settings
from hypothesis import strategies as st
from support.merging import decoded
from support.strategies import turns
from support.ui_messages import Reader, comparable, expected_parts

from processor.engine.live import live_events, message_text
from processor.engine.merge import Turn
from processor.engine.shown import Shown
from processor.engine.ui_messages import Ending, UiStream
from processor.wire.outputs import Response

_json = msgspec.json.Encoder()


def _through_json(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(_json.encode(c)) for c in chunks]


class _Batch(msgspec.Struct):
    events: list[dict[str, Any]]  # decoded, numbered
    response: Response  # the merge after this batch


def _batches(entries: list[dict[str, Any]], cuts: list[int]) -> list[_Batch]:
    """The live events of a turn fed in batches ending at ``cuts``, numbered
    from seq 1 (``synthesis.started`` is seq 0), and the merge after each."""
    key, records = decoded(entries)
    turn, shown = Turn(key), Shown()
    bounds = sorted({min(c, len(records)) for c in cuts} | {len(records)})
    out, start, seq = [], 0, 0
    for end in bounds:
        for record in records[start:end]:
            turn.apply(record)
        start = end
        found, shown = live_events(key, turn.state.ids, shown, turn.finish(), 0)
        events = []
        for event in found:
            seq += 1
            events.append({**json.loads(_json.encode(event)), "seq": seq})
        out.append(_Batch(events, turn.finish()))
    return out


def _terminal(status: str, seq: int, reason: str | None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "synthesis", "seq": seq, "status": status, "error": None}
    if status == "error":
        event["error"] = {"code": "producer_error", "message": "model down"}
    if status == "cancelled":
        event["cancel_reason"] = reason
    return event


def _texts(reader: Reader, kind: str) -> dict[str, str]:
    return {p["providerMetadata"]["processor"]["messageId"]: p["text"]
            for p in reader.message["parts"] if p["type"] == kind}


def _merged_texts(response: Response, kind: str) -> dict[str, str]:
    return {m.message_id or "": t for m in response.messages if (t := message_text(m, kind))}


def _open(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parts with text and reasoning still streaming (as a snapshot leaves them)."""
    return [{**p, "state": "streaming"} if p["type"] in ("text", "reasoning") else p
            for p in parts]


def _read(reader: Reader, chunks: list[dict[str, Any]]) -> None:
    for chunk in _through_json(chunks):
        reader.feed(chunk)


@settings(max_examples=150, deadline=None)
@given(turns(), st.lists(st.integers(0, 60), max_size=8), st.data())
def test_every_client_ends_with_the_merged_response_however_it_joined(
    entries: list[dict[str, Any]], cuts: list[int], data: st.DataObject
) -> None:
    batches = _batches(entries, cuts)
    stop = data.draw(st.integers(1, len(batches)), label="batches before the end")
    status = data.draw(st.sampled_from(["completed", "cancelled", "error"]), label="status")
    reason = data.draw(st.sampled_from([None, "user pressed stop"]), label="cancel reason")
    join = data.draw(st.integers(1, stop), label="late join after batch")
    batches = batches[:stop]
    merged = batches[-1].response
    seq = max((e["seq"] for b in batches for e in b.events), default=0)
    terminal = _terminal(status, seq + 1, reason)
    ending = Ending.of_event(terminal)
    expected = comparable(expected_parts(json.loads(_json.encode(merged))))
    started = {"type": "synthesis.started", "seq": 0}

    # Live from seq 0: after every batch, each message as merged so far.
    live, reader = UiStream("r:synthesis"), Reader()
    _read(reader, live.event(started))
    for batch in batches:
        for event in batch.events:
            _read(reader, live.event(event))
        assert _texts(reader, "text") == _merged_texts(batch.response, "text")
        assert _texts(reader, "reasoning") == _merged_texts(batch.response, "text_reasoning")
    _read(reader, live.end(ending, merged, merged.finish_reason))
    note(f"live chunk types: {reader.types}")

    # Joined late: the snapshot of the merge after batch `join`, then the rest.
    late, late_reader = UiStream("r:synthesis"), Reader()
    _read(late_reader, late.snapshot(batches[join - 1].response))
    snapshot = expected_parts(json.loads(_json.encode(batches[join - 1].response)), final=False)
    assert _open(comparable(late_reader.message["parts"])) == _open(comparable(snapshot))
    for batch in batches[join:]:
        for event in batch.events:
            _read(late_reader, late.event(event))
    _read(late_reader, late.end(ending, merged, merged.finish_reason))

    # After the end: the merged response alone.
    after, after_reader = UiStream("r:synthesis"), Reader()
    _read(after_reader, after.end(ending, merged, merged.finish_reason))
    assert "reset-step" not in after_reader.types

    for one in (reader, late_reader, after_reader):
        assert one.message["id"] == "r:synthesis"
        assert one.types[:2] == ["start", "start-step"] and one.types[-2] == "finish-step"
        assert comparable(one.message["parts"]) == expected
        assert all(p.get("state") in (None, "done") for p in one.message["parts"]
                   if p["type"] in ("text", "reasoning"))
        end = one.ending
        assert end is not None
        if status == "completed":
            assert end["type"] == "finish"
        elif status == "cancelled":
            assert end == ({"type": "abort", "reason": reason} if reason else {"type": "abort"})
        else:
            assert end == {"type": "error", "errorText": "model down"}


@settings(max_examples=150, deadline=None)
@given(turns(agents=1, idless=False, interleave=False, relabel=False, extras=False),
       st.lists(st.integers(0, 60), max_size=8))
def test_a_turn_that_only_grows_streams_in_appends_until_its_end(
    entries: list[dict[str, Any]], cuts: list[int]
) -> None:
    """One agent, keyed messages one after the other: nothing is ever
    rewritten (no ``reset-step``, live or at the end): the message only
    grows, deltas and new parts at its end. (A message's reasoning and text
    in one batch come reasoning first when it began first, as merged.)"""
    batches = _batches(entries, cuts)
    live, reader = UiStream("r:synthesis"), Reader()
    for batch in batches:
        for event in batch.events:
            _read(reader, live.event(event))
    merged = batches[-1].response
    _read(reader, live.end(Ending("completed"), merged, merged.finish_reason))
    assert "reset-step" not in reader.types
    assert comparable(reader.message["parts"]) == comparable(
        expected_parts(json.loads(_json.encode(merged))))


def _text(mid: str, delta: str, replace: bool = False, author: str = "bob") -> dict[str, Any]:
    return {"type": "synthesis.chunk", "message_id": mid, "author_name": author,
            "agent_id": None, "delta": delta, "replace": replace}


def test_a_replace_resets_the_step_and_sends_the_message_again() -> None:
    """What a client sees when the merge rewrites the past: ``reset-step``
    (the step's parts go), then every part as it now is, open."""
    ui = UiStream("t:synthesis")
    assert ui.event(_text("m1", "Hello")) == [
        {"type": "start", "messageId": "t:synthesis"}, {"type": "start-step"},
        {"type": "text-start", "id": "m1",
         "providerMetadata": {"processor": {"messageId": "m1", "authorName": "bob"}}},
        {"type": "text-delta", "id": "m1", "delta": "Hello"}]
    assert ui.event(_text("m1", " world")) == [
        {"type": "text-delta", "id": "m1", "delta": " world"}]
    assert ui.event(_text("m2", "Hi", author="alice"))[1] == {
        "type": "text-delta", "id": "m2", "delta": "Hi"}
    chunks = ui.event(_text("m1", "Howdy", replace=True))
    assert [c["type"] for c in chunks] == ["reset-step", "text-start", "text-delta",
                                           "text-start", "text-delta"]
    assert [c.get("delta") for c in chunks if c["type"] == "text-delta"] == ["Howdy", "Hi"]
    # A message folded into another (its text replaced by nothing) goes.
    chunks = ui.event(_text("m2", "", replace=True))
    assert [c["type"] for c in chunks] == ["reset-step", "text-start", "text-delta"]


def test_tool_calls_stream_their_input_and_get_their_output() -> None:
    ui = UiStream("t:synthesis")
    call = {"type": "tool_call.chunk", "message_id": "m1", "index": 0, "call_id": "c1",
            "name": "find", "author_name": "alice", "agent_id": "a1", "replace": False}
    meta = {"processor": {"messageId": "m1", "authorName": "alice", "agentId": "a1"}}
    assert ui.event({**call, "delta": '{"q": '})[2:] == [
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "find", "dynamic": True,
         "providerExecuted": True, "providerMetadata": meta},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"q": '}]
    [available] = _through_json(ui.event({**call, "delta": '"x"}'}))
    assert available == {"type": "tool-input-available", "toolCallId": "c1", "toolName": "find",
                         "input": {"q": "x"}, "dynamic": True, "providerExecuted": True,
                         "providerMetadata": meta}
    result = {"type": "tool_result", "message_id": "t1", "index": 0, "call_id": "c1",
              "author_name": None, "agent_id": None, "result": "42"}
    assert _through_json(ui.event(result)) == [
        {"type": "tool-output-available", "toolCallId": "c1", "output": "42", "dynamic": True,
         "providerExecuted": True}]
    # An unknown event type, a step, or a result for no known call: nothing.
    assert ui.event({"type": "step", "step": "text"}) == []
    assert ui.event({**result, "call_id": "nope", "index": 1}) == []
    # Nor an event without the fields its type needs (not a crash).
    assert ui.event({**call, "delta": None}) == []
    assert ui.event({**result, "index": "0"}) == []
    assert ui.event({"type": "synthesis.chunk", "message_id": 7, "delta": "x"}) == []
    ui.event(_text("m1", "Hi"))
    assert ui.event({**_text("m1", ""), "delta": 5}) == []

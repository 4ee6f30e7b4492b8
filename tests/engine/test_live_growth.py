"""``live_progress``: a turn that only grew since its last live render is
told without rendering it again, exactly as the render would tell it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.merging import decoded
from support.strategies import turns

from processor.engine import live_growth
from processor.engine.live import live_events
from processor.engine.live_growth import live_progress
from processor.engine.merge import Turn
from processor.engine.shown import Shown
from processor.wire.ids import TurnKey


def _without_layout(shown: Shown) -> Shown:
    return msgspec.structs.replace(shown, layout=None)


def _told_both_ways(entries: list[dict[str, Any]], cuts: list[int]) -> None:
    """The same turn fed twice in the same batches (ending at ``cuts``):
    ``live_progress`` on one (rendering only when the turn did more than
    grow), ``live_events`` of the full render on the other. Every batch:
    the same events, the same ``Shown`` (but its layout)."""
    key, records = decoded(entries)
    grown_turn, full_turn = Turn(key), Turn(key)
    grown_shown = full_shown = Shown()
    bounds = sorted({min(c, len(records)) for c in cuts} | {len(records)})
    start = 0
    for end in bounds:
        for record in records[start:end]:
            grown_turn.apply(record)
            full_turn.apply(record)
        start = end
        ids = full_turn.state.ids
        said, grown_shown = live_progress(key, ids, grown_shown, grown_turn, 7)
        expected, full_shown = live_events(key, ids, full_shown, full_turn.finish(), 7)
        assert said == expected
        assert _without_layout(grown_shown) == _without_layout(full_shown)


#: A keyed message shows calls of an id-less run folded into it, loses
#: them, and a later call takes a place it lost (its first chunk replaces).
CALL_IN_A_LOST_PLACE = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "live_call_in_a_lost_place.json").read_text())


@settings(max_examples=300, deadline=None)
@given(turns(), st.lists(st.integers(0, 60), min_size=1, max_size=40))
@example(CALL_IN_A_LOST_PLACE, [9, 11])
@example(CALL_IN_A_LOST_PLACE, list(range(len(CALL_IN_A_LOST_PLACE))))
def test_live_progress_says_what_a_full_render_says_batch_after_batch(
    entries: list[dict[str, Any]], cuts: list[int]
) -> None:
    _told_both_ways(entries, cuts)


def _update(message: str, *contents: dict[str, Any], **names: Any) -> dict[str, Any]:
    return {"response_id": "t", "update": {"message_id": message, "contents": list(contents),
                                           **names}}


EVERY_ENTRY = list(range(12))


@pytest.mark.parametrize("entries", [
    # A message whose first text is empty: its first words make it a
    # message with events (the next one's previous_message_id is it).
    [_update("m1", {"type": "text", "text": ""}, role="assistant"),
     _update("m2", {"type": "text", "text": "b"}, role="assistant"),
     _update("m1", {"type": "text", "text": "a"}),
     _update("m2", {"type": "text", "text": "c"})],
    # A call's arguments streaming in chunks after reasoning, then text.
    [_update("m1", {"type": "text_reasoning", "text": "hm"}, role="assistant"),
     _update("m1", {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{"}),
     _update("m1", {"type": "function_call", "arguments": '"x"'}),
     _update("m1", {"type": "function_call", "arguments": ":1}"}),
     _update("m1", {"type": "text", "text": "done"}),
     _update("m1", {"type": "text", "text": "!"})],
    # A message named late: its author, agent and role, each with a later chunk.
    [_update("m1", {"type": "text", "text": "a"}),
     _update("m1", {"type": "text", "text": "b"}, author_name="al"),
     _update("m1", {"type": "text", "text": "c"}, agent_id="x"),
     _update("m1", {"type": "text", "text": "d"}, role="user"),
     _update("m1", {"type": "text", "text": "e"}, author_name="bo")],
    # Reasoning that grows beside text: the message's chunks in its order.
    [_update("m1", {"type": "text_reasoning", "text": "hm"}, role="assistant"),
     _update("m1", {"type": "text", "text": "Hi"}),
     _update("m1", {"type": "text", "text": " you"}),
     _update("m1", {"type": "text_reasoning", "text": "again"}),
     _update("m1", {"type": "text_reasoning", "text": " more"})],
    # An id-less run, shown, then folded into the keyed message after it:
    # it leaves the merge (its text replaced by nothing), and the keyed one grows.
    [{"response_id": "t", "update": {"role": "assistant", "author_name": "al",
                                     "contents": [{"type": "text", "text": "So "}]}},
     _update("m1", {"type": "text", "text": "be"}, role="assistant", author_name="al"),
     _update("m1", {"type": "text", "text": " it"}),
     _update("m1", {"type": "text", "text": "."})],
], ids=["empty-first-text", "call-arguments", "named-late", "reasoning-and-text",
        "folded-away"])
def test_live_progress_says_what_a_full_render_says_entry_by_entry(
    entries: list[dict[str, Any]]
) -> None:
    _told_both_ways(entries, EVERY_ENTRY)


def _text(message: str, text: str, kind: str = "text", author: str = "writer"
          ) -> dict[str, Any]:
    """A named assistant message's text (or reasoning) update."""
    return _update(message, {"type": kind, "text": text}, role="assistant", author_name=author)


def _feed(turn: Turn, *entries: dict[str, Any]) -> None:
    for record in decoded(list(entries))[1]:
        turn.apply(record)


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times ``live_progress`` rendered a merge."""
    made: list[int] = []
    full = live_growth.live_events

    def counted(*args: Any) -> Any:
        made.append(1)
        return full(*args)

    monkeypatch.setattr(live_growth, "live_events", counted)
    return made


def test_a_long_turn_that_only_grows_is_told_without_a_render(renders: list[int]) -> None:
    key = TurnKey("long")
    turn = Turn(key)
    # Forty messages (agents handing off, tools), then one that streams on.
    _feed(turn, *[_text(f"m{i}", f"message {i}. ", author=f"agent{i % 3}")
                  for i in range(40)])
    _feed(turn, _text("m40", "thinking", kind="text_reasoning"),
          _text("m41", "The answer"))
    events, shown = live_progress(key, {}, Shown(), turn, 1)
    assert len(renders) == 1 and len(events) == 43  # a step, then a chunk per message
    for word in (" is", " forty", "-two"):
        _feed(turn, _text("m41", word))
        events, shown = live_progress(key, {}, shown, turn, 2)
        assert [(e.message_id, e.delta, e.previous_message_id) for e in events] == [
            ("m41", word, "m40")]
    _feed(turn, _text("m40", " more", kind="text_reasoning"),
          _text("m41", "."))
    events, shown = live_progress(key, {}, shown, turn, 3)
    assert [(type(e).__name__, e.message_id, e.delta) for e in events] == [
        ("ReasoningChunk", "m40", " more"), ("SynthesisChunk", "m41", ".")]
    assert len(renders) == 1  # (told from what grew, three times)
    assert not turn._parts  # (the pieces joined as a render joins them: memory stays flat)
    # A new message is more than growth: the merge is rendered again.
    _feed(turn, _text("m42", "Next"))
    events, shown = live_progress(key, {}, shown, turn, 4)
    assert len(renders) == 2
    assert [(type(e).__name__, getattr(e, "delta", None)) for e in events] == [
        ("Step", None), ("SynthesisChunk", "Next")]
    # A message's second call, its arguments streaming in: told from what grew too.
    _feed(turn, _update("m42", {"type": "function_call", "call_id": "c1", "name": "f",
                                "arguments": "{}"}, role="assistant"),
          _update("m42", {"type": "function_call", "call_id": "c2", "name": "g",
                          "arguments": '{"q": '}))
    _, shown = live_progress(key, {}, shown, turn, 5)
    assert len(renders) == 3  # (a new content renders)
    for piece in ('"forty', '-two"', "}"):
        _feed(turn, _update("m42", {"type": "function_call", "arguments": piece}))
        events, shown = live_progress(key, {}, shown, turn, 6)
        assert [(type(e).__name__, e.message_id, e.index, e.call_id, e.name, e.delta)
                for e in events] == [("ToolCallChunk", "m42", 1, "c2", "g", piece)]
    assert len(renders) == 3 and shown.calls[("m42", 1)] == '{"q": "forty-two"}'
    assert shown.texts["m41"] == "The answer is forty-two."


def test_a_shown_made_with_another_turn_is_rendered_against(renders: list[int]) -> None:
    """A ``Shown`` handed from one ``Turn`` to another (a held turn spilled
    to the stored path's mirror, a state read back) says nothing of the
    other's growth: the other is rendered."""
    key = TurnKey("handed")
    first = Turn(key)
    _feed(first, _text("m1", "Hello"))
    _, shown = live_progress(key, {}, Shown(), first, 1)
    second = Turn.from_bytes(first.to_bytes())
    _feed(second, _text("m1", " there"))
    events, _ = live_progress(key, {}, shown, second, 2)
    assert [e.delta for e in events] == [" there"] and len(renders) == 2

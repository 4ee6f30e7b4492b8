"""Worked cases of the merge rules (docs/contract.md §4): one turn each,
written out by hand, for the rules whose random coverage in
``test_merge_properties`` is thin (late and rejoining results, speakers,
usage corrections, states written by an earlier release)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from support.merging import decoded, merge_entries, merge_entries_resumed, merged, update_entry

from processor.engine.merge import Turn
from processor.engine.offline import merge_lines


def test_idless_result_answering_a_call_in_a_later_block_stays_after_it() -> None:
    rid = "turn-late-call"
    response = merge_entries([
        update_entry(rid, response_id="A", message_id="a1",
               contents=[{"type": "text", "text": "A speaks"}]),
        update_entry(rid, response_id="B", message_id="b1", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]),
        update_entry(rid, response_id="A", role="tool",
               contents=[{"type": "function_result", "call_id": "c", "result": "ok"}]),
    ])
    kinds = [[c.type for c in m.contents] for m in response.messages]
    assert kinds == [["text"], ["function_call"], ["function_result"]]


def test_keyed_result_rejoining_an_earlier_message_moves_after_its_call() -> None:
    rid = "turn-rejoin"
    response = merge_entries([
        update_entry(rid, message_id="t", role="tool",
               contents=[{"type": "function_result", "call_id": "c0", "result": "r0"}]),
        update_entry(rid, message_id="a", contents=[
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]),
        update_entry(rid, message_id="t", role="tool",
               contents=[{"type": "function_result", "call_id": "c1", "result": "r1"}]),
    ])
    summary = [(m.message_id, [c.call_id for c in m.contents]) for m in response.messages]
    assert summary[:2] == [("t", ["c0"]), ("a", ["c1"])]
    assert summary[2][1] == ["c1"] and summary[2][0] not in ("t", "a")


def test_a_moved_result_keeps_its_producer_id_when_nothing_else_has_it() -> None:
    # Agent A's tool message "t" answers a call of agent B, whose block comes
    # after A's: the result moves after the call (result before call), and
    # as "t" has nothing else, the moved message is "t".
    rid = "turn-moved-id"
    entries = [
        update_entry(rid, response_id="A", message_id="a1",
               contents=[{"type": "text", "text": "A speaks"}]),
        update_entry(rid, response_id="B", message_id="b1", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]),
        update_entry(rid, response_id="A", message_id="t", role="tool",
               contents=[{"type": "function_result", "call_id": "c", "result": "ok"}]),
        update_entry(rid, response_id="B", message_id="b2", role="tool",
               contents=[{"type": "text", "text": "B again"}]),
    ]
    response = merge_entries(entries)
    summary = [(m.message_id, [c.type for c in m.contents], m.additional_properties["response_id"])
               for m in response.messages]
    # "t" does not fold into b2 (same role) as an id-less message would: it
    # is the producer's message "t", moved.
    assert summary == [("a1", ["text"], "A"), ("b1", ["function_call"], "B"),
                       ("t", ["function_result"], "B"), ("b2", ["text"], "B")]
    # The same whatever the state went through.
    assert merge_entries_resumed(entries) == response


def test_a_moved_result_gets_an_assigned_id_when_its_producer_id_is_kept() -> None:
    # Once "t" holds something of its own, the moved result is an id-less
    # message with an assigned id, as before.
    rid = "turn-moved-id-kept"
    base = [
        update_entry(rid, response_id="A", message_id="a1",
               contents=[{"type": "text", "text": "A speaks"}]),
        update_entry(rid, response_id="B", message_id="b1", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]),
        update_entry(rid, response_id="A", message_id="t", role="tool",
               contents=[{"type": "function_result", "call_id": "c", "result": "ok"}]),
    ]
    later = update_entry(rid, response_id="A", message_id="t", role="tool",
                         contents=[{"type": "text", "text": "t speaks"}])
    response = merge_entries([*base, later])
    assert [(m.message_id, [c.type for c in m.contents]) for m in response.messages] == [
        ("a1", ["text"]), ("t", ["text"]), ("b1", ["function_call"]),
        (response.messages[3].message_id, ["function_result"]),
    ]
    assert response.messages[3].message_id.startswith("msg-2-")


def test_of_two_moved_results_the_first_in_the_response_keeps_the_id() -> None:
    rid = "turn-moved-twice"
    response = merge_entries([
        update_entry(rid, response_id="A", message_id="a1",
               contents=[{"type": "text", "text": "A speaks"}]),
        update_entry(rid, response_id="B", message_id="b1", contents=[
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]),
        update_entry(rid, response_id="C", message_id="k1", contents=[
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"}]),
        update_entry(rid, response_id="A", message_id="t", role="tool",
               contents=[{"type": "function_result", "call_id": "c2", "result": "r2"}]),
        update_entry(rid, response_id="A", message_id="t", role="tool",
               contents=[{"type": "function_result", "call_id": "c1", "result": "r1"}]),
    ])
    summary = [(m.message_id, [c.call_id for c in m.contents]) for m in response.messages]
    assert summary[:4] == [("a1", [None]), ("b1", ["c1"]), ("t", ["c1"]), ("k1", ["c2"])]
    assert summary[4][1] == ["c2"] and summary[4][0].startswith("msg-3-")
    assert len({m.message_id for m in response.messages}) == 5


def test_a_moved_result_still_names_its_messages_role_and_author() -> None:
    # m1's second update names role and author and holds the result of a
    # call in a later block: the result moves after its call, and m1 is
    # still (tool, alice), the first ones its updates name (§4.3).
    rid = "turn-moved-names"
    entries = [
        update_entry(rid, message_id="m1", contents=[{"type": "text", "text": "looking"}]),
        update_entry(rid, response_id="B", message_id="b1", author_name="alice", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]),
        update_entry(rid, message_id="m1", role="tool", author_name="alice",
               contents=[{"type": "function_result", "call_id": "c", "result": "ok"}]),
    ]
    response = merge_entries(entries)
    summary = [(m.message_id, m.role, m.author_name, [c.type for c in m.contents])
               for m in response.messages]
    assert summary == [("m1", "tool", "alice", ["text"]),
                       ("b1", "assistant", "alice", ["function_call"]),
                       (summary[2][0], "tool", "alice", ["function_result"])]
    assert summary[2][0].startswith("msg-2-")
    # The same whatever the state went through.
    assert merge_entries_resumed(entries) == response


def test_a_moved_result_that_takes_its_id_takes_its_messages_names() -> None:
    # m1 holds nothing but the moved result, so the moved message is m1; its
    # author is the first one m1's updates name (bob, on an update that only
    # carried usage), not the moved update's own.
    rid = "turn-moved-id-names"
    response = merge_entries([
        update_entry(rid, message_id="a1", contents=[{"type": "text", "text": "A speaks"}]),
        update_entry(rid, message_id="m1", role="tool", author_name="bob", contents=[
            {"type": "usage", "usage_details": {"input_token_count": 1}}]),
        update_entry(rid, response_id="B", message_id="b1", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]),
        update_entry(rid, message_id="m1", role="tool", author_name="alice",
               contents=[{"type": "function_result", "call_id": "c", "result": "ok"}]),
    ])
    summary = [(m.message_id, m.role, m.author_name) for m in response.messages]
    assert summary == [("a1", "assistant", None), ("b1", "assistant", None),
                       ("m1", "tool", "bob")]


def test_a_result_in_the_message_of_its_call_stays_there() -> None:
    rid = "turn-same"
    response = merge_entries([
        update_entry(rid, message_id="m", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]),
        update_entry(rid, message_id="m", contents=[
            {"type": "function_result", "call_id": "c", "result": "ok"}]),
    ])
    assert [(m.message_id, [c.type for c in m.contents]) for m in response.messages] == [
        ("m", ["function_call", "function_result"])
    ]


def test_an_unnamed_role_then_tool_splits_an_idless_run() -> None:
    # An id-less run that named no role is an assistant run (role defaults to
    # assistant), so a tool update does not join it (rule 4: split on role).
    rid = "turn-roles"
    response = merge_entries([
        update_entry(rid, contents=[{"type": "text", "text": "thinking aloud"}]),
        update_entry(rid, role="tool", contents=[{"type": "function_result", "call_id": "c",
                                            "result": "ok"}]),
        update_entry(rid, contents=[{"type": "text", "text": " more"}]),
    ])
    assert [m.role for m in response.messages] == ["assistant", "tool"]
    assert [c.type for c in response.messages[1].contents] == ["function_result", "text"]


def test_folding_never_mixes_two_speakers() -> None:
    # alice's run and bob's run are split (author changed); bob's folds into
    # the author-less keyed message after it, alice's then stands alone.
    rid = "turn-speakers"
    response = merge_entries([
        update_entry(rid, author_name="alice", contents=[{"type": "text_reasoning", "text": "a"}]),
        update_entry(rid, author_name="bob", contents=[{"type": "text_reasoning", "text": "b"}]),
        update_entry(rid, message_id="k", contents=[{"type": "text", "text": "answer"}]),
    ])
    summary = [(m.author_name, [c.text for c in m.contents]) for m in response.messages]
    assert summary == [("alice", ["a"]), (None, ["b", "answer"])]


def test_a_usage_correction_replaces_only_its_own_agents_usage() -> None:
    rid = "turn-usage"

    def usage(inner: str, count: int, **extra: Any) -> dict[str, Any]:
        content = {"type": "usage", "usage_details": {"input_token_count": count}, **extra}
        return update_entry(rid, response_id=inner, contents=[content])

    response = merge_entries([usage("A", 5), usage("B", 7), usage("B", 3),
                       usage("B", 10, merge_mode="replace"), usage("A", 1)])
    assert response.usage_details == {"input_token_count": 16}


def test_a_state_written_before_block_usage_still_loads() -> None:
    # Workers of the previous release kept the summed usage in ``usage`` and
    # had no trailing ``block_usage`` field.
    key, records = decoded([update_entry("old", message_id="m", contents=[{"type": "text",
                                                                    "text": "x"}])])
    state = merged(key, records).state
    state.usage = {"input_token_count": 4}
    old = msgspec.msgpack.encode(msgspec.structs.astuple(state)[:-1])
    resumed = Turn.from_bytes(old)
    _, more = decoded([update_entry("old", contents=[
        {"type": "usage", "usage_details": {"input_token_count": 1}}])])
    resumed.apply(more[0])
    assert resumed.finish().usage_details == {"input_token_count": 5}


def test_only_turn_level_ids_are_kept_for_the_turn() -> None:
    result = next(merge_lines([
        json.dumps({"response_id": "t", "step_id": "s1", "session_id": "sess",
                    "update": {"contents": [{"type": "text", "text": "x"}]}}),
        json.dumps({"response_id": "t", "kind": "end", "session_id": "other"}),
    ]).results())
    assert result.meta.ids == {"session_id": "sess"}


def test_usage_only_and_empty_updates_leave_no_message() -> None:
    rid = "turn-empty"
    response = merge_entries([
        update_entry(rid, message_id="m", contents=[]),
        update_entry(rid, contents=[{"type": "usage", "usage_details": {"input_token_count": 2}}]),
        update_entry(rid, message_id="n", contents=[{"type": "text", "text": "hi"}],
               finish_reason="stop"),
    ])
    assert [m.message_id for m in response.messages] == ["n"]
    assert response.usage_details == {"input_token_count": 2}
    assert response.finish_reason == "stop"


@pytest.mark.parametrize("args", [["{\"a\": ", "1}"], [{"a": 1}, {"b": 2}]])
def test_argument_chunks_of_one_call_concatenate(args: list[Any]) -> None:
    rid = "turn-args"
    response = merge_entries([
        update_entry(rid, message_id="m", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": a}])
        for a in args
    ])
    (call,) = response.messages[0].contents
    expected = "".join(args) if isinstance(args[0], str) else {"a": 1, "b": 2}
    assert call.arguments == expected and call.name == "f"

"""Properties of the merge engine (contract section 4) on random turns.

Turns come from :mod:`tests.strategies`; the checks of contract section 4
live in :func:`tests.expectations.check_deltas` (shared with the worker
tests). Here: those checks, determinism, resuming a serialised or compacted
state at any point, and the stability of assigned ids between a partial and
the final merge.
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from delta_oracle import check_deltas, tokens
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import random_turn, turns

from processor.decode import decode_entry
from processor.events import encode_response
from processor.ids import TurnKey
from processor.merge import Turn, turn_tag
from processor.models import Record, Response
from processor.offline import merge_lines

PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


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
    turn = Turn(key)
    for record in records:
        turn.apply(record)
    return turn


def as_json(response: Response) -> dict[str, Any]:
    return json.loads(encode_response(response))


def producer_ids(records: list[Record]) -> set[str]:
    return {r.update.message_id for r in records if r.update and r.update.message_id}


# ---------------------------------------------------------------- contract 4


@PROPERTY
@given(turns())
def test_merge_keeps_every_delta_in_its_message(entries: list[dict[str, Any]]) -> None:
    key, records = decoded(entries)
    check_deltas(entries, as_json(merged(key, records).finish()))


def test_seeded_turns_satisfy_the_contract() -> None:
    # The plain generator the worker tests use, over many seeds.
    for seed in range(300):
        entries = random_turn(random.Random(seed), f"seed-{seed}")
        key, records = decoded(entries)
        check_deltas(entries, as_json(merged(key, records).finish()))


@PROPERTY
@given(turns(agents=1, idless=False, interleave=False, relabel=False))
def test_plain_turns_keep_every_delta(entries: list[dict[str, Any]]) -> None:
    key, records = decoded(entries)
    check_deltas(entries, as_json(merged(key, records).finish()))


@PROPERTY
@given(turns())
def test_merge_is_deterministic(entries: list[dict[str, Any]]) -> None:
    key, records = decoded(entries)
    first = encode_response(merged(key, records).finish())
    again = encode_response(merged(key, decoded(entries)[1]).finish())
    assert first == again
    lines = [json.dumps(e) for e in entries]
    out = [msgspec.json.encode(r) for r in merge_lines(lines).results()]
    assert out == [msgspec.json.encode(r) for r in merge_lines(lines).results()]


# ---------------------------------------------------------------- resuming


@PROPERTY
@given(turns(), st.data())
def test_resume_and_compaction_anywhere_give_the_same_bytes(
    entries: list[dict[str, Any]], data: st.DataObject
) -> None:
    key, records = decoded(entries)
    expected = encode_response(merged(key, records).finish())
    n = len(records)
    cuts = data.draw(st.sets(st.integers(0, n), max_size=4), label="serialise after")
    compactions = data.draw(st.sets(st.integers(0, n), max_size=4), label="compact after")
    peeks = data.draw(st.sets(st.integers(0, n), max_size=2), label="partial finish after")
    turn = Turn(key)
    for i in range(n + 1):
        if i in compactions:
            turn.compact()
        if i in peeks:
            turn.finish()
        if i in cuts:
            turn = Turn.from_bytes(turn.to_bytes())
        if i < n:
            turn.apply(records[i])
    assert encode_response(turn.finish()) == expected


@PROPERTY
@given(turns())
def test_serialising_after_every_update_changes_nothing(entries: list[dict[str, Any]]) -> None:
    key, records = decoded(entries)
    expected = encode_response(merged(key, records).finish())
    turn = Turn(key)
    for record in records:
        turn.apply(record)
        turn = Turn.from_bytes(turn.to_bytes())
    assert encode_response(turn.finish()) == expected


def test_a_partial_response_is_not_changed_by_later_updates() -> None:
    key, records = decoded(random_turn(random.Random(7), "partial"))
    turn = Turn(key)
    half = len(records) // 2
    for record in records[:half]:
        turn.apply(record)
    partial = turn.finish()
    before = encode_response(partial)
    for record in records[half:]:
        turn.apply(record)
    turn.finish()
    assert encode_response(partial) == before


# ---------------------------------------------------------------- assigned ids


def _first_token(message: dict[str, Any]) -> str | None:
    found = tokens(message["contents"])
    return found[0] if found else None


@PROPERTY
@given(turns(), st.data())
def test_assigned_ids_are_stable_between_partial_and_final(
    entries: list[dict[str, Any]], data: st.DataObject
) -> None:
    key, records = decoded(entries)
    final = as_json(merged(key, records).finish())
    final_producer = producer_ids(records)
    home = {t: m for m in final["messages"] for t in tokens(m["contents"])}
    cut = data.draw(st.integers(0, len(records)), label="partial after")
    partial = as_json(merged(key, records[:cut]).finish())
    partial_producer = producer_ids(records[:cut])
    for message in partial["messages"]:
        if message["message_id"] in partial_producer:
            continue  # a producer's id (or an id-less run folded into one)
        token = _first_token(message)
        assert token is not None
        later = home[token]
        if later["message_id"] in final_producer and later["message_id"] != message["message_id"]:
            continue  # folded into a keyed message that arrived later
        if message["message_id"] in final_producer:
            # Decision: uniqueness wins. A producer that later uses the exact id
            # the partial merge assigned forces the final merge to pick another.
            continue
        assert later["message_id"] == message["message_id"], (message, later)


def test_assigned_ids_never_equal_producer_ids() -> None:
    response_id = "turn-collide"
    tag = turn_tag(TurnKey(response_id))
    entries = [
        {"response_id": response_id, "update": {"contents": [{"type": "text", "text": "a"}]}},
        {"response_id": response_id, "update": {
            "contents": [{"type": "text", "text": "b"}], "message_id": f"msg-0-{tag}",
            "role": "tool"}},
        {"response_id": response_id, "update": {"contents": [{"type": "text", "text": "c"}]}},
        {"response_id": response_id, "update": {
            "contents": [{"type": "text", "text": "d"}], "message_id": f"msg-2-{tag}~",
            "role": "tool"}},
        {"response_id": response_id, "update": {"contents": [{"type": "text", "text": "e"}]}},
    ]
    key, records = decoded(entries)
    ids = [m.message_id for m in merged(key, records).finish().messages]
    assert ids == [f"msg-0-{tag}~", f"msg-0-{tag}", f"msg-2-{tag}", f"msg-2-{tag}~", f"msg-4-{tag}"]


# ---------------------------------------------------------------- targeted cases


def _entry(turn: str, **update: Any) -> dict[str, Any]:
    return {"response_id": turn, "update": update}


def _merge(entries: list[dict[str, Any]]) -> Response:
    key, records = decoded(entries)
    return merged(key, records).finish()


def test_idless_result_answering_a_call_in_a_later_block_stays_after_it() -> None:
    rid = "turn-late-call"
    response = _merge([
        _entry(rid, response_id="A", message_id="a1",
               contents=[{"type": "text", "text": "A speaks"}]),
        _entry(rid, response_id="B", message_id="b1", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]),
        _entry(rid, response_id="A", role="tool",
               contents=[{"type": "function_result", "call_id": "c", "result": "ok"}]),
    ])
    kinds = [[c.type for c in m.contents] for m in response.messages]
    assert kinds == [["text"], ["function_call"], ["function_result"]]


def test_keyed_result_rejoining_an_earlier_message_moves_after_its_call() -> None:
    rid = "turn-rejoin"
    response = _merge([
        _entry(rid, message_id="t", role="tool",
               contents=[{"type": "function_result", "call_id": "c0", "result": "r0"}]),
        _entry(rid, message_id="a", contents=[
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]),
        _entry(rid, message_id="t", role="tool",
               contents=[{"type": "function_result", "call_id": "c1", "result": "r1"}]),
    ])
    summary = [(m.message_id, [c.call_id for c in m.contents]) for m in response.messages]
    assert summary[:2] == [("t", ["c0"]), ("a", ["c1"])]
    assert summary[2][1] == ["c1"] and summary[2][0] not in ("t", "a")


def test_a_result_in_the_message_of_its_call_stays_there() -> None:
    rid = "turn-same"
    response = _merge([
        _entry(rid, message_id="m", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]),
        _entry(rid, message_id="m", contents=[
            {"type": "function_result", "call_id": "c", "result": "ok"}]),
    ])
    assert [(m.message_id, [c.type for c in m.contents]) for m in response.messages] == [
        ("m", ["function_call", "function_result"])
    ]


def test_an_unnamed_role_then_tool_splits_an_idless_run() -> None:
    # An id-less run that named no role is an assistant run (role defaults to
    # assistant), so a tool update does not join it (rule 4: split on role).
    rid = "turn-roles"
    response = _merge([
        _entry(rid, contents=[{"type": "text", "text": "thinking aloud"}]),
        _entry(rid, role="tool", contents=[{"type": "function_result", "call_id": "c",
                                            "result": "ok"}]),
        _entry(rid, contents=[{"type": "text", "text": " more"}]),
    ])
    assert [m.role for m in response.messages] == ["assistant", "tool"]
    assert [c.type for c in response.messages[1].contents] == ["function_result", "text"]


def test_folding_never_mixes_two_speakers() -> None:
    # alice's run and bob's run are split (author changed); bob's folds into
    # the author-less keyed message after it, alice's then stands alone.
    rid = "turn-speakers"
    response = _merge([
        _entry(rid, author_name="alice", contents=[{"type": "text_reasoning", "text": "a"}]),
        _entry(rid, author_name="bob", contents=[{"type": "text_reasoning", "text": "b"}]),
        _entry(rid, message_id="k", contents=[{"type": "text", "text": "answer"}]),
    ])
    summary = [(m.author_name, [c.text for c in m.contents]) for m in response.messages]
    assert summary == [("alice", ["a"]), (None, ["b", "answer"])]


def test_a_usage_correction_replaces_only_its_own_agents_usage() -> None:
    rid = "turn-usage"

    def usage(inner: str, count: int, **extra: Any) -> dict[str, Any]:
        content = {"type": "usage", "usage_details": {"input_token_count": count}, **extra}
        return _entry(rid, response_id=inner, contents=[content])

    response = _merge([usage("A", 5), usage("B", 7), usage("B", 3),
                       usage("B", 10, merge_mode="replace"), usage("A", 1)])
    assert response.usage_details == {"input_token_count": 16}


def test_a_state_written_before_block_usage_still_loads() -> None:
    # Workers of the previous release kept the summed usage in ``usage`` and
    # had no trailing ``block_usage`` field.
    key, records = decoded([_entry("old", message_id="m", contents=[{"type": "text",
                                                                    "text": "x"}])])
    state = merged(key, records).state
    state.usage = {"input_token_count": 4}
    old = msgspec.msgpack.encode(msgspec.structs.astuple(state)[:-1])
    resumed = Turn.from_bytes(old)
    _, more = decoded([_entry("old", contents=[
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
    response = _merge([
        _entry(rid, message_id="m", contents=[]),
        _entry(rid, contents=[{"type": "usage", "usage_details": {"input_token_count": 2}}]),
        _entry(rid, message_id="n", contents=[{"type": "text", "text": "hi"}],
               finish_reason="stop"),
    ])
    assert [m.message_id for m in response.messages] == ["n"]
    assert response.usage_details == {"input_token_count": 2}
    assert response.finish_reason == "stop"


@pytest.mark.parametrize("args", [["{\"a\": ", "1}"], [{"a": 1}, {"b": 2}]])
def test_argument_chunks_of_one_call_concatenate(args: list[Any]) -> None:
    rid = "turn-args"
    response = _merge([
        _entry(rid, message_id="m", contents=[
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": a}])
        for a in args
    ])
    (call,) = response.messages[0].contents
    expected = "".join(args) if isinstance(args[0], str) else {"a": 1, "b": 2}
    assert call.arguments == expected and call.name == "f"


@PROPERTY
@given(st.lists(st.tuples(st.sampled_from(["text", "text_reasoning", "function_call"]),
                          st.booleans(), st.integers(0, 9)), min_size=1, max_size=12),
       st.sets(st.integers(0, 12), max_size=3))
def test_snapshot_chunks_replace_and_survive_resuming(
    chunks: list[tuple[str, bool, int]], cuts: set[int]
) -> None:
    # merge_mode="replace" chunks restart their content; the rest append. The
    # expected text follows that rule directly, whatever the state went through.
    rid = "turn-replace"
    entries = []
    for kind, replace, n in chunks:
        content: dict[str, Any] = {"type": kind, "text": f"<{n}>"}
        if kind == "function_call":
            content = {"type": kind, "call_id": "c", "name": "f", "arguments": f"<{n}>"}
        if replace:
            content["merge_mode"] = "replace"
        entries.append(_entry(rid, message_id="m", contents=[content]))
    key, records = decoded(entries)
    turn = Turn(key)
    for i, record in enumerate(records):
        if i in cuts:
            turn = Turn.from_bytes(turn.to_bytes())
        turn.apply(record)
    response = turn.finish()
    assert encode_response(response) == encode_response(merged(key, records).finish())
    expected: list[tuple[str, str]] = []
    calls: dict[str, int] = {}
    for kind, replace, n in chunks:
        piece = f"<{n}>"
        if kind == "function_call" and "c" in calls:
            i = calls["c"]
            expected[i] = (kind, piece if replace else expected[i][1] + piece)
        elif kind != "function_call" and expected and expected[-1][0] == kind:
            expected[-1] = (kind, piece if replace else expected[-1][1] + piece)
        else:
            if kind == "function_call":
                calls["c"] = len(expected)
            expected.append((kind, piece))
    got = [(c.type, c.arguments if c.type == "function_call" else c.text)
           for c in response.messages[0].contents]
    assert got == expected
    assert all(c.merge_mode is None for c in response.messages[0].contents)


# ---------------------------------------------------------------- fast paths


class GeneralTurn(Turn):
    """A Turn that never takes the delta fast path (written out in ``apply``)."""

    __slots__ = ()

    def apply(self, record: Any) -> None:
        if record.ids:
            self._take_ids(record.ids)
        if record.update is not None:
            self._apply_update(record.update)


@PROPERTY
@given(turns(), st.data())
def test_the_delta_fast_path_does_what_the_general_path_does(
    entries: list[dict[str, Any]], data: st.DataObject
) -> None:
    # Same state after every record (not only the same output), with
    # compaction and resumes at random points on both sides alike.
    key, records = decoded(entries)
    cuts = data.draw(st.sets(st.integers(0, len(records)), max_size=3), label="resume after")
    fast, general = Turn(key), GeneralTurn(key)
    for i, record in enumerate(records):
        fast.apply(record)
        general.apply(record)
        assert msgspec.msgpack.encode(fast.state) == msgspec.msgpack.encode(general.state)
        assert fast._parts == general._parts
        if i in cuts:
            fast = Turn.from_bytes(fast.to_bytes())
            general = GeneralTurn.from_bytes(general.to_bytes())
    assert encode_response(fast.finish()) == encode_response(general.finish())


@PROPERTY
@given(turns())
def test_the_entry_fast_path_decodes_as_the_general_path(entries: list[dict[str, Any]]) -> None:
    # str fields take decode_entry's fast path, the same fields as bytes (as
    # a worker reads them) the general one.
    for entry in entries:
        as_text = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in entry.items()}
        as_bytes = {k.encode(): v.encode() for k, v in as_text.items()}
        general = decode_entry(as_bytes)
        assert decode_entry(as_text) == general
        if as_text.get("kind") == "update":  # the two-field form too
            del as_text["kind"]
            assert decode_entry(as_text) == general

"""Malformed input: a specific DLQ reason and a detail naming the field or
path, never another exception (docs/contract.md §5.3); the same through
``processor merge``; and ``processor schema`` describes what is printed."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import jsonschema
import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.bad_entries import CASES, TEXT, deep, entry, update_json
from support.expectations import scenario_lines, scenario_names, scenario_path

from processor.engine.events import encode_response
from processor.engine.merge import Turn
from processor.engine.offline import merge_lines
from processor.ingest.decode import MAX_DEPTH, EntryError, decode_entry


def refused(fields: dict[Any, Any], **kwargs: Any) -> EntryError:
    with pytest.raises(EntryError) as info:
        decode_entry(fields, **kwargs)
    return info.value


@pytest.mark.parametrize(("fields", "reason", "detail"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_entry_is_refused_with_its_reason(fields: dict[Any, Any], reason: str,
                                              detail: str) -> None:
    error = refused(fields)
    assert (error.reason, detail in error.detail) == (reason, True), error.detail
    assert len(error.detail) < 600, "a detail echoes a bounded prefix, not the payload"


def test_a_refused_entry_still_names_its_turn() -> None:
    # The DLQ entry and the turn's dlq count need the turn of a bad update.
    error = refused(entry(b"[1]", attempt_id=b"a2"))
    assert error.turn == ("r1", "a2")


def test_the_size_limit_is_configurable() -> None:
    assert refused(entry(update_json()), max_entry_bytes=10).reason == "too_large"
    decode_entry(entry(update_json()), max_entry_bytes=1000)


def test_depth_at_the_limit_is_accepted() -> None:
    # result sits at level 4 (update, contents, content, result): MAX_DEPTH - 4
    # more lists reach the limit exactly.
    result = deep(MAX_DEPTH - 4)
    _, record = decode_entry(entry(json.dumps(
        {"contents": [{"type": "function_result", "call_id": "c", "result": result}]})))
    assert record.update is not None and record.update.contents[0].result == result


def test_unknown_fields_and_types_are_kept_not_refused() -> None:
    update = {"contents": [{"type": "x_chart", "series": [1, 2], "data": "raw",
                            "additional_properties": {"k": "v"}}],
              "x_trace": {"span": 1}}
    _, record = decode_entry(entry(json.dumps(update)))
    assert record.update is not None
    (content,) = record.update.contents
    assert content.type == "x_chart"
    assert content.additional_properties == {"series": [1, 2], "data": "raw", "k": "v"}
    assert record.update.additional_properties == {"x_trace": {"span": 1}}


def test_nested_contents_keep_their_unknown_fields_too() -> None:
    update = {"contents": [{"type": "function_result", "call_id": "c", "result": "ok",
                            "items": [{"type": "text", "text": "ok", "x_score": 0.5}]}]}
    _, record = decode_entry(entry(json.dumps(update)))
    assert record.update is not None
    assert record.update.contents[0].items == [
        {"type": "text", "text": "ok", "additional_properties": {"x_score": 0.5}}
    ]


# ---------------------------------------------------------------- fuzzing

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=12,
)
FIELD_NAMES = st.sampled_from(["type", "text", "contents", "role", "message_id", "call_id",
                               "arguments", "result", "items", "usage_details", "function_call",
                               "additional_properties", "response_id", "x_other", "$type",
                               "callId", "details", "messageId", "authorName"])


@st.composite
def mangled_updates(draw: Any) -> Any:
    """A plausible update with random values planted at random places."""
    contents: list[dict[str, Any]] = [dict(TEXT)]
    update: dict[str, Any] = {"contents": contents, "role": "assistant"}
    for _ in range(draw(st.integers(1, 4))):
        target = draw(st.sampled_from(["update", "content", "new content"]))
        if target == "new content":
            contents.append({"type": draw(st.sampled_from(
                ["text", "function_call", "function_result", "usage", "text_reasoning", "odd"]))})
        obj = update if target == "update" else contents[-1]
        obj[draw(FIELD_NAMES)] = draw(JSON)
    return update


def _must_be_storable(fields: dict[Any, Any]) -> None:
    """Decoding either refuses with a reason or gives a record the merge can
    fold, store, resume and publish."""
    try:
        key, record = decode_entry(fields)
    except EntryError as error:
        assert error.reason in {"bad_encoding", "invalid_update", "invalid_entry",
                                "missing_turn_key", "too_large"}
        assert error.detail
        return
    turn = Turn(key)
    turn.apply(record)
    turn = Turn.from_bytes(turn.to_bytes())
    encode_response(turn.finish())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mangled_updates(), st.sampled_from(["json", "msgpack", "object"]))
def test_mangled_updates_never_raise_anything_else(update: Any, enc: str) -> None:
    if enc == "json":
        _must_be_storable(entry(json.dumps(update).encode()))
    elif enc == "msgpack":
        try:
            raw = msgspec.msgpack.encode(update)
        except OverflowError:
            assume(False)  # msgpack cannot carry it: no such entry exists
        _must_be_storable(entry(raw, enc=b"msgpack"))
    else:
        _must_be_storable({"response_id": "r1", "update": update})


@pytest.mark.parametrize("name", ["response_id", "attempt_id", "turn_id", "kind", "enc", "update",
                                  "session_id", "step_id", "error"])
def test_a_lone_surrogate_in_a_str_field_is_bad_encoding_naming_it(name: str) -> None:
    # redis-py with decode_responses, or a caller of the offline path, can hand
    # us str values; "\ud800" cannot be written as UTF-8 anywhere downstream.
    fields: dict[str, Any] = {"response_id": "r1", "update": update_json().decode()}
    if name == "error":
        fields["kind"] = "error"
    if name == "turn_id":
        del fields["response_id"]
    fields[name] = '{"contents": [{"type": "text", "text": "\ud800"}]}' if name == "update" \
        else "a\ud800"
    error = refused(fields)
    assert (error.reason, f"field {name!r}" in error.detail) == ("bad_encoding", True), error.detail


def test_a_lone_surrogate_inside_an_update_object_is_bad_encoding() -> None:
    update = {"contents": [{"type": "text", "text": "x\udc00"}]}
    error = refused({"response_id": "r1", "update": update})
    assert (error.reason, "field 'update'" in error.detail) == ("bad_encoding", True)


# Any text, lone surrogates included (st.text never draws them).
ANY_TEXT = st.lists(st.characters() | st.sampled_from(["\ud800", "\udc00", "\udfff"]),
                    max_size=30).map("".join)
FIELD_VALUES = st.binary(max_size=30) | ANY_TEXT


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["response_id", "turn_id", "attempt_id", "kind", "update", "enc", "error",
                     "code", "step_id", "run_id", "id", "x_other"]),
    FIELD_VALUES, max_size=6))
def test_any_text_or_bytes_field_values_give_a_record_or_an_entry_error(
        fields: dict[str, Any]) -> None:
    _must_be_storable(fields)


@settings(max_examples=100, deadline=None)
@given(ANY_TEXT.map(lambda t: '{"contents": [{"type": "text", "text": "' + t.replace("\\", "")
                  .replace('"', "") + '"}], "message_id": "m"}') | ANY_TEXT)
def test_any_update_text_gives_a_record_or_an_entry_error(text: str) -> None:
    _must_be_storable({"response_id": "r1", "update": text})
    _must_be_storable({"response_id": "r1", "update": text.encode("utf-8", "surrogatepass")})


# A value the update check refuses, for each free-form content field: the
# cheap "nothing to walk" test of a delta must not let any of them through.
_REFUSED_FREE_FORM = {
    "usage_details": {"n": 1 << 70}, "arguments": {"a": deep(MAX_DEPTH)},
    "result": deep(MAX_DEPTH), "items": [{"text": "no type"}], "inputs": [{"text": "no type"}],
    "outputs": deep(MAX_DEPTH), "timeout_ms": 1 << 70, "max_output_length": 1 << 70,
    "actions": [{"a": deep(MAX_DEPTH)}], "screenshot": {"text": "no type"},
    "pending_safety_checks": deep(MAX_DEPTH), "acknowledged_safety_checks": deep(MAX_DEPTH),
    "exit_code": 1 << 70, "output": deep(MAX_DEPTH), "function_call": {"text": "no type"},
    "annotations": deep(MAX_DEPTH), "additional_properties": {"a": deep(MAX_DEPTH)},
}


@pytest.mark.parametrize("name", sorted(_REFUSED_FREE_FORM))
def test_every_free_form_content_field_is_checked(name: str) -> None:
    content = {"type": "text", "text": "hi", name: _REFUSED_FREE_FORM[name]}
    text = json.dumps({"contents": [content], "message_id": "m1"})
    for fields in ({"response_id": "r1", "update": text}, entry(text.encode())):
        error = refused(fields)
        assert error.reason == "invalid_update", error.detail
        assert f"$.update.contents[0].{name}" in error.detail, error.detail


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["response_id", "turn_id", "attempt_id", "kind", "update", "enc", "error",
                     "step_id", "session_id", "id", b"response_id", b"update"]),
    st.binary(max_size=20) | st.text(max_size=20) | JSON, max_size=6))
def test_random_fields_never_raise_anything_else(fields: dict[Any, Any]) -> None:
    _must_be_storable(fields)


# ---------------------------------------------------------------- processor merge


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "processor.cli", *args], input=stdin,
                          capture_output=True, check=False, timeout=60)


def test_processor_merge_reports_bad_lines_and_merges_the_rest() -> None:
    good = scenario_path("seed_two_turns_interleaved").read_bytes().splitlines()
    bad = [
        b'{"response_id": "turn-a", "update": {"contents": "nope"}}',
        b"this is not json",
        b"[1, 2, 3]",
        b'{"response_id": "turn-a", "update": "\xff"}',
        b'{"response_id": "deep", "update": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"update": {"contents": []}}',
        b'{"response_id": "turn-b", "kind": "later"}',
    ]
    lines = [good[0], bad[0], bad[1], good[1], bad[2], good[2], bad[3], bad[4], bad[5], good[3],
             bad[6], *good[4:]]
    run = run_cli("merge", "-", stdin=b"\n".join(lines) + b"\n")
    assert run.returncode == 0, run.stderr
    turns = [json.loads(line) for line in run.stdout.splitlines()]
    assert [(t["response_id"], t["status"]) for t in turns] == [
        ("turn-a", "completed"), ("turn-b", "completed")]
    texts = [t["response"]["messages"][0]["contents"][0]["text"] for t in turns]
    assert texts == ["a1 a2", "b1 b2"]
    dead = [json.loads(line)["dlq"] for line in run.stderr.splitlines()]
    got = [(d["line"], d["reason"]) for d in dead]
    assert got == [(2, "invalid_update"), (3, "bad_encoding"), (5, "invalid_entry"),
                   (7, "bad_encoding"), (8, "invalid_entry"), (9, "missing_turn_key"),
                   (11, "invalid_entry")]
    assert "$.update.contents" in dead[0]["detail"] and dead[0]["response_id"] == "turn-a"
    assert turns[0]["meta"]["counts"]["dlq"] == 1, "turn-a's bad entry is counted on it"


def test_processor_merge_of_a_missing_file_fails_with_one_line() -> None:
    run = run_cli("merge", "/nonexistent/entries.jsonl")
    assert run.returncode != 0
    assert len(run.stderr.decode().strip().splitlines()) == 1


# ---------------------------------------------------------------- processor schema


@pytest.fixture(scope="module")
def schema_doc() -> dict[str, Any]:
    run = run_cli("schema")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    jsonschema.Draft202012Validator.check_schema(doc)
    return doc


def validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({"$defs": doc["$defs"], **doc["properties"][name]})


def test_schema_names_every_wire_shape(schema_doc: dict[str, Any]) -> None:
    assert set(schema_doc["properties"]) >= {
        "entry", "update", "merged_entry", "response", "meta", "events_entry", "event",
        "dlq_entry", "merge_line"}


def test_one_schema_alone_is_valid(schema_doc: dict[str, Any]) -> None:
    run = run_cli("schema", "merge_line")
    assert run.returncode == 0
    alone = json.loads(run.stdout)
    jsonschema.Draft202012Validator.check_schema(alone)
    assert alone["$defs"] == schema_doc["$defs"]


@pytest.mark.parametrize("name", scenario_names())
def test_scenario_outputs_validate_against_the_schemas(schema_doc: dict[str, Any],
                                                       name: str) -> None:
    # In-process: tests/engine/test_scenarios.py proves the CLI prints these bytes.
    line_schema = validator(schema_doc, "merge_line")
    parts = {key: validator(schema_doc, key) for key in ("response", "meta", "event")}
    for turn in merge_lines(scenario_lines(name)).results():
        result = json.loads(msgspec.json.encode(turn))
        line_schema.validate(result)
        parts["response"].validate(result["response"])
        parts["meta"].validate(result["meta"])
        for event in result["events"]:
            parts["event"].validate(event)
    entry_schema, update_schema = validator(schema_doc, "entry"), validator(schema_doc, "update")
    for text in scenario_lines(name):
        fields = json.loads(text)
        if fields.get("kind") == "cancel":
            continue  # offline only, not a stream entry
        if "update" in fields:
            update_schema.validate(fields["update"])
            fields["update"] = json.dumps(fields["update"])  # over Redis it is JSON text
        entry_schema.validate(fields)


def test_schemas_refuse_what_is_not_the_contract(schema_doc: dict[str, Any]) -> None:
    # The schemas must not accept anything: a wrong status and a missing field fail.
    run = run_cli("merge", str(scenario_path("net01_assembles_message")))
    result = json.loads(run.stdout.splitlines()[0])
    line_schema = validator(schema_doc, "merge_line")
    with pytest.raises(jsonschema.ValidationError):
        line_schema.validate({**result, "status": "finished"})
    with pytest.raises(jsonschema.ValidationError):
        line_schema.validate({k: v for k, v in result.items() if k != "response"})


_EVENT_DEFS = {"synthesis.started": "SynthesisStarted", "synthesis.chunk": "SynthesisChunk",
               "step": "Step", "synthesis": "Synthesis"}


@pytest.mark.parametrize("name", ["seed_handoff_two_agents", "net12_idless_reasoning_chunks_fold",
                                  "seed_correlation_ids_kept", "seed_producer_error"])
def test_progress_events_carry_every_field_of_their_schema(schema_doc: dict[str, Any],
                                                           name: str) -> None:
    run = run_cli("merge", "--progress", str(scenario_path(name)))
    assert run.returncode == 0
    event_schema = validator(schema_doc, "event")
    seen = set()
    for line in run.stdout.splitlines():
        events = json.loads(line)["events"]
        assert [e["seq"] for e in events] == list(range(len(events)))
        for event in events:
            event_schema.validate(event)
            fields = schema_doc["$defs"][_EVENT_DEFS[event["type"]]]["properties"]
            # docs/contract.md §5.2: every field of the schema is present (null when unknown).
            assert set(event) == set(fields), (event["type"], set(fields) ^ set(event))
            seen.add(event["type"])
    assert {"synthesis.started", "synthesis", "step"} <= seen


def test_entry_level_ids_stay_on_their_progress_event() -> None:
    run = run_cli("merge", "--progress", str(scenario_path("seed_correlation_ids_kept")))
    (turn,) = [json.loads(line) for line in run.stdout.splitlines()]
    steps = [e for e in turn["events"] if e["type"] == "step"]
    summary = [(s["step"], s["step_id"], s["session_id"]) for s in steps]
    assert summary == [("text", "step-1", "s-1")]
    assert "step_id" not in turn["meta"]["ids"], "an entry-level id is not a turn-level id"
    assert all(e["run_id"] == "run-1" for e in turn["events"])

"""The AG-UI 1.0 projection (``--agui``), offline: every shared scenario's
turns project to runs that the ``ag-ui-protocol`` models and
``ag-ui-validate`` accept and that say what the merged response says, and
the ids and outcomes follow the turn. (tests/worker/test_worker_scenarios.py checks
the same runs as live workers publish them to ``{ns:s}:agui``.)"""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec
import pytest
from ag_ui_validate.pytest_plugin import assert_valid_agui, validate_agui
from support.agui_checks import check_matches_response, check_run, rules_off
from support.expectations import scenario_lines, scenario_names

from processor.engine.agui import entry_fields, project
from processor.engine.offline import merge_lines
from processor.host import config
from processor.wire.ids import TurnKey


def _runs(lines: list[str]) -> list[tuple[list[dict[str, Any]], dict[str, Any], str]]:
    """(AG-UI run, merged response as JSON, status) of each turn of a file."""
    out = []
    for result in merge_lines(lines).results():
        response = json.loads(msgspec.json.encode(result.response))
        # Through JSON, as a subscriber reads them from the stream.
        events = json.loads(json.dumps(project(result.response, result.meta, result.status)))
        out.append((events, response, result.status))
    return out


@pytest.mark.parametrize("name", scenario_names())
def test_every_scenario_projects_to_valid_agui(name: str) -> None:
    runs = _runs(scenario_lines(name))
    assert runs
    for events, response, status in runs:
        check_run(events, response, status)
        check_matches_response(events, response)
    # The stream holds whole runs one after the other: valid as one stream too.
    off: dict[str, str] = {}
    for _events, response, status in runs:
        off.update(rules_off(response, status))
    assert_valid_agui([e for events, _, _ in runs for e in events], severity_overrides=off,
                      max_warnings=0)


def _line(rid: str, update: dict[str, Any] | None = None, **fields: Any) -> str:
    entry: dict[str, Any] = {"response_id": rid, **fields}
    if update is not None:
        entry["update"] = {"type": "agent_response_update", "role": "assistant", **update}
    return json.dumps(entry)


def test_ids_come_from_the_correlation_ids() -> None:
    lines = [_line("r1", {"message_id": "m", "contents": [{"type": "text", "text": "hi"}]},
                   thread_id="th-1", run_id="run-9", session_id="s"),
             _line("r1", kind="end"),
             _line("r2", {"contents": [{"type": "text", "text": "x"}]}, session_id="s-2"),
             _line("r2", kind="end"),
             _line("r3", {"contents": [{"type": "text", "text": "y"}]}, attempt_id="a2"),
             _line("r3", kind="end", attempt_id="a2")]
    starts = [(e[0]["threadId"], e[0]["runId"]) for e, _, _ in _runs(lines)]
    assert starts == [("th-1", "run-9"), ("s-2", "r2:synthesis"), ("r3", "r3:a2:synthesis")]
    for events, _, _ in _runs(lines):
        finished = events[-1]
        assert (finished["threadId"], finished["runId"]) == (events[0]["threadId"],
                                                             events[0]["runId"])
        assert events[0]["protocolVersion"] == "1.0"


def test_outcomes_cancel_error_timeout() -> None:
    text = {"message_id": "m", "contents": [{"type": "text", "text": "partial"}]}
    lines = [_line("c", text), json.dumps({"kind": "cancel", "response_id": "c"}),
             _line("c", text),  # after the cancel: dropped, not in the run
             _line("e", text), _line("e", kind="error", error="model down", code="503"),
             _line("t", text)]  # never ends: turn_timeout
    runs = {response["response_id"]: (events, status) for events, response, status
            in _runs(lines)}
    cancelled, _ = runs["c"]
    assert cancelled[-1]["outcome"] == {"type": "cancelled"}
    assert [e.get("delta") for e in cancelled if e["type"] == "TEXT_MESSAGE_CONTENT"] == [
        "partial"]
    failed, _ = runs["e"]
    assert failed[-1]["type"] == "RUN_ERROR" and failed[-1]["code"] == "producer_error"
    assert "model down" in failed[-1]["message"]
    timed_out, _ = runs["t"]
    assert timed_out[-1]["type"] == "RUN_ERROR" and timed_out[-1]["code"] == "turn_timeout"
    # Partial messages are closed before the terminal event.
    for events, _status in runs.values():
        assert [e["type"] for e in events][-2] == "TEXT_MESSAGE_END"


def test_cancel_while_a_call_streams_closes_it() -> None:
    """Cancelled mid-arguments: the call is closed (START, ARGS, END) before
    RUN_FINISHED(cancelled); its arguments are kept as written."""
    chunk = {"message_id": "m", "contents": [
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Pa'}]}
    lines = [_line("cc", {"message_id": "m", "contents": [{"type": "text", "text": "Let me"}]}),
             _line("cc", chunk), json.dumps({"kind": "cancel", "response_id": "cc"})]
    [(events, response, status)] = _runs(lines)
    assert status == "cancelled"
    assert [e["type"] for e in events] == [
        "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TOOL_CALL_START",
        "TOOL_CALL_ARGS", "TOOL_CALL_END", "TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert events[3]["parentMessageId"] == "m" and events[4]["delta"] == '{"city": "Pa'
    check_run(events, response, status)  # AGUI204 is off for this turn only (agui_checks)
    # ... and it is the only rule this run trips.
    report = validate_agui(events)
    assert {d.rule for d in report.diagnostics if d.severity == "error"} == {"AGUI204"}


def test_usage_reasoning_and_results() -> None:
    lines = [
        _line("u", {"contents": [{"type": "text_reasoning", "text": "hmm"}]}),
        _line("u", {"message_id": "a", "contents": [
            {"type": "function_call", "call_id": "k", "name": "f", "arguments": {"x": 1}}]}),
        _line("u", {"role": "tool", "message_id": "t", "contents": [
            {"type": "function_result", "call_id": "k", "result": {"ok": True}}]}),
        _line("u", {"contents": [{"type": "usage", "usage_details": {
            "input_token_count": 3, "output_token_count": 4, "total_token_count": 7}}]}),
        _line("u", kind="end")]
    [(events, response, status)] = _runs(lines)
    check_run(events, response, status)
    by_type = {e["type"]: e for e in events}
    assert by_type["REASONING_MESSAGE_CONTENT"]["delta"] == "hmm"
    assert by_type["TOOL_CALL_ARGS"]["delta"] == '{"x":1}'
    assert by_type["TOOL_CALL_RESULT"] == {**by_type["TOOL_CALL_RESULT"], "messageId": "t",
                                           "toolCallId": "k", "content": '{"ok":true}'}
    assert by_type["RUN_FINISHED"]["usage"] == [
        {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}]


def test_stream_entries_carry_the_filter_fields() -> None:
    key = TurnKey("r", "a")
    events = [{"type": "RUN_STARTED", "threadId": "t", "runId": "x"}]
    [fields] = entry_fields(key, events)
    flat = dict(zip(fields[::2], fields[1::2], strict=True))
    assert flat == {"type": "RUN_STARTED", "response_id": "r", "synthesis_id": "r:a:synthesis",
                    "attempt_id": "a", "event": json.dumps(events[0], separators=(",", ":"))}


def test_agui_is_off_by_default_and_set_by_flag_or_environment() -> None:
    parser = argparse.ArgumentParser()
    config.add_options(parser)

    def agui(argv: list[str], env: dict[str, str]) -> bool:
        values, problems = config.resolve(parser.parse_args(argv), env)
        assert problems == []
        return config.worker_config(values).agui

    assert not agui([], {})
    assert agui(["--agui"], {})
    assert agui([], {"PROCESSOR_AGUI": "1"})
    assert not agui([], {"PROCESSOR_AGUI": "off"})

"""Checks of AG-UI runs (``--agui``) with the AG-UI project's own tools.

Each run is checked twice, independently of ``processor.engine.agui``:

- every event parses as its ``ag-ui-protocol`` 1.0 pydantic model with no
  unknown field, and serialises back to exactly the dict we wrote;
- the run passes ``ag-ui-validate``'s ``assert_valid_agui`` with no error and
  no warning.

The validator's catalog was written against AG-UI 0.x. Two of its rules are
stricter than AG-UI 1.0 on streams this projection writes, and only there
are they turned off (``rules_off``):

- ``AGUI204`` (arguments must parse as JSON): 1.0 keeps arguments "as
  written because a model can emit arguments that are not valid JSON"
  (``FunctionCall.arguments``) and ``TOOL_CALL_ARGS`` says "the protocol does
  not validate it". A turn cancelled or failed while a call's arguments were
  still streaming has such arguments; they are off only for those turns.
- ``AGUI207`` (a result must answer a call started in the run): in 1.0 the
  result's ``toolCallId`` is "the call being answered", which may have been
  made in an earlier run the frontend already holds. Off only for turns whose
  merged response has a result without its call.

AGUI001 and AGUI005 also predate 1.0 (a 1.0 stream may begin with
RUN_ERROR, and RUN_ERROR may follow RUN_FINISHED), but the projection never
writes either sequence: every run starts with RUN_STARTED and has exactly
one terminal event. They stay on, so a regression there fails.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from ag_ui.core import Event
from ag_ui_validate.pytest_plugin import assert_valid_agui
from pydantic import TypeAdapter

_EVENT = TypeAdapter(Event)



_OPENS = {"TEXT_MESSAGE_START": "messageId", "REASONING_START": "messageId",
          "REASONING_MESSAGE_START": "messageId", "TOOL_CALL_START": "toolCallId"}
_SAME = {"TEXT_MESSAGE_CONTENT": "messageId", "TEXT_MESSAGE_END": "messageId",
         "REASONING_MESSAGE_CONTENT": "messageId", "REASONING_MESSAGE_END": "messageId",
         "REASONING_END": "messageId", "TOOL_CALL_ARGS": "toolCallId",
         "TOOL_CALL_END": "toolCallId", "TOOL_CALL_RESULT": "toolCallId"}


def distinct_reopens(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events with each reopening of an id (a START after its END, which
    AG-UI 1.0 allows and the validator's 0.x catalog does not) under an id of
    its own (``<id>#<n>``), so the validator checks every span strictly."""
    spans: dict[tuple[str, str], int] = {}
    out = []
    for event in events:
        kind = event["type"]
        field = _OPENS.get(kind) or _SAME.get(kind)
        if field is None or field not in event:
            out.append(event)
            continue
        key = (kind.partition("_")[0] + ("_MSG" if "MESSAGE" in kind else ""), event[field])
        if kind in _OPENS:
            spans[key] = spans.get(key, -1) + 1
        n = spans.get(key, 0)
        out.append({**event, field: event[field] if n == 0 else f"{event[field]}#{n}"})
    return out


def check_models(events: list[dict[str, Any]]) -> None:
    """Every event is exactly an AG-UI 1.0 event of its type."""
    for event in events:
        model = _EVENT.validate_python(event)
        assert not model.model_extra, f"fields AG-UI does not define: {model.model_extra}"
        assert model.model_dump(by_alias=True, mode="json") == event, event


def _calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for m in response["messages"] for c in m["contents"] if c["type"] == "function_call"]


def rules_off(response: dict[str, Any], status: str) -> dict[str, str]:
    """The validator rules that predate AG-UI 1.0 and this turn trips (see above)."""
    off: dict[str, str] = {}
    calls = _calls(response)
    called = {c.get("call_id") for c in calls}
    results = [c for m in response["messages"] for c in m["contents"]
               if c["type"] == "function_result"]
    if any(r.get("call_id") not in called for r in results):
        off["AGUI207"] = "off"
    if status != "completed" and any(not _is_json(c.get("arguments")) for c in calls):
        off["AGUI204"] = "off"
    return off


def _is_json(arguments: Any) -> bool:
    if not isinstance(arguments, str) or not arguments:
        return True
    try:
        json.loads(arguments)
    except ValueError:
        return False
    return True


def check_run(events: list[dict[str, Any]], response: dict[str, Any], status: str) -> None:
    """One turn's AG-UI run: models, validator, and the outcome its status says."""
    check_models(events)
    assert_valid_agui(events, severity_overrides=rules_off(response, status), max_warnings=0)
    types = [e["type"] for e in events]
    assert types[0] == "RUN_STARTED" and types.count("RUN_STARTED") == 1, types
    last = events[-1]
    terminal = [t for t in types if t in ("RUN_FINISHED", "RUN_ERROR")]
    assert terminal == [last["type"]], types
    if status == "error":
        assert last["type"] == "RUN_ERROR", types
    else:
        want = "success" if status == "completed" else "cancelled"
        assert last["type"] == "RUN_FINISHED" and last["outcome"] == {"type": want}, last


def check_matches_response(events: list[dict[str, Any]], response: dict[str, Any]) -> None:
    """The run says what the merged response says: each message's text,
    reasoning, calls (name, arguments) and results, in the response's order."""
    text: dict[str, str] = defaultdict(str)
    reasoning: list[str] = []
    calls: list[tuple[str, str, str]] = []
    results: list[tuple[str, str]] = []
    order: list[str] = []
    for event in events:
        kind = event["type"]
        if kind == "TEXT_MESSAGE_START":
            order.append(event["messageId"])
        elif kind == "TEXT_MESSAGE_CONTENT":
            text[event["messageId"]] += event["delta"]
        elif kind == "REASONING_MESSAGE_CONTENT":
            reasoning.append(event["delta"])
        elif kind == "TOOL_CALL_START":
            calls.append((event["toolCallId"], event["toolCallName"], ""))
        elif kind == "TOOL_CALL_ARGS":
            call_id, name, args = calls[-1]
            assert call_id == event["toolCallId"]
            calls[-1] = (call_id, name, args + event["delta"])
        elif kind == "TOOL_CALL_RESULT":
            results.append((event["toolCallId"], event["content"]))
    want_text = {m["message_id"]: "".join(c["text"] for c in m["contents"] if c["type"] == "text")
                 for m in response["messages"]}
    assert order == [mid for mid, t in want_text.items() if t]
    assert dict(text) == {mid: t for mid, t in want_text.items() if t}
    contents = [c for m in response["messages"] for c in m["contents"]]
    assert reasoning == [c["text"] for c in contents if c["type"] == "text_reasoning"
                         and c.get("text")]
    assert [(n, a) for _, n, a in calls] == [
        (c.get("name") or "", _args_text(c.get("arguments"))) for c in _calls(response)]
    assert results == [(c["call_id"], _result_text(c.get("result", c.get("exception"))))
                       for c in contents
                       if c["type"] == "function_result" and c.get("call_id")]


def _args_text(arguments: Any) -> str:
    if arguments is None or isinstance(arguments, str):
        return arguments or ""
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False) if arguments else ""


def _result_text(result: Any) -> str:
    if result is None or isinstance(result, str):
        return result or ""
    return json.dumps(result, separators=(",", ":"), ensure_ascii=False)


def without_timestamps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events minus ``timestamp`` (live and offline runs differ only there)."""
    return [{k: v for k, v in e.items() if k != "timestamp"} for e in events]


async def read_runs(client: Any, streams: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The runs in ``{ns:s}:agui`` streams, by synthesis id. Each turn's run is
    written in one step, so its entries must be contiguous and written once."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for stream in streams:
        previous = None
        for _id, raw in await client.xrange(stream):
            fields = {k.decode(): v.decode() for k, v in raw.items()}
            event = json.loads(fields["event"])
            sid = fields["synthesis_id"]
            assert fields["type"] == event["type"], fields
            if sid != previous:
                assert sid not in runs, f"run {sid} is not contiguous, or written twice"
                runs[sid] = []
                previous = sid
            runs[sid].append(event)
    return runs

"""Interop with Microsoft Agent Framework, Python and .NET shapes.

- Updates made by Agent Framework (``AgentResponseUpdate(...).to_dict()``)
  decode, and every merged response (scenarios, random turns) loads with
  ``AgentResponse.from_dict`` without losing what went in.
- Where Agent Framework's own merge is right (one inner response, every
  update keyed, no message interleaved with another) its messages agree with
  ours.
- .NET-shape updates decode to the same merge as their Python equivalents.
- Unknown content types and fields are kept and the output still loads.
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from agent_framework import AgentResponse, AgentResponseUpdate, Content
from hypothesis import HealthCheck, given, settings
from support.expectations import check_invariants, scenario_lines, scenario_names
from support.merging import merge_entries
from support.strategies import UNKNOWN_TYPE, random_turn, turns

from processor.client import MergedItem
from processor.engine.events import encode_response
from processor.engine.offline import merge_lines
from processor.ingest.decode import decode_entry

PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def lines(entries: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(e) for e in entries]


def merge_one(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The single turn of ``entries`` through ``processor merge``, as JSON."""
    merge = merge_lines(lines(entries))
    assert not merge.dead, merge.dead
    (result,) = merge.results()
    return json.loads(msgspec.json.encode(result))


def entries_of(response_id: str, updates: list[AgentResponseUpdate]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"response_id": response_id, "update": u.to_dict()} for u in updates
    ]
    return [*out, {"response_id": response_id, "kind": "end"}]


def loaded(result: dict[str, Any]) -> AgentResponse:
    return AgentResponse.from_dict(json.loads(json.dumps(result["response"])))


# ---------------------------------------------------------------- Agent Framework updates


def _every_content() -> list[Content]:
    """One of each content kind Agent Framework builds."""
    call = Content.from_function_call("c9", "approve_me", arguments={"x": 1})
    return [
        Content.from_text("plain text"),
        Content.from_text_reasoning(text="why", protected_data="opaque"),
        Content.from_function_call("c1", "get_weather", arguments='{"city": "Paris"}'),
        Content.from_function_result("c1", result={"temp": 21}),
        Content.from_error(message="oops", error_code="E1", error_details="details"),
        Content.from_data(b"\x00\x01binary", "application/octet-stream"),
        Content.from_uri("https://example.com/cat.png", media_type="image/png"),
        Content.from_hosted_file("file-1", media_type="text/csv", name="data.csv"),
        Content.from_hosted_vector_store("vs-1"),
        Content.from_function_approval_request("ap-1", call),
        Content.from_function_approval_response(True, "ap-1", call),
        Content.from_code_interpreter_tool_call(
            call_id="ci-1", inputs=[Content.from_text("print(1)")]),
        Content.from_code_interpreter_tool_result(
            call_id="ci-1", outputs=[Content.from_text("1")]),
        Content.from_image_generation_tool_result(image_id="img-1", outputs={"url": "u"}),
        Content.from_mcp_server_tool_call("mcp-1", "lookup", server_name="srv", arguments="{}"),
        Content.from_mcp_server_tool_result("mcp-1", output=[{"type": "text", "text": "found"}]),
        Content.from_shell_tool_call(call_id="sh-1", commands=["ls"], timeout_ms=1000),
        Content.from_shell_command_output(stdout="a\n", exit_code=0, timed_out=False),
        Content.from_computer_tool_result(
            call_id="pc-1", screenshot=Content.from_uri("https://example.com/s.png")),
        Content.from_oauth_consent_request("https://example.com/consent"),
        Content.from_search_tool_result("s-1", tool_name="web", items=[Content.from_text("hit")]),
    ]


@pytest.mark.parametrize("content", _every_content(), ids=lambda c: c.type)
def test_every_agent_framework_content_survives_the_merge(content: Content) -> None:
    update = AgentResponseUpdate(contents=[content], role="assistant", message_id="m1",
                                 response_id="af-1")
    result = merge_one(entries_of("af-1", [update]))
    check_invariants(result, content.type)
    (message,) = loaded(result).messages
    (back,) = message.contents
    assert back.to_dict() == content.to_dict()


def test_agent_framework_updates_merge_like_agent_framework() -> None:
    updates = [
        AgentResponseUpdate(contents=[Content.from_text_reasoning(text="Let me ")],
                            role="assistant", message_id="m1", author_name="planner",
                            agent_id="a1", response_id="af-2"),
        AgentResponseUpdate(contents=[Content.from_text_reasoning(text="think.")],
                            message_id="m1", response_id="af-2"),
        AgentResponseUpdate(contents=[Content.from_text("Calling ")], message_id="m1",
                            response_id="af-2"),
        AgentResponseUpdate(contents=[Content.from_function_call("c1", "f", arguments='{"a"')],
                            message_id="m1", response_id="af-2"),
        AgentResponseUpdate(contents=[Content.from_function_call("c1", "", arguments=": 1}")],
                            message_id="m1", response_id="af-2"),
        AgentResponseUpdate(contents=[Content.from_function_result("c1", result="one")],
                            role="tool", message_id="m2", response_id="af-2"),
        AgentResponseUpdate(contents=[Content.from_text("Done")], role="assistant",
                            message_id="m3", response_id="af-2", finish_reason="stop"),
        AgentResponseUpdate(contents=[Content.from_usage({"input_token_count": 5,
                                                          "output_token_count": 7})],
                            message_id="m3", response_id="af-2"),
    ]
    ours = loaded(merge_one(entries_of("af-2", updates)))
    theirs = AgentResponse.from_updates(updates)
    assert _summary(ours) == _summary(theirs)
    call = ours.messages[0].contents[2]
    assert (call.call_id, call.name, call.arguments) == ("c1", "f", '{"a": 1}')
    assert ours.usage_details == theirs.usage_details == {"input_token_count": 5,
                                                          "output_token_count": 7}
    assert ours.finish_reason == theirs.finish_reason == "stop"


def test_chunk_details_merge_like_agent_framework() -> None:
    # What later chunks add besides text: reasoning ids and signatures, call
    # status and flags, per-chunk and per-update properties, snapshot
    # ("replace") chunks, and the usage correction a function-calling loop emits.
    def update(*contents: Content, **fields: Any) -> AgentResponseUpdate:
        return AgentResponseUpdate(contents=list(contents), response_id="af-3",
                                   **{"message_id": "m1", **fields})

    updates = [
        update(Content.from_text_reasoning(text="Let"), role="assistant",
               additional_properties={"openai": {"a": 1}, "k": "first"}),
        update(Content.from_text_reasoning(id="rs_1", text=" me")),
        update(Content.from_text_reasoning(text="", protected_data="sig", status="completed"),
               additional_properties={"openai": {"b": 2}, "k": "last"}),
        update(Content.from_text("Answer", additional_properties={"ns": {"a": 1}, "k": 1})),
        update(Content.from_text(" here", additional_properties={"ns": {"b": 2}, "k": 2})),
        update(Content.from_usage({"input_token_count": 5, "output_token_count": 1})),
        update(Content.from_function_call("c1", "f", arguments='{"a": ', id="fc_1")),
        # (Agent Framework only joins chunks that all carry the occurrence id.)
        update(Content.from_function_call("c1", "", arguments="1}", status="completed",
                                          informational_only=True, id="fc_1")),
        update(Content.from_usage({"input_token_count": 7, "output_token_count": 2})),
        update(Content.from_usage({"input_token_count": 12, "output_token_count": 3},
                                  merge_mode="replace")),
        update(Content.from_text("Draft"), message_id="m2"),
        update(Content.from_text("Final", merge_mode="replace"), message_id="m2"),
        update(Content.from_text("gone"), message_id="m3"),
        update(Content.from_text("kept"), message_id="m3", merge_mode="replace"),
        update(Content.from_usage({"output_token_count": 4}), message_id="m3"),
    ]
    ours = loaded(merge_one(entries_of("af-3", updates)))
    theirs = AgentResponse.from_updates(updates)
    assert [[c.to_dict() for c in m.contents] for m in ours.messages] == [
        [c.to_dict() for c in m.contents] for m in theirs.messages]
    assert ours.usage_details == theirs.usage_details == {"input_token_count": 12,
                                                          "output_token_count": 7}
    assert ours.additional_properties == theirs.additional_properties


def _summary(response: AgentResponse) -> list[tuple[Any, ...]]:
    return [
        (m.message_id, m.role, m.author_name, [c.type for c in m.contents], m.text,
         "".join(c.text or "" for c in m.contents if c.type == "text_reasoning"),
         [(c.call_id, c.name, c.arguments) for c in m.contents if c.type == "function_call"],
         [(c.call_id, c.result) for c in m.contents if c.type == "function_result"])
        for m in response.messages
    ]


# ---------------------------------------------------------------- random turns


def _af_updates(entries: list[dict[str, Any]]) -> list[AgentResponseUpdate]:
    """Agent Framework's view of the entries: the decoded updates (unknown
    fields already folded into additional_properties, which it requires)."""
    out = []
    for entry in entries:
        if entry.get("kind", "update") == "update":
            _, record = decode_entry(entry)
            assert record.update is not None
            out.append(AgentResponseUpdate.from_dict(msgspec.to_builtins(record.update)))
    return out


@PROPERTY
@given(turns(agents=1, idless=False, interleave=False, relabel=False))
def test_agrees_with_agent_framework_where_it_is_right(entries: list[dict[str, Any]]) -> None:
    ours = loaded(merge_one(entries))
    theirs = AgentResponse.from_updates(_af_updates(entries))
    assert _summary(ours) == _summary(theirs)
    assert ours.text == theirs.text
    assert ours.finish_reason == theirs.finish_reason
    assert (ours.usage_details or None) == (theirs.usage_details or None)


@PROPERTY
@given(turns())
def test_random_turns_load_in_agent_framework(entries: list[dict[str, Any]]) -> None:
    result = merge_one(entries)
    check_invariants(result, "random turn")
    response = loaded(result)
    # Unknown contents keep their type, their fields in additional_properties.
    unknown = [c for m in response.messages for c in m.contents if c.type == UNKNOWN_TYPE]
    sent = sum(1 for e in entries if UNKNOWN_TYPE in json.dumps(e))
    assert len(unknown) == sent
    assert all("widget" in c.additional_properties for c in unknown)


def test_seeded_turns_load_in_agent_framework() -> None:
    for seed in range(100):
        result = merge_one(random_turn(random.Random(seed), f"load-{seed}"))
        check_invariants(result, f"seed {seed}")


@pytest.mark.parametrize("name", scenario_names())
def test_scenario_responses_load_in_agent_framework(name: str) -> None:
    for result in merge_lines(scenario_lines(name)).results():
        response = loaded(json.loads(msgspec.json.encode(result)))
        assert [m.message_id for m in response.messages] == [
            m.message_id for m in result.response.messages]
        assert response.text == json.loads(msgspec.json.encode(result))["events"][-1]["content"]


# ---------------------------------------------------------------- unknown content


def test_unknown_types_and_fields_are_kept_and_load() -> None:
    update = {
        "type": "agent_response_update", "role": "assistant", "message_id": "m1",
        "x_update_field": {"kept": True},
        "contents": [
            {"type": "text", "text": "hello", "x_confidence": 0.9},
            {"type": "x_chart", "series": [1, 2, 3], "title": "t", "data": "raw"},
            {"type": "function_result", "call_id": "c", "result": "r",
             "items": [{"type": "x_inner", "depth": 2}]},
        ],
    }
    result = merge_one([{"response_id": "unk", "update": update},
                        {"response_id": "unk", "kind": "end"}])
    check_invariants(result, "unknown")
    message = loaded(result).messages[0]
    text, chart, res = message.contents
    assert (text.text, text.additional_properties) == ("hello", {"x_confidence": 0.9})
    assert chart.type == "x_chart"
    assert chart.additional_properties == {"series": [1, 2, 3], "title": "t", "data": "raw"}
    assert res.items[0].type == "x_inner" and res.items[0].additional_properties == {"depth": 2}
    assert result["response"]["additional_properties"] == {"x_update_field": {"kept": True}}


# ---------------------------------------------------------------- .NET shape

_DOTNET_TYPES = {"text": "text", "text_reasoning": "reasoning", "function_call": "functionCall",
                 "function_result": "functionResult", "usage": "usage", "error": "error",
                 "hosted_file": "hostedFile", "uri": "uri"}
_DOTNET_USAGE = {"input_token_count": "inputTokenCount", "output_token_count": "outputTokenCount",
                 "total_token_count": "totalTokenCount",
                 "cache_read_input_token_count": "cachedInputTokenCount",
                 "reasoning_output_token_count": "reasoningTokenCount"}
_DOTNET_FIELDS = {"error_details": "details"}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def to_dotnet(update: dict[str, Any]) -> dict[str, Any]:
    """What System.Text.Json (web defaults) writes for the same update."""
    out: dict[str, Any] = {}
    for key, value in update.items():
        if key == "type":
            continue  # .NET's AgentResponseUpdate has no discriminator
        out[camel(key)] = [_dotnet_content(c) for c in value] if key == "contents" else value
    return out


def _dotnet_content(content: dict[str, Any]) -> dict[str, Any]:
    kind = content["type"]
    out: dict[str, Any] = {"$type": _DOTNET_TYPES.get(kind, kind)}
    for key, value in content.items():
        if key == "type":
            continue
        if key == "usage_details":
            details = {_DOTNET_USAGE[k]: v for k, v in value.items() if k in _DOTNET_USAGE}
            extra = {k: v for k, v in value.items() if k not in _DOTNET_USAGE}
            out["details"] = {**details, "additionalCounts": extra}
        else:
            out[_DOTNET_FIELDS.get(key, camel(key))] = value
    return out


def _dotnet_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "update": to_dotnet(e["update"])} if "update" in e else e for e in entries]


def _response_of(entries: list[dict[str, Any]]) -> str:
    return encode_response(merge_entries(entries))


@PROPERTY
@given(turns())
def test_dotnet_shape_merges_like_the_python_shape(entries: list[dict[str, Any]]) -> None:
    assert _response_of(_dotnet_entries(entries)) == _response_of(entries)


def test_dotnet_names_map_to_python_names() -> None:
    python = {"type": "agent_response_update", "role": "assistant", "author_name": "bob",
              "agent_id": "a", "response_id": "inner", "message_id": "m",
              "created_at": "2026-01-01T00:00:00+00:00", "finish_reason": "stop",
              "additional_properties": {"k": "v"},
              "contents": [
                  {"type": "text_reasoning", "text": "hm", "protected_data": "p"},
                  {"type": "text", "text": "hi", "additional_properties": {"x": 1}},
                  {"type": "function_call", "call_id": "c", "name": "f",
                   "arguments": {"city": "Paris"}},
                  {"type": "function_result", "call_id": "c", "result": {"t": 1}},
                  {"type": "error", "message": "m", "error_code": "E", "error_details": "d"},
                  {"type": "hosted_file", "file_id": "f1"},
                  {"type": "usage", "usage_details": {
                      "input_token_count": 1, "output_token_count": 2, "total_token_count": 3,
                      "cache_read_input_token_count": 4, "reasoning_output_token_count": 5,
                      "audio_tokens": 6}},
              ]}
    dotnet = to_dotnet(python)
    assert dotnet["contents"][0]["$type"] == "reasoning"
    assert dotnet["contents"][6]["details"]["additionalCounts"] == {"audio_tokens": 6}
    entries = [{"response_id": "net", "update": python}, {"response_id": "net", "kind": "end"}]
    assert _response_of(_dotnet_entries(entries)) == _response_of(entries)
    response = json.loads(_response_of(_dotnet_entries(entries)))
    assert response["usage_details"]["cache_read_input_token_count"] == 4
    assert response["messages"][0]["author_name"] == "bob"


def test_dotnet_continuation_token_and_role_object_decode() -> None:
    # ResponseContinuationToken is written as a base64 string; ChatRole can be
    # written as {"value": ...} by custom options.
    dotnet = {"role": {"value": "assistant"}, "messageId": "m", "continuationToken": "AQIDBAU=",
              "contents": [{"$type": "text", "text": "hi"}]}
    _, record = decode_entry({"response_id": "net", "update": json.dumps(dotnet)})
    assert record.update is not None
    assert (record.update.role, record.update.message_id) == ("assistant", "m")
    assert record.update.continuation_token == {"token": "AQIDBAU="}


@PROPERTY
@given(turns())
def test_merged_text_is_agent_frameworks_text(entries: list[dict[str, Any]]) -> None:
    """``MergedItem.text`` (no agent-framework needed) is ``AgentResponse.text``."""
    merged = merge_one(entries)
    item = MergedItem("s", "1-0", merged["response_id"], merged["status"], merged["response"], {})
    assert item.text == item.agent_response().text

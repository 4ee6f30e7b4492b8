"""Checks of merged turns against the scenarios and the contract's invariants.

Reusable: the offline tests and the live-worker tests hand these functions
the same thing, one turn's result as a plain JSON dict shaped like a
``processor merge`` line: ``{"response_id", "attempt_id", "status",
"response", "meta", "events"}``. Every check raises ``AssertionError`` with
the scenario/turn named, so a failure says what broke where.

- ``check_expected_turn``: one turn of a ``NAME.expect.json`` (only the
  keys the expectation names are compared, as scenarios/README.md says).
- ``check_invariants``: what every turn must satisfy (unique message ids,
  event sequence, the response loads in Agent Framework).

``delta_oracle.check_deltas`` checks the turns of ``support.strategies``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from processor.wire.ids import response_id_for_turn

SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "scenarios"


# ---------------------------------------------------------------- scenarios


def scenario_names() -> list[str]:
    """Every scenario in the project's own test data, sorted."""
    return sorted(p.name.removesuffix(".jsonl") for p in SCENARIOS.glob("*.jsonl"))


def scenario_path(name: str) -> Path:
    return SCENARIOS / f"{name}.jsonl"


def scenario_lines(name: str) -> list[str]:
    return scenario_path(name).read_text(encoding="utf-8").splitlines()


def scenario_expect(name: str) -> dict[str, Any]:
    return json.loads((SCENARIOS / f"{name}.expect.json").read_text(encoding="utf-8"))


def expected_key(turn: dict[str, Any]) -> tuple[str, str | None]:
    """``(response_id, attempt_id)`` of an expected turn (ResponseId assigned
    from ``turn_id`` when the expectation names only that)."""
    response_id = turn.get("response_id") or response_id_for_turn(turn["turn_id"])
    return response_id, turn.get("attempt_id")


def check_scenario(name: str, results: list[dict[str, Any]]) -> None:
    """All turns of a scenario: exactly the expected turns, each as expected."""
    expect = scenario_expect(name)["turns"]
    got = {(r["response_id"], r.get("attempt_id")): r for r in results}
    assert len(got) == len(results), f"{name}: a turn was published twice"
    want = [expected_key(t) for t in expect]
    assert sorted(got, key=str) == sorted(want, key=str), f"{name}: turns {list(got)} != {want}"
    for turn in expect:
        result = got[expected_key(turn)]
        where = f"{name}/{expected_key(turn)[0]}"
        check_invariants(result, where)
        check_expected_turn(result, turn, where)


# ---------------------------------------------------------------- expectations


def text_of(message: dict[str, Any], kind: str = "text") -> str:
    """The concatenated ``text`` of a message's contents of one type."""
    return "".join(c.get("text") or "" for c in message["contents"] if c["type"] == kind)


def _json_or_raw(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "call_id": c.get("call_id"),
            "name": c.get("name"),
            "arguments": _json_or_raw(c.get("arguments")),
        }
        for c in message["contents"]
        if c["type"] == "function_call"
    ]


def check_expected_message(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    """Compare only the keys the expectation names (scenarios/README.md)."""
    for key, value in want.items():
        if key == "text":
            actual: Any = text_of(got, "text")
        elif key == "reasoning":
            actual = text_of(got, "text_reasoning")
        elif key == "content_types":
            actual = [c["type"] for c in got["contents"]]
        elif key == "calls":
            actual = _calls(got)
            value = [{**c, "arguments": _json_or_raw(c.get("arguments"))} for c in value]
        else:
            actual = got.get(key)
        assert actual == value, f"{where}: {key} is {actual!r}, expected {value!r}"


def check_expected_turn(result: dict[str, Any], want: dict[str, Any], where: str) -> None:
    """One expected turn: status, messages in order, turn-level keys."""
    response, meta = result["response"], result["meta"]
    assert result["status"] == want["status"], f"{where}: status {result['status']}"
    if "turn_id" in want:
        assert meta["ids"].get("turn_id") == want["turn_id"], f"{where}: turn_id"
    if want.get("attempt_id"):
        assert result["attempt_id"] == want["attempt_id"], f"{where}: attempt_id"
    messages = response["messages"]
    if "messages" in want:
        summary = [(m.get("message_id"), m["role"], text_of(m)) for m in messages]
        assert len(messages) == len(want["messages"]), f"{where}: messages {summary}"
        for i, (got, exp) in enumerate(zip(messages, want["messages"], strict=True)):
            check_expected_message(got, exp, f"{where} message[{i}]")
    if "finish_reason" in want:
        assert response.get("finish_reason") == want["finish_reason"], f"{where}: finish_reason"
    for name, count in want.get("usage", {}).items():
        usage = response.get("usage_details") or {}
        assert usage.get(name) == count, f"{where}: usage {name} = {usage.get(name)}, want {count}"
    if "error_code" in want:
        error = result["events"][-1].get("error") or {}
        assert error.get("code") == want["error_code"], f"{where}: error {error}"
    for name, value in want.get("ids", {}).items():
        assert meta["ids"].get(name) == value, f"{where}: meta.ids[{name!r}] = {meta['ids']}"
    if "dropped_min" in want:
        dropped = meta["counts"]["dropped"]
        assert dropped >= want["dropped_min"], f"{where}: dropped {dropped}"


# ---------------------------------------------------------------- invariants


def check_invariants(result: dict[str, Any], where: str = "turn") -> None:
    """The contract's invariants for one published turn (scenarios/README.md)."""
    response = result["response"]
    assert response["response_id"] == result["response_id"], f"{where}: response_id"
    ids = [m.get("message_id") for m in response["messages"]]
    assert all(ids), f"{where}: a message without message_id: {ids}"
    assert len(set(ids)) == len(ids), f"{where}: duplicate message ids {ids}"
    assert all(m["contents"] for m in response["messages"]), f"{where}: an empty message"
    _check_events(result, where)
    _check_loads(response, where)


def _check_events(result: dict[str, Any], where: str) -> None:
    events = result["events"]
    types = [e["type"] for e in events]
    assert types.count("synthesis.started") == 1, f"{where}: events {types}"
    assert types.count("synthesis") == 1, f"{where}: events {types}"
    assert types[0] == "synthesis.started" and types[-1] == "synthesis", f"{where}: {types}"
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(len(events))), f"{where}: seq not gap-free from 0: {seqs}"
    synthesis_id = events[0]["synthesis_id"]
    for event in events:
        assert event["synthesis_id"] == synthesis_id, f"{where}: mixed synthesis ids"
        assert event["response_id"] == result["response_id"], f"{where}: event response_id"
    terminal = events[-1]
    assert terminal["status"] == result["status"], f"{where}: terminal status"
    assert (terminal.get("error") is not None) == (result["status"] == "error"), f"{where}: error"


def _check_loads(response: dict[str, Any], where: str) -> None:
    from agent_framework import AgentResponse

    loaded = AgentResponse.from_dict(json.loads(json.dumps(response)))
    assert len(loaded.messages) == len(response["messages"]), f"{where}: messages lost on load"
    assert loaded.response_id == response["response_id"], f"{where}: response_id lost on load"
    for got, want in zip(loaded.messages, response["messages"], strict=True):
        assert got.message_id == want["message_id"], f"{where}: message_id lost on load"
        assert [c.type for c in got.contents] == [c["type"] for c in want["contents"]], where

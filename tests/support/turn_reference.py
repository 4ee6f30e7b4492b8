"""Test turns and their reference results, for the live-worker tests.

Entries are dicts as a test writes them (``update`` as an object or JSON
text); ``entry_fields`` gives the stream fields a producer XADDs and
``entry_line`` the ``processor merge`` line of the same values.
``offline_results`` is ``processor merge`` of the entries, and
``compare_with_offline`` the check every live test ends with: each turn
merged once, byte-identical to the offline merge, with its events in order.
``Outputs`` is what ``worker_harness.Harness`` reads back.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from processor.engine.events import encode_response
from processor.engine.lifecycle import Limits
from processor.engine.offline import merge_lines
from processor.wire.ids import TurnKey

# --------------------------------------------------------------------------- entries


def entry_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """A test entry dict -> the stream fields a producer XADDs (``update`` as JSON text)."""
    out: dict[str, Any] = {}
    for name, value in entry.items():
        if name == "id":
            continue
        if name == "update" and not isinstance(value, str | bytes):
            value = json.dumps(value)
        out[name] = value
    return out


def as_read(entries: list[tuple[Any, dict[Any, Any]]]) -> list[list[Any]]:
    """``(id, {name: value})`` entries as a worker holding turns reads them
    (``connections.read_raw``): ``[id, [name, value, ...]]``."""
    return [[entry_id, [x for pair in fields.items() for x in pair]]
            for entry_id, fields in entries]


def entry_line(entry: dict[str, Any]) -> str:
    """The ``processor merge`` line of a test entry: the very field values a
    producer XADDs (``update`` as the same JSON text), so that sizes and
    limits are counted alike offline and live."""
    return json.dumps({**entry_fields(entry), **({"id": entry["id"]} if "id" in entry else {})})


def routing_id(entry: dict[str, Any]) -> str:
    """What a producer computes the shard from: ``response_id``, else ``turn_id``."""
    value = entry.get("response_id") or entry.get("turn_id") or ""
    return value.decode() if isinstance(value, bytes) else str(value)


def interleave(turns: list[list[dict[str, Any]]], rng: Any) -> list[dict[str, Any]]:
    """All entries of ``turns`` in one random arrival order that keeps each
    turn's own order (as concurrent producers would write them)."""
    cursors = [0] * len(turns)
    live = [i for i, t in enumerate(turns) if t]
    out: list[dict[str, Any]] = []
    while live:
        k = rng.randrange(len(live))
        i = live[k]
        out.append(turns[i][cursors[i]])
        cursors[i] += 1
        if cursors[i] == len(turns[i]):
            live[k] = live[-1]
            live.pop()
    return out


# --------------------------------------------------------------------------- results


@dataclass
class TurnOutput:
    """What the workers published for one turn."""

    key: TurnKey
    merged: list[dict[str, str]] = field(default_factory=list)  # every merged entry (want 1)
    events: list[dict[str, Any]] = field(default_factory=list)  # in stream order

    @property
    def response(self) -> str:
        """The ``response`` field, byte for byte (the first merged entry)."""
        return self.merged[0]["response"]

    def result(self) -> dict[str, Any]:
        """The turn as a ``processor merge`` line (for tests/support/expectations.py)."""
        entry = self.merged[0]
        return {
            "response_id": entry["response_id"],
            "attempt_id": entry.get("attempt_id"),
            "status": entry["status"],
            "response": json.loads(entry["response"]),
            "meta": json.loads(entry["meta"]),
            "events": self.events,
        }


@dataclass
class Outputs:
    """Everything published on a namespace."""

    turns: dict[TurnKey, TurnOutput]
    dlq: list[dict[str, str]]
    merged_count: int
    events_count: int

    def terminal_counts(self) -> Counter[TurnKey]:
        return Counter({k: sum(e["type"] == "synthesis" for e in t.events)
                        for k, t in self.turns.items()})


def offline_dead(
    entries: Iterable[dict[str, Any]], limits: Limits | None = None
) -> list[tuple[int, str, str]]:
    """What ``processor merge`` dead-letters: (entry index, reason, detail)."""
    merge = merge_lines([entry_line(e) for e in entries], limits=limits)
    return [(d.line - 1, d.reason, d.detail) for d in merge.dead]


@dataclass
class OfflineTurn:
    key: TurnKey
    status: str
    response: str  # encode_response(): what the worker publishes
    line: dict[str, Any]  # the whole processor merge line, parsed


def offline_results(
    entries: Iterable[dict[str, Any]], limits: Limits | None = None, progress: bool = False
) -> dict[TurnKey, OfflineTurn]:
    """``processor merge`` of the entries (file order = arrival order)."""
    merge = merge_lines([entry_line(e) for e in entries], limits=limits, progress=progress)
    out: dict[TurnKey, OfflineTurn] = {}
    for result in merge.results():
        key = TurnKey(result.response_id, result.attempt_id or "")
        line = json.loads(msgspec.json.encode(result))
        out[key] = OfflineTurn(key, result.status, encode_response(result.response), line)
    return out


# --------------------------------------------------------------------------- comparisons


def compare_with_offline(
    outputs: Outputs, offline: dict[TurnKey, OfflineTurn], where: str = ""
) -> None:
    """Every offline turn merged live exactly once, with the same status and
    byte-identical ``response``; one terminal event per turn, last."""
    missing = [k for k in offline if k not in outputs.turns or not outputs.turns[k].merged]
    assert not missing, f"{where}: turns never merged live: {missing[:5]} ({len(missing)})"
    extra = [k for k, t in outputs.turns.items() if k not in offline and t.merged]
    assert not extra, f"{where}: turns merged live but not offline: {extra[:5]}"
    for key, want in offline.items():
        got = outputs.turns[key]
        assert len(got.merged) == 1, f"{where}: {key} merged {len(got.merged)} times"
        assert got.merged[0]["status"] == want.status, (
            f"{where}: {key} status {got.merged[0]['status']} != offline {want.status}")
        assert got.response == want.response, (
            f"{where}: {key} response differs from processor merge\n"
            f"live:    {got.response}\noffline: {want.response}")
        types = [e["type"] for e in got.events]
        assert types.count("synthesis") == 1, f"{where}: {key} terminal events: {types}"
        assert types[-1] == "synthesis", f"{where}: {key} terminal not last: {types}"
        assert types.count("synthesis.started") == 1 and types[0] == "synthesis.started", (
            f"{where}: {key} events {types}")
        seqs = [e["seq"] for e in got.events]
        assert seqs == list(range(len(seqs))), f"{where}: {key} seq {seqs}"


# --------------------------------------------------------------------------- turns


def text_delta(response_id: str, text: str) -> dict[str, Any]:
    """One assistant text delta of ``response_id`` (message ``m``)."""
    return {"response_id": response_id, "update": {
        "type": "agent_response_update", "role": "assistant", "message_id": "m",
        "contents": [{"type": "text", "text": text}]}}


def end_entry(response_id: str) -> dict[str, Any]:
    return {"response_id": response_id, "kind": "end"}


def response_text(outputs: Outputs, response_id: str) -> str:
    """The text of a published turn's merged response, all messages joined."""
    response = json.loads(outputs.turns[TurnKey(response_id)].response)
    return "".join(c["text"] for m in response["messages"] for c in m["contents"]
                   if c.get("type") == "text")


def simple_turn(response_id: str, updates: int) -> list[dict[str, Any]]:
    """A plain turn of ``updates`` text deltas over two messages, then its end."""
    out: list[dict[str, Any]] = []
    for i in range(updates):
        update = {"type": "agent_response_update", "role": "assistant",
                  "message_id": f"m{i % 2}", "contents": [{"type": "text", "text": f"d{i} "}]}
        out.append({"response_id": response_id, "update": update})
    out.append({"response_id": response_id, "kind": "end"})
    return out


def stream_fields(entry: dict[str, Any]) -> dict[bytes, bytes]:
    """A test entry as XREADGROUP returns it (bytes names and values),
    without ``kind=update`` (its default: most producers leave it out)."""
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode()
            for k, v in entry_fields(entry).items() if (k, v) != ("kind", "update")}


def delta(text: str, message_id: str = "m1") -> str:
    return json.dumps({"contents": [{"type": "text", "text": text}], "message_id": message_id,
                       "role": "assistant"})

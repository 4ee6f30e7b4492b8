"""Building the outputs of a turn: events (5.2), the merged entry (5.1), meta.

Pure functions of the turn, its records and the outcome. ``seq`` and ``ts``
are given by the caller: offline they count up in process, in the worker a
Lua script assigns them atomically with the publish.
"""

from __future__ import annotations

from typing import Any

import msgspec

from processor.engine.merge import merged_text
from processor.wire.ids import TurnKey
from processor.wire.models import TURN_IDS, Content, Record
from processor.wire.outputs import (
    Agent,
    Counts,
    ErrorInfo,
    Event,
    MergedEntry,
    Meta,
    Response,
    Status,
    Step,
    StepKind,
    Synthesis,
    SynthesisChunk,
    SynthesisStarted,
)

_STEP_OF: dict[str, StepKind] = {
    "text_reasoning": "thinking",
    "function_call": "tool_call",
    "function_result": "tool_result",
    "text": "text",
}
_json = msgspec.json.Encoder()


class Outcome(msgspec.Struct, frozen=True):
    """How a turn ended: the status and, for errors, the code and message;
    for a cancel, its reason (None when its key had none)."""

    status: Status
    error: ErrorInfo | None = None
    cancel_reason: str | None = None  # a cancel's, as processor.wire.cancels.reason_of made it

    @classmethod
    def completed(cls) -> Outcome:
        return cls("completed")

    @classmethod
    def cancelled(cls, reason: str | None = None) -> Outcome:
        return cls("cancelled", cancel_reason=reason)

    @classmethod
    def failed(cls, code: str, message: str) -> Outcome:
        return cls("error", ErrorInfo(code, message))


def producer_error(record: Record) -> Outcome:
    """The outcome of a ``kind=error`` entry."""
    message = record.error or "the producer reported an error"
    if record.code:
        message = f"{message} (code {record.code})"
    return Outcome.failed("producer_error", message)


def turn_ids(key: TurnKey, ids: dict[str, str]) -> dict[str, Any]:
    """The turn-level correlation ids every event carries (all present)."""
    out: dict[str, Any] = {name: ids.get(name) for name in TURN_IDS}
    out["attempt_id"] = key.attempt_id or None
    return out


def _base(key: TurnKey, ids: dict[str, str], seq: int, ts: int) -> dict[str, Any]:
    return {
        "synthesis_id": key.synthesis_id(),
        "response_id": key.response_id,
        "seq": seq,
        "ts": ts,
        **turn_ids(key, ids),
    }


#: ``synthesis.started`` with every turn-level id null: a turn's is a copy
#: (``msgspec.structs.replace`` of a few fields costs a fraction of building
#: the Struct from keywords, and the stored path builds one per turn per call).
_STARTED = SynthesisStarted(synthesis_id="", response_id="", seq=0, ts=0)


def started(key: TurnKey, ids: dict[str, str], ts: int) -> SynthesisStarted:
    """``synthesis.started`` (always ``seq = 0``)."""
    if ids:
        return SynthesisStarted(**_base(key, ids, 0, ts))
    return msgspec.structs.replace(_STARTED, synthesis_id=key.synthesis_id(),
                                   response_id=key.response_id, ts=ts,
                                   attempt_id=key.attempt_id or None)


def progress(key: TurnKey, ids: dict[str, str], record: Record, ts: int) -> list[Event]:
    """The progress events of one update entry: a ``step`` for what the agent
    is doing and a ``synthesis.chunk`` for its text. ``seq`` is left at 0."""
    update = record.update
    if update is None:
        return []
    base = _base(key, ids, 0, ts)
    events: list[Event] = []
    step = _step(update.contents)
    if step is not None:
        kind, content, data = step
        events.append(
            Step(
                **base,
                agent_id=update.agent_id,
                agent_name=update.author_name,
                step=kind,
                content=content,
                step_data=data,
                step_id=record.ids.get("step_id"),
                tool_call_id=record.ids.get("tool_call_id"),
                action_id=record.ids.get("action_id"),
                evidence_id=record.ids.get("evidence_id"),
            )
        )
    delta = "".join(c.text or "" for c in update.contents if c.type == "text")
    if delta:
        events.append(
            SynthesisChunk(
                **base,
                message_id=update.message_id,
                agent_id=update.agent_id,
                author_name=update.author_name,
                delta=delta,
            )
        )
    return events


def _step(contents: list[Content]) -> tuple[StepKind, str, dict[str, Any]] | None:
    """The step an update shows: the kind of its first mergeable content."""
    for content in contents:
        kind = _STEP_OF.get(content.type)
        if kind is None:
            continue
        same = [c for c in contents if c.type == content.type]
        if kind in ("thinking", "text"):
            return kind, "".join(c.text or "" for c in same), {}
        if kind == "tool_call":
            calls = [{"call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in same]
            text = ", ".join(c.name or "" for c in same if c.name)
            return kind, text, {"calls": calls}
        results = [{"call_id": c.call_id, "result": c.result} for c in same]
        return kind, _as_text(same[0].result), {"results": results}
    return None


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return _json.encode(value).decode() if value is not None else ""


def agents(response: Response) -> list[Agent]:
    """The agents that spoke, in first-seen order."""
    seen: list[Agent] = []
    for message in response.messages:
        if message.role != "assistant":
            continue
        agent = Agent(message.additional_properties.get("agent_id"), message.author_name)
        if (agent.agent_id or agent.author_name) and agent not in seen:
            seen.append(agent)
    return seen


def terminal(
    key: TurnKey,
    ids: dict[str, str],
    outcome: Outcome,
    response: Response,
    counts: Counts,
    seq: int,
    ts: int,
) -> Synthesis:
    """The terminal ``synthesis`` event."""
    return Synthesis(
        **_base(key, ids, seq, ts),
        status=outcome.status,
        content=merged_text(response),
        counts=counts,
        agents=agents(response),
        error=outcome.error,
        cancel_reason=outcome.cancel_reason,
    )


def merged_entry(key: TurnKey, outcome: Outcome, response: Response, meta: Meta) -> MergedEntry:
    """The fields of the turn's ``merged`` stream entry."""
    return MergedEntry(
        response_id=key.response_id,
        synthesis_id=key.synthesis_id(),
        status=outcome.status,
        response=encode_response(response),
        meta=_json.encode(meta).decode(),
        attempt_id=key.attempt_id or None,
    )


def encode_response(response: Response) -> str:
    """The canonical JSON text of a merged response (what "byte-identical" means)."""
    return _json.encode(response).decode()


def encode_event(event: Event) -> bytes:
    return _json.encode(event)


def struct_fields(struct: msgspec.Struct) -> list[str]:
    """A flat field/value list of a Struct's set fields, for XADD."""
    out: list[str] = []
    for name, value in msgspec.structs.asdict(struct).items():
        if value is not None:
            out += [name, value]
    return out


def event_fields(key: TurnKey, event: Event) -> list[str]:
    """The fields of an ``events`` stream entry; the event JSON comes last."""
    fields = ["type", event_type(event), "response_id", key.response_id, "synthesis_id",
              key.synthesis_id()]
    if key.attempt_id:
        fields += ["attempt_id", key.attempt_id]
    return [*fields, "event", encode_event(event).decode()]


def event_type(event: Event) -> str:
    """The ``type`` tag of an event Struct."""
    return str(type(event).__struct_config__.tag)

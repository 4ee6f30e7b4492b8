"""The wire schema of the outputs: msgspec Structs for what the worker
writes (docs/contract.md §5.1 to 5.3: the merged response, its events, the
entries of the merged, events and DLQ streams). Field order here is the
field order on the wire.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from processor.wire.cancels import REASON_BYTES
from processor.wire.models import Content


class Message(msgspec.Struct, omit_defaults=True, tag="message", tag_field="type"):
    """One merged message, ``agent_framework.Message.to_dict()`` shape.

    ``type`` is the tag, so it is always written (``omit_defaults`` would drop it).
    """

    role: str
    contents: list[Content]
    author_name: str | None = None
    message_id: str | None = None
    additional_properties: dict[str, Any] = msgspec.field(default_factory=dict)


class Response(msgspec.Struct, omit_defaults=True, tag="agent_response", tag_field="type"):
    """The merged ``AgentResponse`` (``AgentResponse.to_dict()`` shape)."""

    messages: list[Message]
    response_id: str
    agent_id: str | None = None
    finish_reason: str | None = None
    usage_details: dict[str, int] | None = None
    additional_properties: dict[str, Any] = msgspec.field(default_factory=dict)


Status = Literal["completed", "error", "cancelled"]


class Counts(msgspec.Struct):
    """How a turn's input entries were accounted for (docs/contract.md §4.7)."""

    entries: int = 0
    updates: int = 0
    dropped: int = 0
    dlq: int = 0
    messages: int = 0
    # Numbered entries (docs/contract.md §3.4): repeats of a number already
    # merged, dropped; and numbers below the highest one merged that never
    # reached the merge (a gap), so the turn is missing at least that many.
    duplicates: int = 0
    missing: int = 0


#: A cancel's reason as the outputs carry it: at most 1,024 characters
#: (processor.wire.cancels.reason_of: the first 1 KiB of the key's value).
CancelReason = Annotated[str, msgspec.Meta(max_length=REASON_BYTES)]


class ErrorInfo(msgspec.Struct):
    code: str
    message: str


class Meta(msgspec.Struct):
    """The ``meta`` field of a ``merged`` entry."""

    response_id: str
    attempt_id: str | None
    synthesis_id: str
    ids: dict[str, str]
    counts: Counts
    first_entry_id: str | None
    last_entry_id: str | None
    started_ms: int | None
    finished_ms: int | None
    error: ErrorInfo | None = None
    #: A cancelled turn's reason (its cancel key's value, at most 1 KiB of it
    #: read: docs/contract.md §6); null for any other turn, or a cancel key
    #: that had no value left to read.
    cancel_reason: CancelReason | None = None


class Agent(msgspec.Struct):
    """One agent that spoke in a turn, in first-seen order."""

    agent_id: str | None
    author_name: str | None


class _EventBase(msgspec.Struct, tag_field="type", kw_only=True):
    """Fields every event carries (docs/contract.md §5.2). All are always present."""

    synthesis_id: str
    response_id: str
    seq: int
    ts: int
    runtime_id: str | None = None
    session_id: str | None = None
    thread_id: str | None = None
    turn_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    attempt_id: str | None = None


class SynthesisStarted(_EventBase, tag="synthesis.started", kw_only=True):
    """Exactly once per turn, ``seq = 0``."""


class SynthesisChunk(_EventBase, tag="synthesis.chunk", kw_only=True):
    """A text delta of one message (live progress, ``processor.engine.live``):
    appended to what the message's earlier chunks said, or, with
    ``replace``, its whole text so far (the merge rewrote it).

    ``role`` and ``previous_message_id`` place the message as the merged
    response does: its role there, and the id of the message just before it
    (None: it is the first). Both None on the empty ``replace`` chunk of a
    message no longer in the merge, and on ``processor merge --progress``'s
    chunks (one per entry, not the merge's). The same on every live event
    of a message (reasoning, call and result events)."""

    message_id: str | None
    agent_id: str | None
    author_name: str | None
    delta: str
    replace: bool = False
    role: str | None = None
    previous_message_id: str | None = None


class ReasoningChunk(_EventBase, tag="reasoning.chunk", kw_only=True):
    """A reasoning delta of one message, as ``SynthesisChunk`` for text."""

    message_id: str
    agent_id: str | None
    author_name: str | None
    delta: str
    replace: bool = False
    role: str | None = None
    previous_message_id: str | None = None


class ToolCallChunk(_EventBase, tag="tool_call.chunk", kw_only=True):
    """An arguments delta of one function call (the ``index``-th call of its
    message), as ``SynthesisChunk`` for text; arguments that are not
    text come whole, as JSON, with ``replace``."""

    message_id: str
    index: int
    call_id: str | None
    name: str | None
    agent_id: str | None
    author_name: str | None
    delta: str
    replace: bool = False
    role: str | None = None
    previous_message_id: str | None = None


class ToolResult(_EventBase, tag="tool_result", kw_only=True):
    """A function result of one message (the ``index``-th result there),
    when it appears or changes."""

    message_id: str
    index: int
    call_id: str | None
    agent_id: str | None
    author_name: str | None
    result: Any
    role: str | None = None
    previous_message_id: str | None = None


StepKind = Literal["thinking", "tool_call", "tool_result", "text"]


class Step(_EventBase, tag="step", kw_only=True):
    """What an agent is doing: offline (``processor merge --progress``) one
    per update entry; live, one each time the turn's latest activity moves
    to another message or kind of content (``step_data.message_id``)."""

    agent_id: str | None
    agent_name: str | None
    step: StepKind
    content: str
    step_data: dict[str, Any]
    step_id: str | None
    tool_call_id: str | None
    action_id: str | None
    evidence_id: str | None


class Synthesis(_EventBase, tag="synthesis", kw_only=True):
    """The terminal event: exactly once per started turn, always last."""

    status: Status
    content: str
    counts: Counts
    agents: list[Agent]
    error: ErrorInfo | None = None
    cancel_reason: CancelReason | None = None  # as Meta.cancel_reason


Event = (SynthesisStarted | SynthesisChunk | ReasoningChunk | ToolCallChunk | ToolResult | Step
         | Synthesis)


class MergedEntry(msgspec.Struct, omit_defaults=True):
    """Fields of a ``{ns:s}:merged`` entry. ``response`` and ``meta`` are JSON."""

    response_id: str
    synthesis_id: str
    status: Status
    response: str
    meta: str
    type: Literal["merged"] = "merged"
    attempt_id: str | None = None


class EventEntry(msgspec.Struct, omit_defaults=True):
    """Fields of a ``{ns:s}:events`` entry. ``event`` is the event's JSON."""

    type: str
    response_id: str
    synthesis_id: str
    event: str
    attempt_id: str | None = None


class DlqEntry(msgspec.Struct, omit_defaults=True):
    """Fields added to the original fields of a dead-lettered entry (5.3).

    Like every stream field value, ``deliveries`` is a string (a decimal count).
    """

    reason: str
    detail: str
    source_id: str
    deliveries: Annotated[str, msgspec.Meta(pattern=r"^[0-9]+$")]


class TurnResult(msgspec.Struct):
    """One line of ``processor merge`` output (docs/contract.md §8)."""

    response_id: str
    attempt_id: str | None
    status: Status
    response: Response
    meta: Meta
    events: list[Event]

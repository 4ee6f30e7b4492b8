"""The AG-UI 1.0 projection of a finished turn (``processor run --agui``).

Pure: a merged response, its meta and its status in, a list of AG-UI event
dicts (wire shape: camelCase keys, absent values left out) out. The worker
publishes the list to ``{ns:s}:agui`` inside ``finalise_turns``, in the same
atomic step as the merged entry and the terminal ``synthesis`` event, so a
turn's AG-UI run is written exactly once, complete and contiguous (runs of
different turns never interleave in the stream).

Why at the end and not while the turn runs: AG-UI wants each message as one
START/CONTENT/END stream under a stable id, and the merge decides both only
when the turn is rendered (messages rejoin across interleaved agents, id-less
runs get their ids and fold forward, arguments chunks join by ``call_id``).
Streaming would have to publish ids and order that the final merge may
contradict, and would need a second exactly-once channel. Live token-by-token
progress stays on the ``events`` stream (``--progress``).

Mapping (docs/design.md, "AG-UI projection"):

- ``RUN_STARTED``: ``threadId`` = the turn's ``thread_id``, else its
  ``session_id``, else its ``response_id``; ``runId`` = its ``run_id``, else
  its ``synthesis_id``; ``protocolVersion`` ``"1.0"``.
- per merged message, in order: its text as one ``TEXT_MESSAGE_START/
  CONTENT.../END`` under the message's id (roles AG-UI does not stream as
  text, such as ``tool``, become ``assistant``); its reasoning as one
  ``REASONING_START``, ``REASONING_MESSAGE_START/CONTENT.../END``,
  ``REASONING_END`` block under ``<message id>:reasoning``, where its first
  reasoning content is; each function call as ``TOOL_CALL_START/ARGS/END``
  (``toolCallId`` its ``call_id``, else ``<message id>:call<n>``, the
  message's n-th call) whose ``parentMessageId`` is the message's id; each
  function result as ``TOOL_CALL_RESULT``. Other contents (data, uri,
  errors, unknown types) stay in the merged response only.
- the end: ``RUN_FINISHED`` with ``outcome`` ``success`` or ``cancelled``
  (and the summed ``usage``), or ``RUN_ERROR`` with the error's code and
  message. Everything opened is closed before it.

The same ids are what ``processor.engine.agui_live.LiveRun`` (a running
turn, ``processor serve ?format=agui``) hands out, so a client's live
messages and this run's ``MESSAGES_SNAPSHOT``
(``processor.engine.agui_client.messages``) name the same things.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from processor.wire.ids import TurnKey
from processor.wire.models import Content
from processor.wire.outputs import ErrorInfo, Message, Meta, Response, Status

PROTOCOL_VERSION = "1.0"


#: Roles a TEXT_MESSAGE_START may carry (AG-UI's TextMessageRole).
TEXT_ROLES = frozenset({"developer", "system", "assistant", "user"})


#: Agent Framework usage counters -> AG-UI TokenUsage fields.
_USAGE = {"input_token_count": "inputTokens", "output_token_count": "outputTokens",
          "total_token_count": "totalTokens"}


_json = msgspec.json.Encoder()


def thread_and_run(meta: Meta) -> tuple[str, str]:
    """The AG-UI ``threadId`` and ``runId`` of a turn, from its correlation ids."""
    return thread_and_run_of(meta.ids, meta.response_id, meta.synthesis_id)


def thread_and_run_of(ids: Mapping[str, Any], response_id: str,
                      synthesis_id: str) -> tuple[str, str]:
    """``threadId`` and ``runId`` from correlation ids (a turn's meta, or any
    of its events, which all carry them)."""
    thread = ids.get("thread_id") or ids.get("session_id") or response_id
    return thread, ids.get("run_id") or synthesis_id


def call_name(mid: str, index: int) -> str:
    """The ``toolCallId`` of a message's ``index``-th call that has no ``call_id``."""
    return f"{mid}:call{index}"


def project(response: Response, meta: Meta, status: Status) -> list[dict[str, Any]]:
    """The whole AG-UI run of one finished turn."""
    return _Run(meta).build(response, status)


class _Run:
    def __init__(self, meta: Meta) -> None:
        self.meta = meta
        self.thread_id, self.run_id = thread_and_run(meta)
        self.events: list[dict[str, Any]] = []
        self.used: set[str] = set()  # message and tool call ids handed out in this run
        self.calls: dict[str, str] = {}  # producer call_id -> toolCallId emitted
        self.carried: set[str] = set()  # message ids some event already carries
        self.ts = meta.finished_ms if meta.finished_ms is not None else meta.started_ms

    def emit(self, type_: str, ts: int | None = None, **fields: Any) -> None:
        event = {"type": type_, "timestamp": self.ts if ts is None else ts, **fields}
        # A call's parentMessageId names a message on the client as much as a
        # messageId does: a tool result must not take that id too.
        for field in ("messageId", "parentMessageId"):
            if field in fields:
                self.carried.add(fields[field])
        self.events.append({k: v for k, v in event.items() if v is not None})

    def unique(self, candidate: str) -> str:
        """``candidate``, or it with ``~`` appended until no id of the run has it."""
        while candidate in self.used:
            candidate += "~"
        self.used.add(candidate)
        return candidate

    def build(self, response: Response, status: Status) -> list[dict[str, Any]]:
        self.emit("RUN_STARTED", self.meta.started_ms, threadId=self.thread_id,
                  runId=self.run_id, protocolVersion=PROTOCOL_VERSION)
        # Message ids are unique within a merged response (docs/contract.md §4.6):
        # reserve them all, so derived ids never take one a later message needs.
        self.used.update(m.message_id for m in response.messages if m.message_id)
        for message in response.messages:
            self.message(message)
        self.events.append(ending(self.thread_id, self.run_id, status, self.meta.error,
                                  _usage(response.usage_details), self.ts,
                                  self.meta.cancel_reason))
        return self.events

    def message(self, message: Message) -> None:
        mid = message.message_id or self.unique("message")
        role = message.role if message.role in TEXT_ROLES else "assistant"
        text_open = False
        reasoned = False
        calls = 0
        for content in message.contents:
            if content.type == "text" and content.text:
                if not text_open:
                    self.emit("TEXT_MESSAGE_START", messageId=mid, role=role,
                              name=message.author_name)
                    text_open = True
                self.emit("TEXT_MESSAGE_CONTENT", messageId=mid, delta=content.text)
            elif content.type == "text_reasoning" and not reasoned:
                reasoned = self.reasoning(mid, message.contents)
            elif content.type == "function_call":
                self.call(mid, calls, content)
                calls += 1
            elif content.type == "function_result":
                self.result(mid, message.role, content)
        if text_open:
            self.emit("TEXT_MESSAGE_END", messageId=mid)

    def reasoning(self, mid: str, contents: list[Content]) -> bool:
        """All of a message's reasoning as one reasoning message (live
        progress joins it per message too), where its first reasoning is."""
        parts = [c for c in contents if c.type == "text_reasoning"
                 and (c.text or c.protected_data)]
        if not parts:
            return False
        rid = self.unique(f"{mid}:reasoning")
        self.emit("REASONING_START", messageId=rid)
        self.emit("REASONING_MESSAGE_START", messageId=rid, role="reasoning")
        for content in parts:
            if content.text:
                self.emit("REASONING_MESSAGE_CONTENT", messageId=rid, delta=content.text)
        self.emit("REASONING_MESSAGE_END", messageId=rid)
        for content in parts:
            if content.protected_data:
                self.emit("REASONING_ENCRYPTED_VALUE", subtype="message", entityId=rid,
                          encryptedValue=content.protected_data)
        self.emit("REASONING_END", messageId=rid)
        return True

    def call(self, mid: str, index: int, content: Content) -> None:
        call_id = self.unique(content.call_id or call_name(mid, index))
        if content.call_id:
            self.calls.setdefault(content.call_id, call_id)
        self.emit("TOOL_CALL_START", toolCallId=call_id, toolCallName=content.name or "",
                  parentMessageId=mid)
        args = content.arguments
        text = args if isinstance(args, str) else _json.encode(args).decode() if args else ""
        if text:
            self.emit("TOOL_CALL_ARGS", toolCallId=call_id, delta=text)
        self.emit("TOOL_CALL_END", toolCallId=call_id)

    def result(self, mid: str, role: str, content: Content) -> None:
        if not content.call_id:
            return  # a result that names no call cannot be attached to one
        value = content.result if content.result is not None else content.exception
        # A tool message's (first) result takes the message's id; others derive one.
        fresh = role == "tool" and mid not in self.carried
        result_id = mid if fresh else self.unique(f"{mid}:result")
        self.emit("TOOL_CALL_RESULT", messageId=result_id,
                  toolCallId=self.calls.get(content.call_id, content.call_id),
                  content=result_text(value), role="tool")


def result_text(value: Any) -> str:
    """A function result as ``TOOL_CALL_RESULT.content``: text as it is, else JSON."""
    return value if isinstance(value, str) else "" if value is None else (
        _json.encode(value).decode())


def ending(thread_id: str, run_id: str, status: Status | str, error: ErrorInfo | None,
           usage: list[dict[str, int]] | None, ts: int | None,
           cancel_reason: str | None = None) -> dict[str, Any]:
    """The terminal event of a run: ``RUN_ERROR`` for a failed turn, else
    ``RUN_FINISHED`` with outcome ``success`` or ``cancelled`` (a cancel's
    reason in its ``metadata.cancelReason``: the outcome has no field for it)."""
    if status == "error":
        event: dict[str, Any] = {
            "type": "RUN_ERROR", "timestamp": ts,
            "message": error.message if error else "the turn failed",
            "code": error.code if error else None, "usage": usage}
    else:
        outcome = "cancelled" if status == "cancelled" else "success"
        event = {"type": "RUN_FINISHED", "timestamp": ts, "threadId": thread_id,
                 "runId": run_id, "outcome": {"type": outcome}, "usage": usage}
        if outcome == "cancelled" and cancel_reason:
            event["metadata"] = {"cancelReason": cancel_reason}
    return {k: v for k, v in event.items() if v is not None}


def _usage(details: dict[str, int] | None) -> list[dict[str, int]] | None:
    if not details:
        return None
    usage = {_USAGE[k]: v for k, v in details.items()
             if k in _USAGE and isinstance(v, int) and v >= 0}
    return [usage] if usage else None


def entry_fields(key: TurnKey, events: list[dict[str, Any]]) -> list[list[str]]:
    """One ``{ns:s}:agui`` stream entry per event: the same flat fields as an
    ``events`` entry (``type`` is the AG-UI type), the event's JSON last."""
    head = ["response_id", key.response_id, "synthesis_id", key.synthesis_id()]
    if key.attempt_id:
        head += ["attempt_id", key.attempt_id]
    return [["type", e["type"], *head, "event", _json.encode(e).decode()] for e in events]

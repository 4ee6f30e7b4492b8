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
  text, such as ``tool``, become ``assistant``); each reasoning content as a
  ``REASONING_START``, ``REASONING_MESSAGE_START/CONTENT/END``,
  ``REASONING_END`` block; each function call as ``TOOL_CALL_START/ARGS/END``
  whose ``parentMessageId`` is the message's id; each function result as
  ``TOOL_CALL_RESULT``. Other contents (data, uri, errors, unknown types) stay
  in the merged response only.
- the end: ``RUN_FINISHED`` with ``outcome`` ``success`` or ``cancelled``
  (and the summed ``usage``), or ``RUN_ERROR`` with the error's code and
  message. Everything opened is closed before it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from processor.ids import TurnKey
from processor.models import Content, Message, Meta, Response, Status

PROTOCOL_VERSION = "1.0"
#: Roles a TEXT_MESSAGE_START may carry (AG-UI's TextMessageRole).
_TEXT_ROLES = frozenset({"developer", "system", "assistant", "user"})
#: Agent Framework usage counters -> AG-UI TokenUsage fields.
_USAGE = {"input_token_count": "inputTokens", "output_token_count": "outputTokens",
          "total_token_count": "totalTokens"}
_json = msgspec.json.Encoder()


def thread_and_run(meta: Meta) -> tuple[str, str]:
    """The AG-UI ``threadId`` and ``runId`` of a turn, from its correlation ids."""
    ids = meta.ids
    thread = ids.get("thread_id") or ids.get("session_id") or meta.response_id
    return thread, ids.get("run_id") or meta.synthesis_id


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
        if "messageId" in fields:
            self.carried.add(fields["messageId"])
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
        usage = _usage(response.usage_details)
        if status == "error":
            error = self.meta.error
            self.emit("RUN_ERROR", message=error.message if error else "the turn failed",
                      code=error.code if error else None, usage=usage)
        else:
            outcome = "cancelled" if status == "cancelled" else "success"
            self.emit("RUN_FINISHED", threadId=self.thread_id, runId=self.run_id,
                      outcome={"type": outcome}, usage=usage)
        return self.events

    def message(self, message: Message) -> None:
        mid = message.message_id or self.unique("message")
        role = message.role if message.role in _TEXT_ROLES else "assistant"
        text_open = False
        for content in message.contents:
            if content.type == "text" and content.text:
                if not text_open:
                    self.emit("TEXT_MESSAGE_START", messageId=mid, role=role,
                              name=message.author_name)
                    text_open = True
                self.emit("TEXT_MESSAGE_CONTENT", messageId=mid, delta=content.text)
            elif content.type == "text_reasoning":
                self.reasoning(mid, content)
            elif content.type == "function_call":
                self.call(mid, content)
            elif content.type == "function_result":
                self.result(mid, message.role, content)
        if text_open:
            self.emit("TEXT_MESSAGE_END", messageId=mid)

    def reasoning(self, mid: str, content: Content) -> None:
        if not content.text and not content.protected_data:
            return
        rid = self.unique(f"{mid}:reasoning")
        self.emit("REASONING_START", messageId=rid)
        self.emit("REASONING_MESSAGE_START", messageId=rid, role="reasoning")
        if content.text:
            self.emit("REASONING_MESSAGE_CONTENT", messageId=rid, delta=content.text)
        self.emit("REASONING_MESSAGE_END", messageId=rid)
        if content.protected_data:
            self.emit("REASONING_ENCRYPTED_VALUE", subtype="message", entityId=rid,
                      encryptedValue=content.protected_data)
        self.emit("REASONING_END", messageId=rid)

    def call(self, mid: str, content: Content) -> None:
        call_id = self.unique(content.call_id or f"{mid}:call")
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
        text = value if isinstance(value, str) else "" if value is None else (
            _json.encode(value).decode())
        # A tool message's (first) result takes the message's id; others derive one.
        fresh = role == "tool" and mid not in self.carried
        result_id = mid if fresh else self.unique(f"{mid}:result")
        self.emit("TOOL_CALL_RESULT", messageId=result_id,
                  toolCallId=self.calls.get(content.call_id, content.call_id),
                  content=text, role="tool")


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

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

from collections.abc import Mapping
from typing import Any

import msgspec

from processor.wire.ids import TurnKey
from processor.wire.models import Content, ErrorInfo, Message, Meta, Response, Status

PROTOCOL_VERSION = "1.0"
#: Roles a TEXT_MESSAGE_START may carry (AG-UI's TextMessageRole).
_TEXT_ROLES = frozenset({"developer", "system", "assistant", "user"})
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
        self.events.append(ending(self.thread_id, self.run_id, status, self.meta.error,
                                  _usage(response.usage_details), self.ts,
                                  self.meta.cancel_reason))
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


def ending(thread_id: str, run_id: str, status: Status | str, error: ErrorInfo | None,
           usage: list[dict[str, int]] | None, ts: int | None,
           cancel_reason: str | None = None) -> dict[str, Any]:
    """The terminal event of a run: ``RUN_ERROR`` for a failed turn, else
    ``RUN_FINISHED`` with outcome ``success`` or ``cancelled``; a cancel's
    reason in its ``metadata`` (``cancel_reason``: AG-UI's cancelled outcome
    has no field for one, and every event may carry metadata)."""
    if status == "error":
        event: dict[str, Any] = {
            "type": "RUN_ERROR", "timestamp": ts,
            "message": error.message if error else "the turn failed",
            "code": error.code if error else None, "usage": usage}
    else:
        outcome = "cancelled" if status == "cancelled" else "success"
        event = {"type": "RUN_FINISHED", "timestamp": ts, "threadId": thread_id,
                 "runId": run_id, "outcome": {"type": outcome}, "usage": usage}
        if status == "cancelled" and cancel_reason is not None:
            event["metadata"] = {"cancel_reason": cancel_reason}
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


# --------------------------------------------------------------------------- messages


def messages(run: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The AG-UI messages a run's events build, in order: what a
    ``MESSAGES_SNAPSHOT`` of the run's response holds, with the same ids
    (text and its calls in one ``assistant`` message, each result a ``tool``
    message, each reasoning block a ``reasoning`` message)."""
    out: dict[str, dict[str, Any]] = {}
    calls: dict[str, dict[str, Any]] = {}  # toolCallId -> its ToolCall in a message

    def assistant(mid: str) -> dict[str, Any]:
        message = out.get(mid)
        if message is None or message["role"] != "assistant":
            if message is not None:  # calls of a user/system message: an assistant one beside it
                mid = f"{mid}~calls"
                while mid in out and out[mid]["role"] != "assistant":
                    mid += "~"
            message = out.setdefault(mid, {"id": mid, "role": "assistant"})
        return message

    for event in run:
        kind = event["type"]
        if kind == "TEXT_MESSAGE_START":
            mid = event["messageId"]
            message = out.setdefault(mid, {"id": mid, "role": event["role"]})
            message["role"] = event["role"]
            if "name" in event:
                message["name"] = event["name"]
        elif kind == "TEXT_MESSAGE_CONTENT":
            message = out[event["messageId"]]
            message["content"] = message.get("content", "") + event["delta"]
        elif kind == "REASONING_MESSAGE_START":
            out[event["messageId"]] = {"id": event["messageId"], "role": "reasoning",
                                       "content": ""}
        elif kind == "REASONING_MESSAGE_CONTENT":
            out[event["messageId"]]["content"] += event["delta"]
        elif kind == "REASONING_ENCRYPTED_VALUE" and event["entityId"] in out:
            out[event["entityId"]]["encryptedValue"] = event["encryptedValue"]
        elif kind == "TOOL_CALL_START":
            call = {"id": event["toolCallId"], "type": "function",
                    "function": {"name": event["toolCallName"], "arguments": ""}}
            assistant(event["parentMessageId"]).setdefault("toolCalls", []).append(call)
            calls[event["toolCallId"]] = call
        elif kind == "TOOL_CALL_ARGS":
            calls[event["toolCallId"]]["function"]["arguments"] += event["delta"]
        elif kind == "TOOL_CALL_RESULT":
            out[event["messageId"]] = {"id": event["messageId"], "role": "tool",
                                       "content": event["content"],
                                       "toolCallId": event["toolCallId"]}
    return list(out.values())


def snapshot_and_end(response: Response, meta: Meta, status: Status) -> list[dict[str, Any]]:
    """A finished turn's ``MESSAGES_SNAPSHOT`` (its merged response, the same
    messages and ids as :func:`project`'s run) and the run's terminal event."""
    run = project(response, meta, status)
    return [messages_snapshot(run[1:-1], run[-1].get("timestamp")), run[-1]]


def messages_snapshot(run: list[dict[str, Any]], ts: int | None) -> dict[str, Any]:
    """``MESSAGES_SNAPSHOT`` of the messages a run's events build."""
    event: dict[str, Any] = {"type": "MESSAGES_SNAPSHOT", "timestamp": ts,
                             "messages": messages(run)}
    return {k: v for k, v in event.items() if v is not None}


# --------------------------------------------------------------------------- live


class LiveRun:
    """The AG-UI 1.0 projection of a turn's live ``events`` (``processor serve
    ?format=agui``), one worker event at a time, in seq order.

    Each event maps to at most one AG-UI event, so an SSE id (the seq) never
    falls inside a group and a resume is exact:

    - ``synthesis.started`` -> ``RUN_STARTED`` (ids as :func:`thread_and_run_of`);
    - ``synthesis.chunk`` -> ``TEXT_MESSAGE_CHUNK`` (role ``assistant``,
      ``name`` the author). Chunks of one message in a row are one chunk
      stream under the message's id; AG-UI closes a chunk stream at any
      other event and never lets an id be reopened, so a message that goes
      on after another event (agents interleave) goes on under
      ``<message id>~<seq of its first chunk there>``;
    - ``step`` -> nothing for a ``text`` step (its chunk carries the text);
      any other event (``step``, ``reasoning.chunk``, ``tool_call.chunk``,
      ``tool_result``, types to come) -> ``CUSTOM`` ``processor.<type>`` with
      the worker's event as value: calls are not streamed as ``TOOL_CALL_*``
      since their arguments are not complete JSON until the turn is merged;
    - the terminal ``synthesis`` -> :func:`ending` (the serve side sends the
      merged response's ``MESSAGES_SNAPSHOT`` just before it).

    Deltas are provisional, like the worker's: the snapshot replaces them.
    The state after an event depends only on the events before it, so any
    replica that folds a turn's history (:meth:`fold`) renders the rest
    with the same ids.
    """

    def __init__(self) -> None:
        self.chunk: tuple[str, str] | None = None  # (source key, AG-UI id) of the open chunk stream
        self.used: set[str] = set()  # AG-UI message ids handed out

    def fold(self, event: Mapping[str, Any]) -> None:
        """Take in an event the client already has (its output is not needed)."""
        self.event(event)

    def event(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind, ts = event.get("type"), event.get("ts")
        if kind == "synthesis.chunk":
            return [self._chunk(event)]
        if kind == "step" and event.get("step") == "text":
            return []
        self.chunk = None  # any other AG-UI event closes a chunk stream
        if kind == "synthesis.started":
            thread, run = thread_and_run_of(event, event["response_id"], event["synthesis_id"])
            return [{"type": "RUN_STARTED", "timestamp": ts, "threadId": thread, "runId": run,
                     "protocolVersion": PROTOCOL_VERSION}]
        if kind == "synthesis":
            thread, run = thread_and_run_of(event, event["response_id"], event["synthesis_id"])
            error = event.get("error")
            info = ErrorInfo(error["code"], error["message"]) if error else None
            return [ending(thread, run, event.get("status", ""), info, None, ts,
                           event.get("cancel_reason"))]
        return [{"type": "CUSTOM", "timestamp": ts, "name": f"processor.{kind}",
                 "value": dict(event)}]

    def _chunk(self, event: Mapping[str, Any]) -> dict[str, Any]:
        mid = event.get("message_id")
        key = mid if mid else f"{event.get('agent_id') or event.get('author_name') or 'agent'}"
        if self.chunk is not None and self.chunk[0] == key:
            agui_id = self.chunk[1]
        else:
            agui_id = key if key not in self.used else f"{key}~{event['seq']}"
            while agui_id in self.used:
                agui_id += "~"
            self.used.add(agui_id)
            self.chunk = (key, agui_id)
        out = {"type": "TEXT_MESSAGE_CHUNK", "timestamp": event.get("ts"), "messageId": agui_id,
               "role": "assistant", "name": event.get("author_name"), "delta": event["delta"]}
        return {k: v for k, v in out.items() if v is not None}

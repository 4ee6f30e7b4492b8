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

The same ids are what ``LiveRun`` (a running turn, ``processor serve
?format=agui``) hands out, so a client's live messages and this run's
``MESSAGES_SNAPSHOT`` (``messages``) name the same things.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from processor.engine.combine import turn_tag
from processor.wire.ids import TurnKey
from processor.wire.models import Content, ErrorInfo, Message, Meta, Response, Status

PROTOCOL_VERSION = "1.0"
#: The id of the empty reasoning message a trimming snapshot holds (see
#: ``LiveRun.finish``); never one of a client's own messages.
PLACEHOLDER = "processor:trim"
#: The suffixes this module derives AG-UI ids with (and ``~``, made unique).
_DERIVED = re.compile(r"(?::reasoning|:result|:call\d+)?~*$")
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
        role = message.role if message.role in _TEXT_ROLES else "assistant"
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


# --------------------------------------------------------------------------- messages

#: An AG-UI message as a client holds it (``id``, ``role``, ``content``, ...).
AguiMessage = dict[str, Any]


class ClientState:
    """The messages an AG-UI 1.0 client holds, as ``@ag-ui/client`` 1.0's
    ``defaultApplyEvents`` builds them from the events this module writes:

    - ``TEXT_MESSAGE_START`` / ``REASONING_MESSAGE_START`` append a message
      unless one has that id (a START after the END of the same id reopens it:
      its ``CONTENT`` appends to what it holds);
    - ``TOOL_CALL_START`` adds the call to its ``parentMessageId`` if that is
      an assistant message, else appends an assistant message (id: the parent
      id, or the call's id when the parent is another role's message);
    - ``TOOL_CALL_RESULT`` inserts a tool message right after the assistant
      message holding the call (and the tool messages after it), or appends it;
    - ``MESSAGES_SNAPSHOT`` keeps the messages it names where they are (as
      its version), drops the others (a ``reasoning`` one only when it holds
      reasoning itself) and appends the ones it alone has, in its order.
    """

    def __init__(self, messages: list[AguiMessage] | None = None) -> None:
        self.messages: list[AguiMessage] = []
        self._reset([_copy(m) for m in messages or []])

    def _reset(self, held: list[AguiMessage]) -> None:
        self.messages = held
        self._ids: dict[str, AguiMessage] = {}  # (the first message of each id)
        self._calls: dict[str, dict[str, Any]] = {}
        for message in held:
            self._index(message)

    def _index(self, message: AguiMessage) -> None:
        self._ids.setdefault(message.get("id"), message)  # type: ignore[arg-type]
        for call in message.get("toolCalls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                self._calls.setdefault(call["id"], call)

    def find(self, mid: str) -> AguiMessage | None:
        return self._ids.get(mid)

    def call(self, call_id: str) -> dict[str, Any] | None:
        return self._calls.get(call_id)

    def apply(self, event: Mapping[str, Any]) -> None:
        kind = event["type"]
        if kind in ("TEXT_MESSAGE_START", "REASONING_MESSAGE_START"):
            if self.find(event["messageId"]) is None:
                message = {"id": event["messageId"], "role": event.get("role", "assistant"),
                           "content": ""}
                if kind == "TEXT_MESSAGE_START" and "name" in event:
                    message["name"] = event["name"]
                self.messages.append(message)
                self._index(message)
        elif kind in ("TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT"):
            found = self.find(event["messageId"])
            if found is not None:
                before = found.get("content")
                found["content"] = (before if isinstance(before, str) else "") + event["delta"]
        elif kind == "REASONING_ENCRYPTED_VALUE":
            found = self.find(event["entityId"])
            if found is not None:
                found["encryptedValue"] = event["encryptedValue"]
        elif kind == "TOOL_CALL_START":
            self._call_start(event)
        elif kind == "TOOL_CALL_ARGS":
            call = self.call(event["toolCallId"])
            if call is not None:
                call["function"]["arguments"] += event["delta"]
        elif kind == "TOOL_CALL_RESULT":
            self._result(event)
        elif kind == "MESSAGES_SNAPSHOT":
            self._reset(after_snapshot(self.messages, event["messages"]))

    def _call_start(self, event: Mapping[str, Any]) -> None:
        call_id, name = event["toolCallId"], event["toolCallName"]
        known = self.call(call_id)
        if known is not None:
            known["function"]["name"] = name
            return
        parent_id = event.get("parentMessageId")
        parent = self.find(parent_id) if parent_id is not None else None
        if parent is None or parent["role"] != "assistant":
            parent = {"id": call_id if parent is not None or parent_id is None else parent_id,
                      "role": "assistant", "toolCalls": []}
            self.messages.append(parent)
            self._index(parent)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        parent.setdefault("toolCalls", []).append(call)
        self._calls.setdefault(call_id, call)

    def _result(self, event: Mapping[str, Any]) -> None:
        message = {"id": event["messageId"], "toolCallId": event["toolCallId"],
                   "role": event.get("role") or "tool", "content": event["content"]}
        holder = next((i for i, m in enumerate(self.messages) if m["role"] == "assistant"
                       and any(c.get("id") == event["toolCallId"]
                               for c in m.get("toolCalls") or ())), None)
        self._index(message)
        if holder is None:
            self.messages.append(message)
            return
        at = holder + 1
        while at < len(self.messages) and self.messages[at]["role"] == "tool":
            at += 1
        self.messages.insert(at, message)


def after_snapshot(held: list[AguiMessage], snapshot: list[AguiMessage]) -> list[AguiMessage]:
    """What a client holds after a ``MESSAGES_SNAPSHOT`` (see ``ClientState``)."""
    named = {m["id"]: m for m in snapshot}
    reasoning = any(m["role"] == "reasoning" for m in snapshot)
    kept = [_copy(named.get(m["id"], m)) for m in held
            if m["id"] in named or (m["role"] == "reasoning" and not reasoning)]
    have = {m["id"] for m in kept}
    return kept + [_copy(m) for m in snapshot if m["id"] not in have]


def _copy(message: AguiMessage) -> AguiMessage:
    out = dict(message)
    calls = out.get("toolCalls")
    if isinstance(calls, list):
        out["toolCalls"] = [{**c, "function": dict(c["function"])}
                            if isinstance(c, dict) and isinstance(c.get("function"), dict) else c
                            for c in calls]
    return out


def messages(run: list[dict[str, Any]]) -> list[AguiMessage]:
    """The AG-UI messages a client holds after a run's events, in order: what
    a ``MESSAGES_SNAPSHOT`` of the run's response holds, with the same ids
    (text and its calls in one ``assistant`` message, each result a ``tool``
    message right after its call's message, the reasoning of a message a
    ``reasoning`` message)."""
    state = ClientState()
    for event in run:
        state.apply(event)
    return state.messages


def snapshot_and_end(response: Response, meta: Meta, status: Status) -> list[dict[str, Any]]:
    """A finished turn's ``MESSAGES_SNAPSHOT`` (its merged response, the same
    messages and ids as ``project``'s run) and the run's terminal event."""
    run = project(response, meta, status)
    return [messages_snapshot(run[1:-1], run[-1].get("timestamp")), run[-1]]


def messages_snapshot(run: list[dict[str, Any]], ts: int | None) -> dict[str, Any]:
    """``MESSAGES_SNAPSHOT`` of the messages a run's events build."""
    return _snapshot(messages(run), ts)


def _snapshot(held: list[AguiMessage], ts: int | None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "MESSAGES_SNAPSHOT", "timestamp": ts,
                             "messages": [_copy(m) for m in held]}
    return {k: v for k, v in event.items() if v is not None}


# --------------------------------------------------------------------------- live


class LiveRun:
    """The AG-UI 1.0 projection of a turn's live ``events`` (``processor serve
    ?format=agui``), one worker event at a time, in seq order, for one client.

    Each worker event becomes a *group* of AG-UI events (``event``):
    the SSE id (its seq) goes on the group's last event only, and every event
    before it leaves the client's messages as they are (``*_END``, a
    ``*_START`` of what the client already has, ``STEP_*``) or sets them
    whole (``MESSAGES_SNAPSHOT``). So a client cut inside a group and sent
    the group again from its last id ends with the same messages.

    - ``synthesis.chunk`` -> ``TEXT_MESSAGE_START`` (once, while it stays
      open) and ``TEXT_MESSAGE_CONTENT`` under the message's id; the message
      stays open until another message, reasoning, call or result comes
      (``TEXT_MESSAGE_END`` then opens that group). AG-UI 1.0 reopens an id
      after its END: the content appends to what the message holds.
    - ``reasoning.chunk`` -> ``REASONING_START`` + ``REASONING_MESSAGE_START``
      and ``REASONING_MESSAGE_CONTENT`` under ``<message id>:reasoning``;
    - ``tool_call.chunk`` -> ``TOOL_CALL_START`` (``parentMessageId``: the
      message) and ``TOOL_CALL_ARGS``; ``tool_result`` -> ``TOOL_CALL_RESULT``;
    - ``step`` -> ``STEP_FINISHED`` of the agent that worked so far and
      ``STEP_STARTED`` of the one that works now (``stepName``: its
      ``agent_id``, else its name), on a handoff; nothing while the same
      agent goes on (or for a step that names no agent);
    - a ``replace`` chunk that rewrites what the client holds, and a result
      that changed, -> ``MESSAGES_SNAPSHOT`` of every message with the new
      text (a message left empty is dropped): AG-UI has no other way to
      rewrite the past;
    - types to come -> ``CUSTOM`` ``processor.<type>``;
    - the terminal event -> ``finish``: everything open closed, the
      merged response's ``MESSAGES_SNAPSHOT`` and the outcome.

    The ids are ``project``'s. The state after an event depends only on
    the events before it, so any replica that folds a turn's history
    (``fold``) renders the rest the same way.
    """

    def __init__(self) -> None:
        self.client = ClientState()  # what the client holds (the events applied)
        self.given: list[AguiMessage] = []  # the client's own messages (RunAgentInput.messages)
        self.text: str | None = None  # the open text message
        self.thought: str | None = None  # the open reasoning message
        self.calling: str | None = None  # the open tool call
        self.step: str | None = None  # the open step
        self.used: set[str] = set()  # ids handed out (messages, calls, results)
        self.reasoning_ids: dict[str, str] = {}  # message id -> its reasoning message's id
        self.call_ids: dict[tuple[str, int], str] = {}  # (message id, index) -> toolCallId
        self.producer_calls: dict[str, str] = {}  # producer call_id -> toolCallId
        self.result_ids: dict[tuple[str, int], str] = {}  # (message id, index) -> messageId
        self.folded = False  # events came from the turn's history, not sent on this connection
        self.known = True  # self.client is what the client holds (else: a guess, see finish)
        self.resumed = False  # the client has some of the turn from an earlier connection

    # ------------------------------------------------------------- a connection

    def attach(self, given: list[AguiMessage] | None, resumed: bool = False) -> None:
        """A new connection: the client holds ``given`` (what a stock client
        posts as ``RunAgentInput.messages``) instead of what the folded
        events built, when it says; nothing is open on its side yet.
        ``resumed``: it has some of the turn (it sent ``Last-Event-ID``)."""
        self.resumed = resumed
        if given is not None:
            self.given = [_copy(m) for m in given]
            self.client = ClientState(given)
        elif self.folded or resumed:
            self.known = False  # it says nothing: it may have joined by a snapshot, or missed some

    def reopen(self) -> list[dict[str, Any]]:
        """For a connection that starts after seq 0 (after its ``RUN_STARTED``):
        what is open at this point, opened again (the client already holds
        it, so only its own verifier sees them)."""
        out: list[dict[str, Any]] = []
        if self.step is not None:
            out.append({"type": "STEP_STARTED", "stepName": self.step})
        if self.text is not None:
            out += self._open_text(self.text, None)
        if self.thought is not None:
            out += [{"type": "REASONING_START", "messageId": self.thought},
                    {"type": "REASONING_MESSAGE_START", "messageId": self.thought,
                     "role": "reasoning"}]
        if self.calling is not None:
            call = self.client.call(self.calling)
            name = call["function"]["name"] if call else ""
            parent = next((m["id"] for m in self.client.messages
                           if any(c.get("id") == self.calling for c in m.get("toolCalls") or ())),
                          None)
            out.append(_bare({"type": "TOOL_CALL_START", "toolCallId": self.calling,
                              "toolCallName": name, "parentMessageId": parent}))
        return self._stamped(out, None)  # (a client that lacks one gets it: it is applied)

    def forget_open(self) -> None:
        """A client that gets a snapshot has no message open: none is reopened."""
        self.text = self.thought = self.calling = None

    def join(self, response: Response, meta: Meta) -> list[dict[str, Any]]:
        """A client that joins a running turn: the merge so far as
        ``project``'s run of it (so a client that reads only
        ``TEXT_MESSAGE_*`` and ``TOOL_CALL_*`` gets the text too), after a
        ``MESSAGES_SNAPSHOT`` of the client's own messages (the group starts
        from them, whatever of the turn it held); call ``forget_open``
        before this connection's ``reopen``."""
        return self._stamped(self._replay(response, meta, "completed"), None)

    def _replay(self, response: Response, meta: Meta, status: Status) -> list[dict[str, Any]]:
        run = project(response, meta, status)
        merged = messages(run[1:-1])
        return [_snapshot(self._own(merged, response, meta), None), *run[1:-1]]

    # ------------------------------------------------------------- the events

    def fold(self, event: Mapping[str, Any]) -> None:
        """Take in an event the client already has (its output is not needed)."""
        self.folded = True
        self.event(event)

    def event(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The group of one worker event (not the terminal one: ``finish``)."""
        kind = event.get("type")
        group: list[dict[str, Any]]
        if kind == "synthesis.started":
            thread, run = thread_and_run_of(event, event["response_id"], event["synthesis_id"])
            group = [{"type": "RUN_STARTED", "threadId": thread, "runId": run,
                      "protocolVersion": PROTOCOL_VERSION}]
        elif kind == "synthesis.chunk":
            group = self._text(event)
        elif kind == "reasoning.chunk":
            group = self._reasoning(event)
        elif kind == "tool_call.chunk":
            group = self._call(event)
        elif kind == "tool_result":
            group = self._result(event)
        elif kind == "step":
            group = self._step(event)
        elif kind == "synthesis":
            thread, run = thread_and_run_of(event, event["response_id"], event["synthesis_id"])
            error = event.get("error")
            info = ErrorInfo(error["code"], error["message"]) if error else None
            reason = event.get("cancel_reason")
            group = [*self.close(steps=True),
                     ending(thread, run, event.get("status", ""), info, None, None,
                            reason if isinstance(reason, str) else None)]
        else:
            group = [{"type": "CUSTOM", "name": f"processor.{kind}", "value": dict(event)}]
        return self._stamped(group, event.get("ts"))

    def finish(self, response: Response, meta: Meta, status: Status,
               cancel_reason: str | None = None) -> list[dict[str, Any]]:
        """The terminal group: everything closed, the merged response's
        ``MESSAGES_SNAPSHOT`` (after the client's own messages), the outcome.

        A stock client keeps what it holds in place and appends what only the
        snapshot has; where its messages stand in another order than the
        merged response's (the merge placed a message before one shown
        earlier, e.g. an agent's block in a handoff, or a message's reasoning
        and text came in one batch), one ``MESSAGES_SNAPSHOT`` of the longest
        prefix that keeps the order goes first, so the client ends with
        exactly the merged order. (Only reasoning that the merged response no
        longer has at all can stay: a snapshot without reasoning keeps it.)"""
        run = project(response, meta, status)
        if cancel_reason and "metadata" not in run[-1] and run[-1].get("outcome") == {
                "type": "cancelled"}:
            run[-1] = {**run[-1], "metadata": {"cancelReason": cancel_reason}}
        merged = messages(run[1:-1])
        own = self._own(merged, response, meta)
        final = own + merged
        ts = run[-1].get("timestamp")
        if not self.used and not self.folded and not self.resumed:  # new, of a finished turn
            head = self._replay(response, meta, status)  # the text, for clients that want it
        else:
            head = self._trim(final) if self.known else self._clear(own, final)
        group = [*self.close(steps=True), *head, _snapshot(final, ts), run[-1]]
        return self._stamped(group, None)

    def close(self, *, steps: bool = False, keep: str | None = None) -> list[dict[str, Any]]:
        """END events for what is open (but ``keep``; steps only with ``steps``)."""
        out: list[dict[str, Any]] = []
        if self.text is not None and self.text != keep:
            out.append({"type": "TEXT_MESSAGE_END", "messageId": self.text})
            self.text = None
        if self.thought is not None and self.thought != keep:
            out += [{"type": "REASONING_MESSAGE_END", "messageId": self.thought},
                    {"type": "REASONING_END", "messageId": self.thought}]
            self.thought = None
        if self.calling is not None and self.calling != keep:
            out.append({"type": "TOOL_CALL_END", "toolCallId": self.calling})
            self.calling = None
        if steps and self.step is not None:
            out.append({"type": "STEP_FINISHED", "stepName": self.step})
            self.step = None
        return out

    # ------------------------------------------------------------- per type

    def _text(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        mid, delta = str(event.get("message_id")), event["delta"]
        held = self.client.find(mid)
        content = held.get("content") if held is not None else None
        if event.get("replace") and isinstance(content, str) and content:
            return self._rewrite(mid, "content", delta)
        if not delta:
            return []
        out = self.close(keep=mid)
        if self.text != mid:
            out += self._open_text(mid, event.get("author_name"))
            self.text = mid
        self.used.add(mid)
        return [*out, {"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": delta}]

    def _open_text(self, mid: str, name: str | None) -> list[dict[str, Any]]:
        held = self.client.find(mid)
        role = held["role"] if held is not None and held["role"] in _TEXT_ROLES else "assistant"
        if held is not None:
            name = held.get("name")
        return [_bare({"type": "TEXT_MESSAGE_START", "messageId": mid, "role": role,
                       "name": name})]

    def _reasoning(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        mid, delta = str(event.get("message_id")), event["delta"]
        rid = self.reasoning_ids.get(mid)
        if rid is None:
            if not delta:
                return []
            rid = self.reasoning_ids[mid] = self._unique(f"{mid}:reasoning")
        held = self.client.find(rid)
        content = held.get("content") if held is not None else None
        if event.get("replace") and isinstance(content, str) and content:
            return self._rewrite(rid, "content", delta)
        if not delta:
            return []
        out = self.close(keep=rid)
        if self.thought != rid:
            out += [{"type": "REASONING_START", "messageId": rid},
                    {"type": "REASONING_MESSAGE_START", "messageId": rid, "role": "reasoning"}]
            self.thought = rid
        return [*out, {"type": "REASONING_MESSAGE_CONTENT", "messageId": rid, "delta": delta}]

    def _call(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        mid, index, delta = str(event.get("message_id")), int(event.get("index") or 0), \
            event["delta"]
        where = (mid, index)
        cid = self.call_ids.get(where)
        if cid is None:
            producer = event.get("call_id")
            cid = self.call_ids[where] = self._unique(producer or call_name(mid, index))
            if producer:
                self.producer_calls.setdefault(producer, cid)
        held = self.client.call(cid)
        if event.get("replace") and held is not None and held["function"]["arguments"]:
            return self._rewrite(cid, "arguments", delta)
        out = self.close(keep=cid)
        if self.calling != cid:
            name = event.get("name") or (held["function"]["name"] if held else "")
            out.append({"type": "TOOL_CALL_START", "toolCallId": cid, "toolCallName": name,
                        "parentMessageId": mid})
            self.used.add(mid)
            self.calling = cid
        if delta:
            out.append({"type": "TOOL_CALL_ARGS", "toolCallId": cid, "delta": delta})
        return out

    def _result(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        producer = event.get("call_id")
        if not producer:
            return []  # a result that names no call cannot be attached to one
        mid, index = str(event.get("message_id")), int(event.get("index") or 0)
        where = (mid, index)
        text = result_text(event.get("result"))
        rid = self.result_ids.get(where)
        if rid is not None and self.client.find(rid) is not None:
            return self._rewrite(rid, "content", text)
        if rid is None:
            fresh = mid not in self.used and self.client.find(mid) is None
            rid = self.result_ids[where] = mid if fresh else self._unique(f"{mid}:result")
            self.used.add(rid)
        return [*self.close(), {"type": "TOOL_CALL_RESULT", "messageId": rid,
                                "toolCallId": self.producer_calls.get(producer, producer),
                                "content": text, "role": "tool"}]

    def _step(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        name = event.get("agent_id") or event.get("agent_name")
        if not name or name == self.step:
            return []
        out = [{"type": "STEP_FINISHED", "stepName": self.step}] if self.step else []
        self.step = str(name)
        return [*out, {"type": "STEP_STARTED", "stepName": self.step}]

    def _rewrite(self, target: str, field: str, value: str) -> list[dict[str, Any]]:
        """The client's messages with ``target``'s text (or arguments) set to
        ``value``, as one ``MESSAGES_SNAPSHOT``; a message left with nothing
        is dropped."""
        out = self.close()
        now = [_copy(m) for m in self.client.messages]
        for message in now:
            if field == "arguments":
                for call in message.get("toolCalls") or ():
                    if call.get("id") == target:
                        call["function"]["arguments"] = value
            elif message["id"] == target:
                message[field] = value
        now = [m for m in now if m["id"] != target or m.get("content") or m.get("toolCalls")]
        return [*out, _snapshot(now, None)]

    def _own(self, merged: list[AguiMessage], response: Response,
             meta: Meta) -> list[AguiMessage]:
        """The client's own messages: those it posted that are not the turn's.
        The turn's: in the merge, an id this projection handed out (up to
        now: a message of a group the client had in part is handed out when
        sent again), or derived from one of the turn's (``<message id>:...``
        of a message in the merge, of an id-less one the merge assigned
        ``msg-<n>-<turn tag>``, which may have folded away since, or the
        trim placeholder)."""
        ids = {m["id"] for m in merged} | self.used
        messages_of_turn = {m.message_id for m in response.messages if m.message_id}
        tag = turn_tag(TurnKey(meta.response_id, meta.attempt_id or ""))
        assigned = re.compile(rf"msg-\d+-{tag}~*")

        def turns(mid: str) -> bool:
            if mid in ids or mid.startswith(PLACEHOLDER):
                return True
            base = _DERIVED.sub("", mid)
            return base in messages_of_turn or assigned.fullmatch(base) is not None

        return [m for m in self.given if not turns(str(m.get("id")))]

    def _unique(self, candidate: str) -> str:
        while candidate in self.used:
            candidate += "~"
        self.used.add(candidate)
        return candidate

    def _trim(self, final: list[AguiMessage]) -> list[dict[str, Any]]:
        """The ``MESSAGES_SNAPSHOT`` that makes ``final`` land in its order
        (none when it does as it is). After a snapshot ``T``, a client holds
        its messages that ``T`` names, in its own order, then the rest of
        ``T``; so ``final[:k]`` fits when it is messages the client holds, in
        the client's order, then messages it does not hold; the longest such
        prefix is found in one pass."""
        held = {m["id"]: i for i, m in enumerate(self.client.messages)}
        keep, last, fresh = 0, -1, False
        for message in final:
            at = held.get(message["id"])
            if at is None:
                fresh = True
            elif fresh or at < last:
                break
            else:
                last = at
            keep += 1
        if keep == len(final):
            return []  # (reasoning the merge no longer has stays: no snapshot drops it)
        trim = final[:keep]
        # A snapshot without reasoning keeps the client's reasoning messages:
        # one to drop them holds a placeholder reasoning message, which the
        # final snapshot (it has reasoning) drops in turn.
        kept = {m["id"] for m in trim}
        if not any(m["role"] == "reasoning" for m in trim) \
                and any(m["role"] == "reasoning" for m in final) \
                and any(m["role"] == "reasoning" and m["id"] not in kept
                        for m in self.client.messages):
            trim = [*trim, {"id": self._unique(PLACEHOLDER), "role": "reasoning",
                            "content": ""}]
        return [_snapshot(trim, None)]

    def _clear(self, own: list[AguiMessage], final: list[AguiMessage]) -> list[dict[str, Any]]:
        """For a client whose messages are not known (it resumed without
        posting them): a ``MESSAGES_SNAPSHOT`` of its own messages only (and
        a placeholder reasoning message, so its reasoning goes too, when the
        final snapshot has reasoning to drop the placeholder)."""
        placeholder = {"id": self._unique(PLACEHOLDER), "role": "reasoning", "content": ""}
        reasoning = any(m["role"] == "reasoning" for m in final)
        return [_snapshot([*own, *([placeholder] if reasoning else [])], None)]

    def _stamped(self, group: list[dict[str, Any]], ts: int | None) -> list[dict[str, Any]]:
        """The group with its timestamps, applied to what the client holds."""
        out = []
        for event in group:
            if ts is not None and "timestamp" not in event:
                event = {"type": event["type"], "timestamp": ts,
                         **{k: v for k, v in event.items() if k != "type"}}
            self.client.apply(event)
            out.append(event)
        return out


def _bare(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if v is not None}

"""What a stock AG-UI 1.0 client holds (``ClientState``: the messages
``@ag-ui/client``'s ``defaultApplyEvents`` builds from the events this
package writes), and the messages of a run (``messages``): the
``MESSAGES_SNAPSHOT`` a finished turn ends with. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from processor.engine.agui import project
from processor.wire.outputs import Meta, Response, Status

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
        self._reset([copy_message(m) for m in messages or []])

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
    kept = [copy_message(named.get(m["id"], m)) for m in held
            if m["id"] in named or (m["role"] == "reasoning" and not reasoning)]
    have = {m["id"] for m in kept}
    return kept + [copy_message(m) for m in snapshot if m["id"] not in have]


def copy_message(message: AguiMessage) -> AguiMessage:
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
    return snapshot_of(messages(run), ts)


def snapshot_of(held: list[AguiMessage], ts: int | None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "MESSAGES_SNAPSHOT", "timestamp": ts,
                             "messages": [copy_message(m) for m in held]}
    return {k: v for k, v in event.items() if v is not None}

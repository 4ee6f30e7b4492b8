"""The AG-UI 1.0 projection of a running turn (``processor serve
?format=agui``): ``LiveRun`` turns the worker's live events into AG-UI
events for one client, with ``project``'s ids, and ends it with the merged
response's ``MESSAGES_SNAPSHOT`` (``processor.engine.agui_client``). Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from processor.engine.agui import (
    PROTOCOL_VERSION,
    TEXT_ROLES,
    call_name,
    ending,
    project,
    result_text,
    thread_and_run_of,
)
from processor.engine.agui_client import (
    AguiMessage,
    ClientState,
    copy_message,
    messages,
    snapshot_of,
)
from processor.engine.combine import turn_tag
from processor.wire.ids import TurnKey
from processor.wire.outputs import ErrorInfo, Meta, Response, Status

#: The id of the empty reasoning message a trimming snapshot holds (see
#: ``LiveRun.finish``); never one of a client's own messages.
PLACEHOLDER = "processor:trim"


#: The suffixes this module derives AG-UI ids with (and ``~``, made unique).
_DERIVED = re.compile(r"(?::reasoning|:result|:call\d+)?~*$")


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
            self.given = [copy_message(m) for m in given]
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
        return [snapshot_of(self._own(merged, response, meta), None), *run[1:-1]]

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
        group = [*self.close(steps=True), *head, snapshot_of(final, ts), run[-1]]
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
        role = held["role"] if held is not None and held["role"] in TEXT_ROLES else "assistant"
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
        now = [copy_message(m) for m in self.client.messages]
        for message in now:
            if field == "arguments":
                for call in message.get("toolCalls") or ():
                    if call.get("id") == target:
                        call["function"]["arguments"] = value
            elif message["id"] == target:
                message[field] = value
        now = [m for m in now if m["id"] != target or m.get("content") or m.get("toolCalls")]
        return [*out, snapshot_of(now, None)]

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
        return [snapshot_of(trim, None)]

    def _clear(self, own: list[AguiMessage], final: list[AguiMessage]) -> list[dict[str, Any]]:
        """For a client whose messages are not known (it resumed without
        posting them): a ``MESSAGES_SNAPSHOT`` of its own messages only (and
        a placeholder reasoning message, so its reasoning goes too, when the
        final snapshot has reasoning to drop the placeholder)."""
        placeholder = {"id": self._unique(PLACEHOLDER), "role": "reasoning", "content": ""}
        reasoning = any(m["role"] == "reasoning" for m in final)
        return [snapshot_of([*own, *([placeholder] if reasoning else [])], None)]

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

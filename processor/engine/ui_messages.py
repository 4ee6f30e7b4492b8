"""The Vercel AI SDK's UI message stream (protocol v1) of one turn
(``GET /v1/turns/{id}/stream``, docs/serve.md "The AI SDK").

Pure: the worker's live events, a snapshot or the merged response in, UI
message chunks (``UIMessageChunk`` JSON objects, as ``ai``'s
``uiMessageChunkSchema`` has them) out; the serve side frames them as SSE.

What a client builds from them (``readUIMessageStream``, ``useChat``): one
assistant ``UIMessage`` per turn, ``id`` its synthesis id, in one step
(``start``, ``start-step`` ... ``finish-step``, then ``finish``, ``abort``
or ``error``). Its parts, in the merged response's order:

- per merged message, one ``text`` part (chunk id: the message id) with the
  message's text contents joined, where its first non-empty text is, and
  one ``reasoning`` part (``id``: the message id) the same way;
- per function call, a ``dynamic-tool`` part (``toolCallId``: the call's
  id, ``~`` appended if another call of the turn has it; ``toolName``: its
  name; ``providerExecuted``: the agent ran it, not the browser) with its
  ``input``, the arguments as parsed JSON (``{}`` for none; arguments
  that never became JSON stay ``input-streaming`` with their text as
  ``rawInput``, or, once answered, are the input as a string), and its
  ``output``, the result of the last function result naming the call
  (``output-available``). Results that name no call of the turn, and
  other contents (data, uri, errors, unknown types), stay in the merged
  response only;
- every part's ``providerMetadata`` (``callProviderMetadata`` for tools)
  is ``{"processor": {"messageId", "authorName", "agentId"}}`` (the names
  known): how a UI tells agents apart and sees a handoff.

Live, the message grows by appends: deltas to open parts, new parts at the
end. Every part stays open until the turn ends (agents interleave). When
what the live events say can no longer be reached by appends (the merge
rewrote the past: a ``replace`` chunk, a message folded into another, a
call's input that changed after it was complete), the stream sends
``reset-step``, which removes every part of the current step, and then
the whole message as it now is. That is the only rewrite the protocol
has, and it reaches only the current step: this is why a turn is one
step (steps per agent would leave an earlier agent's text uncorrectable).
At the end, the message is brought to the merged response the same way
(appends when they suffice), so every client ends with the merged
response's parts, however it joined.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processor.engine.ui_parts import TEXT_KINDS, Chunk, Part, TextPart, TurnParts, reconcile
from processor.wire.outputs import Response

#: The merged response's ``finish_reason`` -> the AI SDK's ``finishReason``.
FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "tool-calls",
                  "content_filter": "content-filter"}


@dataclass(frozen=True, slots=True)
class Ending:
    """How a turn ended, as its terminal event says (docs/contract.md §5.2)."""

    status: str
    error_message: str | None = None
    cancel_reason: str | None = None

    @classmethod
    def of_event(cls, event: Mapping[str, Any]) -> Ending:
        error = event.get("error")
        message = error.get("message") if isinstance(error, Mapping) else None
        reason = event.get("cancel_reason")
        return cls(str(event.get("status", "")), message if isinstance(message, str) else None,
                   reason if isinstance(reason, str) else None)


class UiStream:
    """The chunks of one open stream, in order: what the client holds is
    known here (every chunk sent is folded into ``client``), so each
    change is sent as the fewest chunks that reach it."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.started = False
        self.ended = False
        self.turn = TurnParts()
        self.client: list[Part] = []
        self._at: dict[tuple[str, str], int] = {}  # (kind, id) of a text part -> its index

    def _start(self) -> list[Chunk]:
        if self.started:
            return []
        self.started = True
        return [{"type": "start", "messageId": self.message_id}, {"type": "start-step"}]

    def _sync(self, final: bool) -> list[Chunk]:
        chunks, self.client = reconcile(self.client, self.turn.parts(final))
        self._at = {(p.kind, p.id): i for i, p in enumerate(self.client)
                    if isinstance(p, TextPart)}
        return chunks

    def snapshot(self, response: Response) -> list[Chunk]:
        """A running turn's merge so far (a client that has nothing)."""
        self.turn = TurnParts.of_response(response)
        return [*self._start(), *self._sync(False)]

    def event(self, event: Mapping[str, Any]) -> list[Chunk]:
        """One live event (the terminal one: ``end``)."""
        if self.ended:
            return []
        head = self._start()
        kind = event.get("type")
        part = TEXT_KINDS.get(kind)  # type: ignore[arg-type]
        delta = event.get("delta")
        if part is not None and not event.get("replace") and isinstance(delta, str) and delta:
            fast = self._append(part, event)
            if fast is not None:
                return [*head, *fast]
        if self.turn.apply(event) is None:
            return head
        return [*head, *self._sync(False)]

    def _append(self, part: str, event: Mapping[str, Any]) -> list[Chunk] | None:
        """The usual event, a delta to a text part the client has, with
        nothing else changed: one delta chunk, without a full compare."""
        mid = event.get("message_id") or ""
        at = self._at.get((part, mid))
        held = self.turn.messages.get(mid)
        if at is None or held is None:
            return None
        meta = held.meta
        if (event.get("author_name") or meta.author_name) != meta.author_name or (
                event.get("agent_id") or meta.agent_id) != meta.agent_id:
            return None
        have = self.client[at]
        assert isinstance(have, TextPart)
        if have.text is not held.texts[part]:
            return None
        self.turn.apply(event)
        self.client[at] = TextPart(part, mid, held.texts[part], meta)
        return [{"type": f"{part}-delta", "id": mid, "delta": event["delta"]}]

    def end(self, ending: Ending, merged: Response | None,
            finish_reason: str | None = None) -> list[Chunk]:
        """The end of the turn: the message brought to the merged response
        (when known), its parts closed, the step finished, and ``finish``
        (completed), ``abort`` (cancelled, ``reason``: the cancel's) or
        ``error`` (``errorText``)."""
        if self.ended:
            return []
        out = self._start()
        if merged is not None:
            self.turn = TurnParts.of_response(merged)
            out += self._sync(True)
        out += [{"type": f"{p.kind}-end", "id": p.id} for p in self.client
                if isinstance(p, TextPart)]
        out.append({"type": "finish-step"})
        if ending.status == "completed":
            finish: Chunk = {"type": "finish"}
            reason = FINISH_REASONS.get(finish_reason or "", "other" if finish_reason else None)
            if reason is not None:
                finish["finishReason"] = reason
            out.append(finish)
        elif ending.status == "cancelled":
            out.append({"type": "abort", **({"reason": ending.cancel_reason}
                                            if ending.cancel_reason is not None else {})})
        else:
            out.append({"type": "error", "errorText": ending.error_message or
                        f"the turn ended with status {ending.status or 'unknown'}"})
        self.ended = True
        return out

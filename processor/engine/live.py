"""Live progress: the events that tell a UI how a running turn's merge moved.

Pure. ``live_events`` compares the turn's merged response after a
batch (the real merge, ``processor.engine.merge.Turn.finish``) with what the
turn's live events have said so far (``Shown``), and returns the
events that bring a reader from one to the other, coalesced: per message
at most one text chunk, one reasoning chunk, one chunk per function call
and one event per new or changed function result (a message's reasoning
chunk before its text chunk when its reasoning began first, as in its
contents), plus a ``step`` when the turn's latest activity moved. Ids and
order are the merged response's, so a reader that applies the events
holds exactly the merge:

- ``synthesis.chunk`` / ``reasoning.chunk`` / ``tool_call.chunk``: the
  ``delta`` is appended to what the earlier chunks of the same message
  (and call) said; with ``replace`` it *is* the whole text so far. The
  merge can rewrite the past: a snapshot update (``merge_mode``
  ``replace``), an id-less run folded into the keyed message after it, a
  keyed update rejoining its message: the next chunk of that message then
  replaces. A message that is no longer in the merge (folded into the next
  one) gets a ``replace`` chunk with an empty text and ``role`` None (and
  one for its reasoning, if it had any): a reader drops it, calls and
  results included. So does a message that has fewer calls or results
  than were shown (the merge moved one elsewhere); then everything it has
  is sent again, each chunk with ``replace``, and so is the first chunk of
  a call that later takes the place of one it lost (so a reader that does
  not drop messages still holds every text, reasoning and call right).
- ``tool_result``: a function result, whole, when it appears or changes.
- ``step``: what the turn does now (``thinking``, ``tool_call``,
  ``tool_result``, ``text``), the message in ``step_data.message_id``.

Every event of a message also says where the message stands in the
merge: its ``role`` and ``previous_message_id`` (the nearest message
before it that has live events, None when there is none), so a reader
that places each message after its previous one holds the merged order
(a message can land above one shown before it: the merge groups messages
by their agent run).

So, for every turn: per message, the text of its chunks since its last
``replace`` one, concatenated, is that message's text in the merged
response (``tests/engine/test_live.py`` checks it over random turns).
``seq`` is left at 0: the Lua step that publishes the events numbers them
(``includes/publish_event.lua``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from processor.engine.shown import Layout, Placed, Shown
from processor.wire.ids import TurnKey
from processor.wire.models import TURN_IDS
from processor.wire.outputs import (
    Event,
    Message,
    ReasoningChunk,
    Response,
    Step,
    StepKind,
    SynthesisChunk,
    ToolCallChunk,
    ToolResult,
)

_json = msgspec.json.Encoder()

_STEP_OF: dict[str, StepKind] = {
    "text_reasoning": "thinking",
    "function_call": "tool_call",
    "function_result": "tool_result",
    "text": "text",
}


def message_text(message: Message, kind: str = "text") -> str:
    """The text of a message's contents of one ``kind``, joined (what its
    chunks of that kind add up to)."""
    contents = message.contents
    if len(contents) == 1:  # (the usual message: no join)
        only = contents[0]
        return (only.text or "") if only.type == kind else ""
    return "".join(c.text or "" for c in contents if c.type == kind)


def arguments_text(arguments: Any) -> str:
    """A call's arguments as its chunks spell them: text as it is, anything
    else as JSON."""
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return arguments
    return _json.encode(arguments).decode()


def _delta(before: str | None, now: str) -> tuple[str, bool] | None:
    """The chunk that takes ``before`` to ``now``: ``(delta, replace)``, or
    None when nothing changed."""
    if before is None:
        return (now, False) if now else None
    if now is before or now == before:
        return None
    if now.startswith(before):
        return now[len(before):], False
    return now, True


def live_events(
    key: TurnKey, ids: dict[str, str], shown: Shown, response: Response, ts: int,
    mark: int = 0,
) -> tuple[list[Event], Shown]:
    """The events from ``shown`` to ``response``, and what is shown after them.

    ``ids``: the turn's correlation ids (its state's, see
    ``processor.engine.events.turn_ids``). ``shown`` is not changed.
    ``mark``: the turn's ``Turn.mark`` from this render on, if not 0: what
    is shown after then has the render's ``Layout``
    (processor.engine.live_growth).

    One pass over each message's contents (run for every turn a batch
    moved, so kept lean): its text, reasoning and last step kind, and its
    calls and results only when it has any."""
    made = Made(key, ids, ts)
    events: list[Event] = []
    # (Calls and results are copied: a message's are known until it leaves
    # the merge, below.)
    after = Shown(calls=dict(shown.calls), results=dict(shown.results), step=shown.step,
                  tooled=shown.tooled, dropped=shown.dropped, stale=shown.stale)
    texts, reasoning = after.texts, after.reasoning
    was_texts, was_reasoning = shown.texts, shown.reasoning
    step: tuple[str, str] | None = None
    step_message: Message | None = None
    previous: str | None = None
    tooled, dropped = shown.tooled, shown.dropped
    tooled_here = 0  # of them, in the merge now
    placed: dict[str, Placed] | None = {} if mark else None
    for position, message in enumerate(response.messages):
        mid = message.message_id or ""
        role = message.role
        contents = message.contents
        tools = False
        thought_first = False  # its reasoning begins before its text: its chunk goes first
        last: str | None
        if len(contents) == 1:  # (the usual message)
            only = contents[0]
            last = only.type
            text = (only.text or "") if last == "text" else ""
            thought = (only.text or "") if last == "text_reasoning" else ""
            tools = last == "function_call" or last == "function_result"
            if last not in _STEP_OF:
                last = None
        else:
            last = None
            text_parts: list[str] = []
            thought_parts: list[str] = []
            for content in contents:
                kind = content.type
                if kind == "text":
                    text_parts.append(content.text or "")
                elif kind == "text_reasoning":
                    if content.text and not thought_first and not any(text_parts):
                        thought_first = True
                    thought_parts.append(content.text or "")
                elif kind == "function_call" or kind == "function_result":
                    tools = True
                if kind in _STEP_OF:
                    last = kind
            text, thought = "".join(text_parts), "".join(thought_parts)
        agent: Any = _UNSET
        # A message with fewer calls or results than shown (the merge moved
        # one to another message): a reader drops it and gets it anew; so
        # does one back in the merge after it left.
        fresh = False
        if tooled or dropped:  # (only turns with calls or results pay)
            if mid in tooled:
                tooled_here += 1
                fresh = _shrunk(message, mid, shown)
                if fresh:
                    events.append(_replace(made.proto(SynthesisChunk), message_id=mid,
                                           delta="", replace=True))
            elif mid in dropped:
                fresh = True
                after.dropped = after.dropped - {mid}
            if fresh:
                after.stale = after.stale.union(k for k in after.calls if k[0] == mid)
                after.calls = {k: v for k, v in after.calls.items() if k[0] != mid}
                after.results = {k: v for k, v in after.results.items() if k[0] != mid}
        at = len(events)  # where this message's events begin (after a drop marker)
        if text or mid in was_texts:
            texts[mid] = text
            found = (_again if fresh else _delta)(was_texts.get(mid), text)
            if found is not None:
                agent = message.additional_properties.get("agent_id")
                events.append(_replace(made.proto(SynthesisChunk), message_id=mid,
                                       agent_id=agent, author_name=message.author_name,
                                       delta=found[0], replace=found[1], role=role,
                                       previous_message_id=previous))
        if thought or mid in was_reasoning:
            reasoning[mid] = thought
            found = (_again if fresh else _delta)(was_reasoning.get(mid), thought)
            if found is not None:
                if agent is _UNSET:
                    agent = message.additional_properties.get("agent_id")
                events.append(_replace(made.proto(ReasoningChunk), message_id=mid,
                                       agent_id=agent, author_name=message.author_name,
                                       delta=found[0], replace=found[1], role=role,
                                       previous_message_id=previous))
                if thought_first and len(events) > at + 1:
                    events.insert(at, events.pop())  # in the message's order
        if tools:
            _tool_events(events, made, message, mid, previous, Shown() if fresh else shown,
                         after, fresh)
        if last is not None:
            step, step_message = (mid, last), message
        if placed is not None:
            if agent is _UNSET:
                agent = message.additional_properties.get("agent_id")
            calls = sum(c.type == "function_call" for c in contents) if tools else 0
            placed[mid] = Placed(position, previous, role, agent, message.author_name, calls)
        if text or thought or tools:  # (a reader knows it: it had events)
            previous = mid
    present = len(texts) + len(reasoning)
    # Messages no longer in the merge: their text (and reasoning) is gone.
    for mid, text in was_texts.items():
        if mid not in texts and text:
            events.append(_replace(made.proto(SynthesisChunk), message_id=mid, delta="",
                                   replace=True))
            texts[mid] = ""
    for mid, thought in was_reasoning.items():
        if mid not in reasoning and thought:
            events.append(_replace(made.proto(ReasoningChunk), message_id=mid, delta="",
                                   replace=True))
            reasoning[mid] = ""
    if tooled_here < len(tooled):
        _gone_tools(events, made, response, was_texts, after)
    if step is not None and step != shown.step and step_message is not None:
        after.step = step
        events.insert(0, _replace(
            made.proto(Step), agent_id=step_message.additional_properties.get("agent_id"),
            agent_name=step_message.author_name, step=_STEP_OF[step[1]],
            step_data={"message_id": step[0]}))
    if placed is not None:
        after.layout = Layout(mark, placed, len(texts) + len(reasoning) > present)
    return events, after


_UNSET: Any = object()

_replace = msgspec.structs.replace
_E = TypeVar("_E", SynthesisChunk, ReasoningChunk, ToolCallChunk, ToolResult, Step)

#: One blank event per kind of live event (every turn-level field at its
#: default): a turn's events are copies of it (``msgspec.structs.replace``
#: with a few fields is several times cheaper than building a Struct of
#: sixteen fields from keywords, and the diff runs for every turn a batch moves).
_BLANK: dict[type, Any] = {
    SynthesisChunk: SynthesisChunk(synthesis_id="", response_id="", seq=0, ts=0, message_id=None,
                                   agent_id=None, author_name=None, delta=""),
    ReasoningChunk: ReasoningChunk(synthesis_id="", response_id="", seq=0, ts=0, message_id="",
                                   agent_id=None, author_name=None, delta=""),
    ToolCallChunk: ToolCallChunk(synthesis_id="", response_id="", seq=0, ts=0, message_id="",
                                 index=0, call_id=None, name=None, agent_id=None,
                                 author_name=None, delta=""),
    ToolResult: ToolResult(synthesis_id="", response_id="", seq=0, ts=0, message_id="", index=0,
                           call_id=None, agent_id=None, author_name=None, result=None),
    Step: Step(synthesis_id="", response_id="", seq=0, ts=0, agent_id=None, agent_name=None,
               step="text", content="", step_data={}, step_id=None, tool_call_id=None,
               action_id=None, evidence_id=None),
}


class Made:
    """A turn's event of each kind with its turn-level fields (``seq`` 0),
    made from ``_BLANK`` when first needed: its events copy it."""

    __slots__ = ("ids", "protos", "response_id", "synthesis_id", "ts")

    def __init__(self, key: TurnKey, ids: dict[str, str], ts: int) -> None:
        self.synthesis_id, self.response_id, self.ts = key.synthesis_id(), key.response_id, ts
        named: dict[str, Any] = {}  # (the turn-level ids it has: most turns have none)
        if ids:
            for name in TURN_IDS:
                value = ids.get(name)
                if value is not None and name != "attempt_id":
                    named[name] = value
        if key.attempt_id:
            named["attempt_id"] = key.attempt_id
        self.ids = named
        self.protos: dict[type, Any] = {}

    def proto(self, cls: type[_E]) -> _E:
        made: _E | None = self.protos.get(cls)
        if made is None:
            made = _replace(_BLANK[cls], synthesis_id=self.synthesis_id,
                            response_id=self.response_id, ts=self.ts)
            if self.ids:
                made = _replace(made, **self.ids)
            self.protos[cls] = made
        return made


def _tool_events(events: list[Event], made: Made, message: Message, mid: str,
                 previous: str | None, shown: Shown, after: Shown, fresh: bool = False) -> None:
    """A message's call chunks and results (in its contents' order) that
    ``shown`` lacks, appended to ``events``; ``after`` records them.
    ``previous``: the id of the message before it in the merge; ``fresh``:
    the message is sent anew, its calls' chunks replace."""
    agent = message.additional_properties.get("agent_id")
    author = message.author_name
    role = message.role
    calls = results = 0
    for content in message.contents:
        kind = content.type
        if kind == "function_call":
            where = (mid, calls)
            calls += 1
            args = arguments_text(content.arguments)
            after.calls[where] = args
            was = shown.calls.get(where)
            found = _delta(was, args)
            if found is None and was is None:
                found = ("", False)  # a call announced before its arguments
            if found is not None:
                stale = where in after.stale
                if stale:
                    after.stale = after.stale - {where}
                events.append(_replace(
                    made.proto(ToolCallChunk), message_id=mid, index=where[1],
                    call_id=content.call_id, name=content.name, agent_id=agent,
                    author_name=author, delta=found[0],
                    replace=(found[1] or fresh or stale
                             or not isinstance(content.arguments, str | None)),
                    role=role, previous_message_id=previous))
        elif kind == "function_result":
            where = (mid, results)
            results += 1
            after.results[where] = content.result
            if where not in shown.results or shown.results[where] != content.result:
                events.append(_replace(made.proto(ToolResult), message_id=mid, index=where[1],
                                       call_id=content.call_id, agent_id=agent,
                                       author_name=author, result=content.result, role=role,
                                       previous_message_id=previous))
    if (calls or results) and mid not in after.tooled:
        after.tooled = after.tooled | {mid}


def _again(before: str | None, now: str) -> tuple[str, bool] | None:
    """The chunk of a message sent anew: its whole text, replacing (so a
    reader that did not drop the message holds it too); None when there
    was and is nothing."""
    if before is None and not now:
        return None
    return now, True


def _shrunk(message: Message, mid: str, shown: Shown) -> bool:
    """Whether ``shown`` has more calls or more results of the message than
    the merge now gives it (their indices are 0, 1, ...)."""
    calls = results = 0
    for content in message.contents:
        if content.type == "function_call":
            calls += 1
        elif content.type == "function_result":
            results += 1
    return (mid, calls) in shown.calls or (mid, results) in shown.results


def _gone_tools(events: list[Event], made: Made, response: Response,
                was_texts: dict[str, str], after: Shown) -> None:
    """Messages with calls or results shown that are no longer in the merge
    (folded into another): unless their text's empty ``replace`` chunk says
    so already, an empty ``replace`` text chunk (``role`` None) tells a
    reader the message is gone. Should one come back, it is sent anew."""
    present = {m.message_id or "" for m in response.messages}
    gone = [mid for mid in sorted(after.tooled) if mid not in present]
    after.tooled = after.tooled.difference(gone)
    after.dropped = after.dropped.union(gone)
    for mid in gone:
        if not was_texts.get(mid):
            events.append(_replace(made.proto(SynthesisChunk), message_id=mid, delta="",
                                   replace=True))

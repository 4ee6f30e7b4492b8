"""The parts of a turn's assistant ``UIMessage`` (the AI SDK's UI message
stream, ``processor.engine.ui_messages`` says which parts and why) and the
chunks that bring what a client holds to what it should hold
(``reconcile``). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from processor.engine.live import arguments_text
from processor.wire.outputs import Response

#: One UI message chunk, as its JSON object.
Chunk = dict[str, Any]

_encode = msgspec.json.Encoder().encode
_EMPTY_INPUT = b"{}"


@dataclass(frozen=True, slots=True)
class Meta:
    """Who wrote a part: its merged message's id, author and agent."""

    message_id: str
    author_name: str | None = None
    agent_id: str | None = None

    def provider_metadata(self) -> dict[str, dict[str, str]]:
        named = {"messageId": self.message_id, "authorName": self.author_name,
                 "agentId": self.agent_id}
        return {"processor": {k: v for k, v in named.items() if v is not None}}


@dataclass(frozen=True, slots=True)
class TextPart:
    """A ``text`` or ``reasoning`` part (``kind``), its chunk id and text."""

    kind: str
    id: str
    text: str
    meta: Meta


@dataclass(frozen=True, slots=True)
class ToolPart:
    """A ``dynamic-tool`` part. ``args``: the arguments as text so far;
    ``done``: its input is known (``input``, JSON); ``output``: the result's
    JSON, None before there is one."""

    id: str
    name: str
    args: str
    done: bool
    input: bytes
    output: bytes | None
    meta: Meta


Part = TextPart | ToolPart


# --------------------------------------------------------------------------- a turn's parts


@dataclass
class _Call:
    call_id: str | None
    name: str | None
    args: str


@dataclass
class _Message:
    meta: Meta
    #: The parts of the message in order: ("text", 0), ("reasoning", 0), ("call", index).
    order: list[tuple[str, int]] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=lambda: {"text": "", "reasoning": ""})
    calls: dict[int, _Call] = field(default_factory=dict)
    results: dict[int, tuple[str | None, bytes]] = field(default_factory=dict)


TEXT_KINDS = {"synthesis.chunk": "text", "reasoning.chunk": "reasoning"}
#: The live events that change a turn's parts.
LIVE_KINDS = frozenset({*TEXT_KINDS, "tool_call.chunk", "tool_result"})


class TurnParts:
    """What a turn's parts are: built from a response (a snapshot, the
    merged response) or moved by live events, the same way."""

    def __init__(self) -> None:
        self.messages: dict[str, _Message] = {}

    @classmethod
    def of_response(cls, response: Response) -> TurnParts:
        turn = cls()
        for message in response.messages:
            mid = message.message_id or ""
            meta = Meta(mid, message.author_name, message.additional_properties.get("agent_id"))
            held = turn.messages.setdefault(mid, _Message(meta))
            calls = results = 0
            for content in message.contents:
                kind = content.type
                if kind in ("text", "text_reasoning"):
                    part = "text" if kind == "text" else "reasoning"
                    held.texts[part] += content.text or ""
                    if content.text and (part, 0) not in held.order:
                        held.order.append((part, 0))
                elif kind == "function_call":
                    held.calls[calls] = _Call(content.call_id, content.name,
                                              arguments_text(content.arguments))
                    held.order.append(("call", calls))
                    calls += 1
                elif kind == "function_result":
                    held.results[results] = (content.call_id, _encode(content.result))
                    results += 1
        return turn

    def apply(self, event: Mapping[str, Any]) -> _Message | None:
        """Take in a live event (``processor.engine.live``); its message, or
        None for an event that changes no part."""
        kind = event.get("type")
        if kind not in LIVE_KINDS or not _well_formed(kind, event):
            return None
        mid = event.get("message_id") or ""
        held = self.messages.get(mid)
        author, agent = event.get("author_name"), event.get("agent_id")
        if held is None:
            held = self.messages[mid] = _Message(Meta(mid, author, agent))
        elif (author is not None and author != held.meta.author_name) or (
                agent is not None and agent != held.meta.agent_id):
            held.meta = Meta(mid, author or held.meta.author_name, agent or held.meta.agent_id)
        part = TEXT_KINDS.get(kind)
        if part is not None:
            delta: str = event["delta"]
            text = delta if event.get("replace") else held.texts[part] + delta
            held.texts[part] = text
            if text and (part, 0) not in held.order:
                held.order.append((part, 0))
            elif not text and (part, 0) in held.order:
                held.order.remove((part, 0))  # folded into another message: gone
        elif kind == "tool_call.chunk":
            index: int = event["index"]
            call = held.calls.get(index)
            if call is None:
                call = held.calls[index] = _Call(None, None, "")
                held.order.append(("call", index))
            call.args = event["delta"] if event.get("replace") else call.args + event["delta"]
            call.call_id = event.get("call_id") or call.call_id
            call.name = event.get("name") or call.name
        else:
            held.results[event["index"]] = (event.get("call_id"), _encode(event.get("result")))
        return held

    def parts(self, final: bool) -> list[Part]:
        """The parts, in order. ``final``: of the merged response (a call
        without arguments is complete, with input ``{}``)."""
        out: list[Part] = []
        used: set[str] = set()
        owner: dict[str, int] = {}  # a producer call id -> the index of its (first) part
        for mid, held in self.messages.items():
            for part, index in held.order:
                if part != "call":
                    out.append(TextPart(part, mid, held.texts[part], held.meta))
                    continue
                call = held.calls[index]
                tool_id = call.call_id or f"{mid}:call"
                while tool_id in used:
                    tool_id += "~"
                used.add(tool_id)
                if call.call_id is not None:
                    owner.setdefault(call.call_id, len(out))
                out.append(ToolPart(tool_id, call.name or "", call.args, False, b"", None,
                                    held.meta))
        outputs: dict[int, bytes] = {}
        for held in self.messages.values():
            for _index, (call_id, result) in sorted(held.results.items()):
                if call_id is not None and call_id in owner:
                    outputs[owner[call_id]] = result
        for i, made in enumerate(out):
            if isinstance(made, ToolPart):
                output = outputs.get(i)
                done, value = _input(made.args, output is not None, final)
                out[i] = ToolPart(made.id, made.name, made.args, done, value, output, made.meta)
        return out


def _well_formed(kind: str, event: Mapping[str, Any]) -> bool:
    """Whether a live event has the fields its kind needs (docs/contract.md
    §5.2): one that does not is left out, not a crash of the stream."""
    if kind != "tool_result" and not isinstance(event.get("delta"), str):
        return False
    if kind in ("tool_call.chunk", "tool_result") and not isinstance(event.get("index"), int):
        return False
    return all(isinstance(event.get(name), str | None) for name in (
        "message_id", "author_name", "agent_id", "call_id", "name"))


def _input(args: str, answered: bool, final: bool) -> tuple[bool, bytes]:
    """Whether a call's input is complete, and its JSON: the arguments once
    they parse as JSON; none at the end or once answered: ``{}``; text that
    never parsed but was answered: that text, as a string."""
    if not args:
        return final or answered, _EMPTY_INPUT
    try:
        return True, _encode(msgspec.json.decode(args))
    except msgspec.DecodeError:
        return answered, _encode(args)


# --------------------------------------------------------------------------- chunks


def reconcile(client: list[Part], target: list[Part]) -> tuple[list[Chunk], list[Part]]:
    """The chunks that take a client holding ``client`` to ``target``, and
    what it holds after them: appends when they suffice, else ``reset-step``
    and the whole of ``target``."""
    if len(target) >= len(client):
        chunks: list[Chunk] = []
        for have, want in zip(client, target, strict=False):
            step = _extend(have, want)
            if step is None:
                break
            chunks += step
        else:
            for want in target[len(client):]:
                chunks += _open(want)
            return chunks, list(target)
    chunks = [{"type": "reset-step"}]
    for want in target:
        chunks += _open(want)
    return chunks, list(target)


def _extend(have: Part, want: Part) -> list[Chunk] | None:
    """The chunks that update part ``have`` in place to ``want``; None if
    the protocol has none (then the message is sent again)."""
    if isinstance(have, TextPart):
        if not isinstance(want, TextPart) or (want.kind, want.id) != (have.kind, have.id):
            return None
        if want.text is not have.text and not want.text.startswith(have.text):
            return None
        rest = want.text[len(have.text):]
        if not rest and want.meta == have.meta:
            return []
        chunk: Chunk = {"type": f"{have.kind}-delta", "id": have.id, "delta": rest}
        if want.meta != have.meta:
            chunk["providerMetadata"] = want.meta.provider_metadata()
        return [chunk]
    if not isinstance(want, ToolPart) or want.id != have.id:
        return None
    if (have.output is not None and want.output is None) or (have.done and not want.done):
        return None
    if not want.done:
        if (want.name, want.meta) != (have.name, have.meta) or not want.args.startswith(have.args):
            return None
        rest = want.args[len(have.args):]
        return [{"type": "tool-input-delta", "toolCallId": have.id, "inputTextDelta": rest}] \
            if rest else []
    out: list[Chunk] = []
    # (tool-input-available resets a part's output: sent again after it)
    again = not have.done or (want.input, want.name, want.meta) != (
        have.input, have.name, have.meta)
    if again:
        out.append(_available(want))
    if want.output is not None and (again or want.output != have.output):
        out.append(_output(want))
    return out


def _open(part: Part) -> list[Chunk]:
    """The chunks that add ``part`` at the end of the message."""
    if isinstance(part, TextPart):
        start: list[Chunk] = [{"type": f"{part.kind}-start", "id": part.id,
                               "providerMetadata": part.meta.provider_metadata()}]
        if part.text:
            start.append({"type": f"{part.kind}-delta", "id": part.id, "delta": part.text})
        return start
    out: list[Chunk] = [{"type": "tool-input-start", "toolCallId": part.id,
                         "toolName": part.name, "dynamic": True, "providerExecuted": True,
                         "providerMetadata": part.meta.provider_metadata()}]
    if part.done:
        out.append(_available(part))
    elif part.args:
        out.append({"type": "tool-input-delta", "toolCallId": part.id,
                    "inputTextDelta": part.args})
    if part.output is not None:
        out.append(_output(part))
    return out


def _available(part: ToolPart) -> Chunk:
    return {"type": "tool-input-available", "toolCallId": part.id, "toolName": part.name,
            "input": msgspec.Raw(part.input), "dynamic": True, "providerExecuted": True,
            "providerMetadata": part.meta.provider_metadata()}


def _output(part: ToolPart) -> Chunk:
    assert part.output is not None
    return {"type": "tool-output-available", "toolCallId": part.id,
            "output": msgspec.Raw(part.output), "dynamic": True, "providerExecuted": True}

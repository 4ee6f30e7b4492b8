"""The AI SDK's side of a UI message stream, in Python, for the tests:

- ``Reader``: what ``ai``'s ``processUIMessageStream`` (7.0.173,
  tests/js/node_modules/ai/src/ui/process-ui-message-stream.ts) makes of a
  stream of chunks, for the chunk types processor sends: the same parts,
  the same errors for a chunk that names a part it does not have, and the
  required fields of ``uiMessageChunkSchema`` checked;
- ``expected_parts``: the parts a turn's merged response should give
  (docs/serve.md, "The AI SDK"), written from the merged response's JSON
  without processor's code;
- ``comparable``: a ``UIMessage``'s parts with what the two sides
  compute alike (a streaming input's partial parse is the JavaScript's own).
"""

from __future__ import annotations

import json
from typing import Any

#: Required fields (and their JSON types) of each chunk type processor sends.
_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "start": {}, "start-step": {}, "finish-step": {}, "reset-step": {}, "finish": {},
    "abort": {},
    "error": {"errorText": str},
    "text-start": {"id": str}, "text-delta": {"id": str, "delta": str}, "text-end": {"id": str},
    "reasoning-start": {"id": str}, "reasoning-delta": {"id": str, "delta": str},
    "reasoning-end": {"id": str},
    "tool-input-start": {"toolCallId": str, "toolName": str},
    "tool-input-delta": {"toolCallId": str, "inputTextDelta": str},
    "tool-input-available": {"toolCallId": str, "toolName": str},
    "tool-output-available": {"toolCallId": str},
}
_FINISH_REASONS = {"stop", "length", "content-filter", "tool-calls", "error", "interrupted",
                   "other"}


class StreamError(AssertionError):
    """What ``processUIMessageStream`` throws (``UIMessageStreamError``)."""


class Reader:
    """One ``readUIMessageStream``: chunks in, the message they build."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {"id": "", "role": "assistant", "parts": []}
        self.text: dict[str, dict[str, Any]] = {}
        self.reasoning: dict[str, dict[str, Any]] = {}
        self.partial: dict[str, str] = {}
        self.types: list[str] = []
        self.ending: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        kind = chunk.get("type")
        assert kind in _REQUIRED or str(kind).startswith("data-"), chunk
        for name, typ in _REQUIRED.get(kind, {}).items():  # type: ignore[arg-type]
            assert isinstance(chunk.get(name), typ), (name, chunk)
        if "providerMetadata" in chunk:
            meta = chunk["providerMetadata"]
            assert isinstance(meta, dict) and all(isinstance(v, dict) for v in meta.values())
        assert self.ending is None, f"{kind} after the end"
        self.types.append(kind)  # type: ignore[arg-type]
        getattr(self, "_" + kind.replace("-", "_"), self._other)(chunk)  # type: ignore[union-attr]

    def _current_step(self) -> list[dict[str, Any]]:
        parts = self.message["parts"]
        i = len(parts) - 1
        while i >= 0 and parts[i]["type"] != "step-start":
            i -= 1
        return parts[i + 1:]

    def _start(self, chunk: dict[str, Any]) -> None:
        if "messageId" in chunk:
            if chunk["messageId"] != self.message["id"] and self.message["id"]:
                self.__init__()  # type: ignore[misc]  # resetStateOnMessageIdChange
                self.types.append("start")
            self.message["id"] = chunk["messageId"]

    def _start_step(self, chunk: dict[str, Any]) -> None:
        self.message["parts"].append({"type": "step-start"})

    def _finish_step(self, chunk: dict[str, Any]) -> None:
        pass

    def _reset_step(self, chunk: dict[str, Any]) -> None:
        step = self._current_step()
        self.text, self.reasoning, self.partial = {}, {}, {}
        if step:
            del self.message["parts"][-len(step):]

    def _text_start(self, chunk: dict[str, Any], kind: str = "text") -> None:
        part: dict[str, Any] = {"type": kind, "text": "", "state": "streaming"}
        if kind == "reasoning":
            part["id"] = chunk["id"]
        if chunk.get("providerMetadata") is not None:
            part["providerMetadata"] = chunk["providerMetadata"]
        (self.text if kind == "text" else self.reasoning)[chunk["id"]] = part
        self.message["parts"].append(part)

    def _text_delta(self, chunk: dict[str, Any], kind: str = "text") -> None:
        part = (self.text if kind == "text" else self.reasoning).get(chunk["id"])
        if part is None:
            raise StreamError(f"{kind}-delta for missing {kind} part {chunk['id']!r}")
        part["text"] += chunk["delta"]
        if chunk.get("providerMetadata") is not None:
            part["providerMetadata"] = chunk["providerMetadata"]

    def _text_end(self, chunk: dict[str, Any], kind: str = "text") -> None:
        active = self.text if kind == "text" else self.reasoning
        part = active.pop(chunk["id"], None)
        if part is None:
            raise StreamError(f"{kind}-end for missing {kind} part {chunk['id']!r}")
        part["state"] = "done"

    def _reasoning_start(self, chunk: dict[str, Any]) -> None:
        self._text_start(chunk, "reasoning")

    def _reasoning_delta(self, chunk: dict[str, Any]) -> None:
        self._text_delta(chunk, "reasoning")

    def _reasoning_end(self, chunk: dict[str, Any]) -> None:
        self._text_end(chunk, "reasoning")

    def _tool(self, chunk: dict[str, Any], state: str, **fields: Any) -> None:
        """updateDynamicToolPart: the current step's part of the call, updated, or a new one."""
        assert chunk.get("dynamic") is True, chunk  # (else a static tool-<name> part)
        part = next((p for p in self._current_step() if p["type"] == "dynamic-tool"
                     and p["toolCallId"] == chunk["toolCallId"]), None)
        if part is None:
            part = {"type": "dynamic-tool", "toolCallId": chunk["toolCallId"]}
            self.message["parts"].append(part)
        part.update(state=state, toolName=fields.pop("toolName", part.get("toolName")))
        for name in ("input", "output", "rawInput"):
            part.pop(name, None)
        part.update(fields)
        if chunk.get("providerExecuted") is not None:
            part["providerExecuted"] = chunk["providerExecuted"]
        if chunk.get("providerMetadata") is not None:
            key = "resultProviderMetadata" if state == "output-available" else \
                "callProviderMetadata"
            part[key] = chunk["providerMetadata"]

    def _tool_input_start(self, chunk: dict[str, Any]) -> None:
        self.partial[chunk["toolCallId"]] = ""
        self._tool(chunk, "input-streaming", toolName=chunk["toolName"])

    def _tool_input_delta(self, chunk: dict[str, Any]) -> None:
        call = chunk["toolCallId"]
        if call not in self.partial:
            raise StreamError(f"tool-input-delta for missing tool call {call!r}")
        self.partial[call] += chunk["inputTextDelta"]
        self._tool({**chunk, "dynamic": True}, "input-streaming", rawInput=self.partial[call])

    def _tool_input_available(self, chunk: dict[str, Any]) -> None:
        assert "input" in chunk, chunk
        self._tool(chunk, "input-available", toolName=chunk["toolName"], input=chunk["input"])

    def _tool_output_available(self, chunk: dict[str, Any]) -> None:
        assert "output" in chunk, chunk
        part = next((p for p in reversed(self.message["parts"]) if p["type"] == "dynamic-tool"
                     and p["toolCallId"] == chunk["toolCallId"]), None)
        if part is None:
            raise StreamError(f"no tool invocation found for {chunk['toolCallId']!r}")
        inputs = {"input": part["input"]} if "input" in part else {}
        self._tool(chunk, "output-available", output=chunk["output"], **inputs)

    def _finish(self, chunk: dict[str, Any]) -> None:
        assert chunk.get("finishReason", "stop") in _FINISH_REASONS, chunk
        self.ending = chunk

    def _abort(self, chunk: dict[str, Any]) -> None:
        assert isinstance(chunk.get("reason", ""), str), chunk
        self.ending = chunk

    def _error(self, chunk: dict[str, Any]) -> None:
        self.ending = chunk

    def _other(self, chunk: dict[str, Any]) -> None:
        assert chunk.get("transient") is True, chunk  # processor's notices only


def read_sse(body: bytes) -> list[dict[str, Any]]:
    """The chunks of a UI message stream's body (``[DONE]`` must be last)."""
    chunks: list[dict[str, Any]] = []
    done = False
    for block in body.decode().split("\n\n"):
        data = [line[6:] for line in block.split("\n") if line.startswith("data: ")]
        if not data:
            continue
        assert not done, "data after [DONE]"
        if data == ["[DONE]"]:
            done = True
            continue
        chunks.append(json.loads("\n".join(data)))
    assert done, "no [DONE]"
    return chunks


# --------------------------------------------------------------------------- expected


def _meta(message: dict[str, Any]) -> dict[str, Any]:
    named = {"messageId": message.get("message_id") or "",
             "authorName": message.get("author_name"),
             "agentId": (message.get("additional_properties") or {}).get("agent_id")}
    return {"processor": {k: v for k, v in named.items() if v is not None}}


def expected_parts(response: dict[str, Any], final: bool = True) -> list[dict[str, Any]]:
    """The parts of the UIMessage of a turn whose merged response (JSON) is
    ``response``: a step, then per message its text (joined) where its
    first text is, its reasoning the same way, a tool part per call with its
    input parsed and the output of the last result naming it."""
    parts: list[dict[str, Any]] = [{"type": "step-start"}]
    calls: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for message in response["messages"]:
        mid, meta = message.get("message_id") or "", _meta(message)
        seen: set[str] = set()
        for content in message["contents"]:
            kind = {"text": "text", "text_reasoning": "reasoning"}.get(content["type"])
            if kind is not None and content.get("text") and kind not in seen:
                seen.add(kind)
                text = "".join(c.get("text") or "" for c in message["contents"]
                               if c["type"] == content["type"])
                part = {"type": kind, "text": text, "state": "done", "providerMetadata": meta}
                if kind == "reasoning":
                    part["id"] = mid
                parts.append(part)
            elif content["type"] == "function_call":
                tool_id = content.get("call_id") or f"{mid}:call"
                while tool_id in used:
                    tool_id += "~"
                used.add(tool_id)
                args = content.get("arguments")
                part = {"type": "dynamic-tool", "toolCallId": tool_id,
                        "toolName": content.get("name") or "", "providerExecuted": True,
                        "callProviderMetadata": meta,
                        "args": args if isinstance(args, str) else
                        "" if args is None else json.dumps(args)}
                if content.get("call_id"):
                    calls.setdefault(content["call_id"], part)
                parts.append(part)
    for message in response["messages"]:
        for content in message["contents"]:
            if content["type"] == "function_result" and content.get("call_id") in calls:
                calls[content["call_id"]]["output"] = content.get("result")
    for part in parts:
        if part["type"] != "dynamic-tool":
            continue
        args = part.pop("args")
        answered = "output" in part
        try:
            part["input"] = json.loads(args) if args else {}
            done = bool(args) or final or answered
        except ValueError:
            part["input"] = args
            done = answered
        if not done:
            del part["input"]
            part["rawInput"] = args
        part["state"] = "output-available" if answered else \
            "input-available" if done else "input-streaming"
    return parts


def comparable(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A UIMessage's parts with the fields both sides compute (a streaming
    tool's ``input`` is the AI SDK's partial parse of its ``rawInput``)."""
    keep = {"type", "text", "state", "id", "providerMetadata", "toolCallId", "toolName",
            "providerExecuted", "callProviderMetadata", "input", "output", "rawInput"}
    out = []
    for part in parts:
        kept = {k: v for k, v in part.items() if k in keep and v is not None}
        if kept.get("state") == "input-streaming":
            kept.pop("input", None)
        if part["type"] == "dynamic-tool" and kept.get("state") != "input-streaming":
            kept.pop("rawInput", None)
        out.append(kept)
    return out

"""What a ``processor.client.Subscriber`` yields: typed entries of the output streams."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processor.redis_io.replies import as_text


@dataclass(frozen=True, slots=True)
class MergedItem:
    """An entry of a ``merged`` stream: one finished turn (docs/contract.md §5.1)."""

    stream: str
    id: str
    response_id: str
    status: str
    response: dict[str, Any]
    meta: dict[str, Any]
    synthesis_id: str = ""
    attempt_id: str = ""

    @property
    def text(self) -> str:
        """The response's text, joined as Agent Framework's ``AgentResponse.text``
        joins it (no agent-framework needed): ``response_text``."""
        return response_text(self.response)

    def agent_response(self) -> Any:
        """The response as an ``agent_framework.AgentResponse`` (needs agent-framework)."""
        from agent_framework import AgentResponse

        return AgentResponse.from_dict(self.response)


def response_text(response: Mapping[str, Any]) -> str:
    """A merged response's text: each message's ``text`` contents joined with a
    space, the messages joined with nothing (as ``AgentResponse.text``)."""
    return "".join(
        " ".join(str(content.get("text", "")) for content in message.get("contents") or []
                 if content.get("type") == "text")
        for message in response.get("messages") or []
    )


@dataclass(frozen=True, slots=True)
class EventItem:
    """An entry of an ``events`` stream (docs/contract.md §5.2); ``event`` is the decoded JSON."""

    stream: str
    id: str
    event: dict[str, Any]

    @property
    def type(self) -> str:
        """``synthesis.started``, ``synthesis.chunk``, ``step`` or ``synthesis``."""
        return str(self.event.get("type", ""))

    @property
    def response_id(self) -> str:
        """The turn's ResponseId."""
        return str(self.event.get("response_id", ""))

    @property
    def synthesis_id(self) -> str:
        """The turn's synthesis id."""
        return str(self.event.get("synthesis_id", ""))


@dataclass(frozen=True, slots=True)
class EntryItem:
    """An entry of another stream (``dlq``, ``updates``): its fields as text."""

    stream: str
    id: str
    fields: dict[str, str]


Item = MergedItem | EventItem | EntryItem


def decode_item(stream: str, kind: str, entry_id: str, raw: Mapping[Any, Any]) -> Item:
    """A typed item from one stream entry."""
    fields = {as_text(k): v for k, v in raw.items()}
    if kind == "merged":
        return MergedItem(
            stream,
            entry_id,
            as_text(fields["response_id"]),
            as_text(fields["status"]),
            json.loads(fields["response"]),
            json.loads(fields["meta"]),
            as_text(fields.get("synthesis_id", "")),
            as_text(fields.get("attempt_id", "")),
        )
    if kind == "events":
        return EventItem(stream, entry_id, json.loads(fields["event"]))
    return EntryItem(stream, entry_id, {k: as_text(v) for k, v in fields.items()})


def xread_entries(reply: Any) -> list[tuple[str, list[Any]]]:
    """``(stream, [(id, fields), ...])`` pairs from an XREAD reply (RESP2 or RESP3)."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else reply
    out = []
    for name, entries in pairs:
        nested = (
            entries
            and isinstance(entries[0], list)
            and entries[0]
            and isinstance(entries[0][0], list | tuple)
        )
        out.append((as_text(name), entries[0] if nested else entries))
    return out


def entry_ms(entry_id: str) -> int:
    """The millisecond part of a stream entry id."""
    return int(entry_id.partition("-")[0])

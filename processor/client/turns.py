"""What a stream of one turn is made of, and the rule that orders it.

A client follows one synthesis: a ``response_id`` (plus its ``attempt_id``
when the turn has one). What it is sent:

- ``LiveEvent``: an event of the turn's ``events`` stream, as the
  worker published it (its JSON is sent as it is); its ``seq`` is the SSE
  ``id:``, the same on every replica.
- ``Snapshot``: the merge so far at some ``seq`` (the ``snapshot`` event).
- ``MergedOutput``: the turn's ``merged`` entry (the ``merged`` event),
  sent just before the terminal event: the final response, authoritative.

All three are read alike: ``item.type`` (the event's type: ``snapshot``,
``merged`` or the worker's), ``item.data`` (bytes: the event's JSON, what
the SSE ``data:`` line carries) and ``item.json()`` (that JSON decoded);
the two that hold a response also have ``item.text`` (its text, joined as
``AgentResponse.text`` joins it) and ``item.response_json()``.

``Cursor`` sends each seq once, in order. Pure: no Redis, no HTTP; in
the client package so that ``processor serve`` and ``Subscriber.follow``
(processor/client/follow.py) keep one rule (serve sits above the client).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from processor.client.items import response_text
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace, Shard

#: The type of the terminal event (docs/contract.md §5.2): always the turn's last seq.
TERMINAL = "synthesis"


@dataclass(frozen=True, slots=True)
class TurnRef:
    """The synthesis a request names. ``turn_id`` routes a turn sent without
    a ResponseId of its own (the processor assigned ``response_id`` from it
    and its shard is ``turn_id``'s, docs/contract.md §3)."""

    response_id: str
    attempt_id: str = ""
    turn_id: str | None = None

    @property
    def key(self) -> TurnKey:
        return TurnKey(self.response_id, self.attempt_id)

    def shard(self, namespace: Namespace) -> Shard:
        return namespace.shard_for(self.turn_id or self.response_id)

    def owns(self, response_id: str, attempt_id: str) -> bool:
        """Whether an output of ``(response_id, attempt_id)`` belongs to this synthesis."""
        return response_id == self.response_id and attempt_id == self.attempt_id


class _EventHead(msgspec.Struct):
    """The fields of an event's JSON that decide where it goes."""

    type: str
    seq: int


_head = msgspec.json.Decoder(_EventHead)
_decode_object = msgspec.json.Decoder(dict[str, Any])


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """One event of a turn: ``data`` is its JSON exactly as published."""

    seq: int
    type: str
    data: bytes

    @classmethod
    def decode(cls, data: bytes) -> LiveEvent:
        """From the ``event`` field of an events entry (``msgspec.DecodeError``
        if it has no ``type`` and integer ``seq``)."""
        head = _head.decode(data)
        return cls(head.seq, head.type, data)

    @property
    def terminal(self) -> bool:
        return self.type == TERMINAL

    def json(self) -> dict[str, Any]:
        """``data`` decoded: the event's fields (docs/contract.md §5.2)."""
        return _decode_object.decode(self.data)


class _Merged(msgspec.Struct, omit_defaults=True):
    type: Literal["merged"]
    response_id: str
    synthesis_id: str
    status: str
    response: msgspec.Raw
    meta: msgspec.Raw
    attempt_id: str | None = None


class _Snapshot(msgspec.Struct, omit_defaults=True):
    type: Literal["snapshot"]
    response_id: str
    synthesis_id: str
    seq: int
    response: msgspec.Raw
    attempt_id: str | None = None


_encode = msgspec.json.Encoder().encode


class _Response:
    """What an item holding a response (its JSON text, ``response``) offers."""

    __slots__ = ()
    response: bytes

    @property
    def data(self) -> bytes:
        raise NotImplementedError

    def json(self) -> dict[str, Any]:
        """``data`` decoded: the event's fields."""
        return _decode_object.decode(self.data)

    def response_json(self) -> dict[str, Any]:
        """The response decoded: an ``agent_response`` object (docs/contract.md §5.1)."""
        return _decode_object.decode(self.response)

    @property
    def text(self) -> str:
        """The response's text (``processor.client.items.response_text``)."""
        return response_text(self.response_json())


@dataclass(frozen=True, slots=True)
class MergedOutput(_Response):
    """A turn's ``merged`` entry: ``response`` and ``meta`` are its JSON texts."""

    turn: TurnRef
    status: str
    response: bytes
    meta: bytes

    @property
    def type(self) -> str:
        return "merged"

    @property
    def data(self) -> bytes:
        """The ``merged`` event's JSON: the entry with its response and meta as objects."""
        return _encode(_Merged("merged", self.turn.response_id, self.turn.key.synthesis_id(),
                               self.status, msgspec.Raw(self.response), msgspec.Raw(self.meta),
                               self.turn.attempt_id or None))


@dataclass(frozen=True, slots=True)
class Snapshot(_Response):
    """The merge of a running turn up to ``seq`` (the merged response's shape)."""

    turn: TurnRef
    seq: int
    response: bytes

    @property
    def type(self) -> str:
        return "snapshot"

    @property
    def data(self) -> bytes:
        """The ``snapshot`` event's JSON: ids, seq and the response as an object."""
        return _encode(_Snapshot("snapshot", self.turn.response_id, self.turn.key.synthesis_id(),
                                 self.seq, msgspec.Raw(self.response),
                                 self.turn.attempt_id or None))


Item = LiveEvent | MergedOutput


class Cursor:
    """The last seq a client has: each seq is sent once, in increasing order,
    whether it comes from a snapshot, the turn's history or the live feed.
    ``after`` is what the client already has (-1: nothing)."""

    def __init__(self, after: int = -1) -> None:
        self.last = after
        self.ended = False

    def take(self, event: LiveEvent) -> bool:
        """Whether to send ``event`` (and, if so, it counts as sent). Nothing
        after the terminal event is ever sent."""
        if self.ended or event.seq <= self.last:
            return False
        self.last = event.seq
        self.ended = event.terminal
        return True

    def jump(self, seq: int) -> None:
        """The client has everything up to ``seq`` (a snapshot was sent)."""
        self.last = max(self.last, seq)

    @property
    def resume_id(self) -> str | None:
        """The id a client resumes from: what it has (None: nothing yet)."""
        return None if self.last < 0 else str(self.last)


def parse_after(value: str | None) -> int | None:
    """A resume position (``Last-Event-ID`` or ``?after=``): the seq the client
    has. None when absent or empty; ``ValueError`` when not a whole number."""
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise ValueError(f"a resume id is the whole number of an event's id, got {value!r}")
    return int(value)

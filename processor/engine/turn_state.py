"""The state of one turn's merge: what ``Turn`` folds
into and the worker stores in Redis (msgpack, array-like: compact).

Layout: the turn's messages ("segments") grouped in blocks, one block per
inner response id, blocks and segments in first-seen order.
"""

from __future__ import annotations

from typing import Any

import msgspec

from processor.wire.models import Content


class Segment(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One message being assembled. (``gc=False``: it never refers back to
    anything holding it, so the cycle collector need not track it.)"""

    ordinal: int  # arrival ordinal (among the turn's updates) of its first update
    block: int
    message_id: str | None = None  # the producer's id; None for an id-less run
    role: str | None = None
    author_name: str | None = None
    agent_id: str | None = None
    created_at: str | None = None
    contents: list[Content] = msgspec.field(default_factory=list)
    # An id-less message holding a keyed update's function result that moved
    # after its call (result before call): that update's message id. The
    # message takes it when the id's own message is empty (combine.py).
    # Last, so states written before it load and unmoved ones encode as before.
    moved_from: str | None = None


class Block(msgspec.Struct, array_like=True, gc=False):
    """The segments of one inner response id ("" = the turn's own).
    (``gc=False``, as Segment: it holds plain data, never anything holding it.)"""

    inner_id: str
    segments: list[int]


class TurnState(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Everything ``Turn.finish`` needs; what the worker stores in Redis.

    ``gc=False``: it holds plain data (lists, dicts, Segments), never
    anything holding it, so it is in no reference cycle. Untracked, a long
    merge's states cost the cycle collector's full passes nothing.
    """

    response_id: str
    attempt_id: str = ""
    updates: int = 0
    blocks: list[Block] = msgspec.field(default_factory=list)
    segments: list[Segment] = msgspec.field(default_factory=list)
    keyed: dict[str, int] = msgspec.field(default_factory=dict)
    calls: dict[str, int] = msgspec.field(default_factory=dict)
    open_run: int = -1  # id-less segment the next id-less update may extend
    usage: dict[str, int] | None = None
    finish_reason: str | None = None
    agent_id: str | None = None
    properties: dict[str, Any] = msgspec.field(default_factory=dict)
    ids: dict[str, str] = msgspec.field(default_factory=dict)
    # Usage per inner response ("" = the turn's own). Appended last so states
    # written before it still load; ``usage`` above is only read, for them.
    block_usage: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)

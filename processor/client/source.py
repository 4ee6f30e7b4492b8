"""Where a stream's past comes from: :class:`TurnSource`.

A client that joins or resumes needs what was published before it came:
the merge so far (a snapshot), the events after the seq it has, and, once
the turn has ended, its merged entry and terminal event. The live feed
(processor/serve/hub.py, or ``Subscriber.follow``'s own read of the shard)
gives only what comes after. In the client package: ``processor serve``
and ``Subscriber.follow`` read a turn's past the same way.

:class:`StreamScanSource` is the implementation on today's keys, and is
temporary: it finds a turn's past by reading the shard's ``events`` and
``merged`` streams backwards (``XREVRANGE``), at most ``scan_limit``
entries each, and has no snapshot. The per-turn log (docs/serve.md,
"Joining and resuming") replaces it: one ``XRANGE`` of
``{ns:s}:live:<tk>`` for the history and the snapshot, and the done
marker's entry ids for the final outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from processor.client.turns import TERMINAL, LiveEvent, MergedOutput, Snapshot, TurnRef
from processor.redis_io.replies import as_text
from processor.wire.keys import Namespace

Phase = Literal["unknown", "running", "finished"]


@dataclass(frozen=True, slots=True)
class TurnState:
    """``finished`` (``status`` from its done marker), ``running``, or
    ``unknown``: not started yet, never sent, or forgotten (past the
    workers' ``--done-ttl``)."""

    phase: Phase
    status: str | None = None


@dataclass(frozen=True, slots=True)
class History:
    """The events with a seq greater than ``after``, in seq order.
    ``complete`` is False when the source could not reach back to
    ``after + 1`` (the temporary scan's limit, or trimmed streams)."""

    events: list[LiveEvent] = field(default_factory=list)
    complete: bool = True


@dataclass(frozen=True, slots=True)
class Final:
    """The outputs of a finished turn; either is None once no longer retained."""

    merged: MergedOutput | None
    terminal: LiveEvent | None


class TurnSource(Protocol):
    """The past of a turn, read from Redis."""

    async def state(self, turn: TurnRef) -> TurnState: ...

    async def snapshot(self, turn: TurnRef) -> Snapshot | None:
        """The merge so far of a running turn; None when the source has none."""
        ...

    async def history(self, turn: TurnRef, after: int) -> History: ...

    async def final(self, turn: TurnRef) -> Final: ...


#: Entries per XREVRANGE page of the events stream (small entries) and of
#: the merged stream (each holds a whole response).
EVENTS_PAGE = 200
MERGED_PAGE = 20


def entry_field(fields: Mapping[Any, Any], name: str) -> Any:
    """A field of an entry, whether the client decodes responses or not."""
    return fields.get(name.encode(), fields.get(name))


def _text(fields: Mapping[Any, Any], name: str) -> str:
    value = entry_field(fields, name)
    return "" if value is None else as_text(value)


def _raw(fields: Mapping[Any, Any], name: str) -> bytes:
    value = entry_field(fields, name)
    if value is None:
        return b""
    return value if isinstance(value, bytes) else str(value).encode()


def owned_event(turn: TurnRef, fields: Mapping[Any, Any]) -> LiveEvent | None:
    """The event of an events-stream entry when it belongs to ``turn``."""
    if not turn.owns(_text(fields, "response_id"), _text(fields, "attempt_id")):
        return None
    try:
        return LiveEvent.decode(_raw(fields, "event"))
    except msgspec.DecodeError:
        return None  # not an event of docs/contract.md §5.2's shape: nothing to send


def owned_merged(turn: TurnRef, fields: Mapping[Any, Any]) -> MergedOutput | None:
    """The merged output of a merged-stream entry when it belongs to ``turn``."""
    if not turn.owns(_text(fields, "response_id"), _text(fields, "attempt_id")):
        return None
    return MergedOutput(turn, _text(fields, "status"), _raw(fields, "response"),
                        _raw(fields, "meta"))


class StreamScanSource:
    """:class:`TurnSource` on today's keys (temporary; see the module's docstring)."""

    def __init__(self, client: Any, namespace: Namespace, scan_limit: int) -> None:
        self.client = client
        self.namespace = namespace
        self.scan_limit = scan_limit

    async def state(self, turn: TurnRef) -> TurnState:
        shard, tk = turn.shard(self.namespace), turn.key.encode()
        # In this order: a turn that ends between the reads is seen active,
        # then done (done wins), never neither (the worker's publish removes
        # it from the active zset and sets the done marker in one script).
        pipe = self.client.pipeline(transaction=False)
        pipe.zscore(shard.active, tk)
        pipe.exists(shard.turn(tk))
        pipe.hget(shard.done(tk), "status")
        active, hashed, status = await pipe.execute()
        if status is not None:
            return TurnState("finished", as_text(status))
        if active is not None or hashed:
            return TurnState("running")
        return TurnState("unknown")

    async def snapshot(self, turn: TurnRef) -> Snapshot | None:
        return None  # needs the per-turn log: the merge is in no stream today

    async def history(self, turn: TurnRef, after: int) -> History:
        found: list[LiveEvent] = []
        reached = False

        def take(fields: Mapping[Any, Any]) -> bool:
            nonlocal reached
            event = owned_event(turn, fields)
            if event is not None:
                if event.seq > after:
                    found.append(event)
                reached = event.seq <= after + 1
            return reached

        await self._scan(turn.shard(self.namespace).events, EVENTS_PAGE, take)
        found.sort(key=lambda event: event.seq)
        unique = [e for i, e in enumerate(found) if i == 0 or e.seq != found[i - 1].seq]
        return History(unique, reached)

    async def final(self, turn: TurnRef) -> Final:
        shard = turn.shard(self.namespace)
        merged: list[MergedOutput] = []
        terminal: list[LiveEvent] = []

        def take_merged(fields: Mapping[Any, Any]) -> bool:
            output = owned_merged(turn, fields)
            if output is not None:
                merged.append(output)
            return bool(merged)

        def take_terminal(fields: Mapping[Any, Any]) -> bool:
            if _text(fields, "type") == TERMINAL:
                event = owned_event(turn, fields)
                if event is not None and event.terminal:
                    terminal.append(event)
            return bool(terminal)

        await self._scan(shard.merged, MERGED_PAGE, take_merged)
        await self._scan(shard.events, EVENTS_PAGE, take_terminal)
        return Final(merged[0] if merged else None, terminal[0] if terminal else None)

    async def _scan(self, stream: str, page: int,
                    take: Callable[[Mapping[Any, Any]], bool]) -> None:
        """Read ``stream`` from its newest entry back, at most ``scan_limit``
        entries, until ``take(fields)`` returns True."""
        newest, left = "+", self.scan_limit
        while left > 0:
            entries = await self.client.xrevrange(stream, max=newest, min="-",
                                                  count=min(page, left))
            if not entries:
                return
            for _entry_id, fields in entries:
                if take(fields):
                    return
            left -= len(entries)
            newest = "(" + as_text(entries[-1][0])

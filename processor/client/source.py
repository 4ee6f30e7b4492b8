"""Where a stream's past comes from: ``TurnSource``.

A client that joins or resumes needs what was published before it came:
the merge so far (a snapshot), the events after the seq it has, and, once
the turn has ended, its merged entry and terminal event. The live feed
(processor/serve/hub.py, or ``Subscriber.follow``'s own read of the shard)
gives only what comes after. In the client package: ``processor serve``
and ``Subscriber.follow`` read a turn's past the same way.

``LogSource`` reads it from the turn's live log, which the workers
append to with each batch's events and updates (docs/serve.md, "Joining
and resuming"): one ``XRANGE`` of ``{ns:s}:live:<tk>`` for the history
and for the snapshot (the logged updates folded with the merge itself,
``processor.engine.merge``), and the done marker's entry ids for the final
outputs (one ``XRANGE`` each).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import msgspec

from processor.client.turns import LiveEvent, MergedOutput, Snapshot, TurnRef
from processor.engine.merge import Turn, UsageOverflow
from processor.redis_io.read_budget import ReadBudget, ReplyTooLarge, bounded
from processor.redis_io.replies import as_text
from processor.wire.keys import Namespace
from processor.wire.models import Update

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

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
    ``after + 1`` (a log that expired, or workers without live progress)."""

    events: list[LiveEvent] = field(default_factory=list)
    complete: bool = True


@dataclass(frozen=True, slots=True)
class Final:
    """The outputs of a finished turn; either is None once no longer
    retained. Asked with ``after`` (a resume): ``missed``, the turn's events
    with a seq between ``after`` and the terminal event's, in seq order, all
    of them (``complete``) or none when the source could not reach back to
    ``after + 1`` (trimmed from the stream, or past the look-back)."""

    merged: MergedOutput | None
    terminal: LiveEvent | None
    missed: list[LiveEvent] = field(default_factory=list)
    complete: bool = True


class TurnSource(Protocol):
    """The past of a turn, read from Redis."""

    async def state(self, turn: TurnRef) -> TurnState: ...

    async def snapshot(self, turn: TurnRef) -> Snapshot | None:
        """The merge so far of a running turn; None when the source has none."""
        ...

    async def history(self, turn: TurnRef, after: int) -> History: ...

    async def final(self, turn: TurnRef, after: int | None = None) -> Final: ...


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


class LogSource:
    """``TurnSource`` on the workers' keys: the turn's live log
    (``{ns:s}:live:<tk>``, written by ``publish_live.lua``) for its past
    and its snapshot, and its done marker's entry ids for its outputs."""

    def __init__(self, client: RedisClient, namespace: Namespace, read_budget: int | None = None,
                 over_budget: Callable[[], object] | None = None) -> None:
        self.client = client
        self.namespace = namespace
        self.over_budget = over_budget  # told of each read cut at the budget
        # The bytes one read of a turn's past may take (None: no bound):
        # past it, a snapshot is None, a history and a finished turn's
        # missed events incomplete (what stays exact: the merged response).
        self.read_budget = read_budget

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

    async def _log(self, turn: TurnRef) -> list[tuple[Any, Mapping[Any, Any]]]:
        """The turn's live log (``PastTooLarge`` past the read budget)."""
        key = turn.shard(self.namespace).live(turn.key.encode())
        if self.read_budget is None:
            return cast(list[tuple[Any, Mapping[Any, Any]]], await self.client.xrange(key))
        found: list[tuple[Any, Mapping[Any, Any]]] = []
        reader = PagedRead(self.read_budget, self.over_budget)
        start: Any = "-"
        pages = 0
        while True:
            page = await reader.page(self.client.xrange, key, min=start, max="+", count=LOG_PAGE)
            if page is None:
                raise PastTooLarge(reader.read)
            found += page
            pages += 1
            if len(page) < reader.asked:
                break
            start = "(" + as_text(page[-1][0])
        # One XRANGE reads the log at one instant; pages do not. The log only
        # grows while its turn runs, and goes whole when the turn is published:
        # if it went between two pages, what came is a cut log that looks
        # complete. Answered as the log read after it went: empty.
        if pages > 1 and not await self.client.exists(key):
            return []
        return found

    async def snapshot(self, turn: TurnRef) -> Snapshot | None:
        """The logged updates folded with the merge, at the log's last seq
        (an empty log: the empty merge at seq 0, ``synthesis.started``)."""
        merge, seq = Turn(turn.key), 0
        try:
            log = await self._log(turn)
        except PastTooLarge:
            return None
        for _entry_id, fields in log:
            seq = max(seq, _int(fields, "seq"))
            for raw in _raws(fields, "updates"):
                try:
                    merge.fold(_update.decode(raw))
                except (msgspec.DecodeError, UsageOverflow):
                    continue  # (not merged by the worker either)
        return Snapshot(turn, seq, _encode(merge.finish()))

    async def history(self, turn: TurnRef, after: int) -> History:
        """The logged events after seq ``after``: complete when they follow
        on from it (the log starts after ``synthesis.started``, seq 0)."""
        found: list[LiveEvent] = []
        try:
            log = await self._log(turn)
        except PastTooLarge:
            return History([], complete=False)
        for _entry_id, fields in log:
            if _int(fields, "seq") <= after:
                continue
            for raw in _raws(fields, "events"):
                try:
                    event = LiveEvent.decode(raw)
                except msgspec.DecodeError:
                    continue
                if event.seq > after:
                    found.append(event)
        complete = not found or found[0].seq == after + 1
        return History(found, complete)

    async def final(self, turn: TurnRef, after: int | None = None) -> Final:
        shard, tk = turn.shard(self.namespace), turn.key.encode()
        merged_id, terminal_id = await self.client.hmget(shard.done(tk), "merged_id",
                                                         "terminal_id")
        pipe = self.client.pipeline(transaction=False)
        pipe.xrange(shard.merged, min=merged_id or "0-0", max=merged_id or "0-0", count=1)
        pipe.xrange(shard.events, min=terminal_id or "0-0", max=terminal_id or "0-0", count=1)
        merged_entries, terminal_entries = await pipe.execute()
        merged = owned_merged(turn, merged_entries[0][1]) if merged_id and merged_entries else None
        terminal = None
        if terminal_id and terminal_entries:
            event = owned_event(turn, terminal_entries[0][1])
            terminal = event if event is not None and event.terminal else None
        if terminal is None or after is None or after >= terminal.seq - 1:
            return Final(merged, terminal)
        missed = await self._missed(turn, as_text(terminal_id), after, terminal.seq)
        return Final(merged, terminal, missed or [], missed is not None)

    async def _missed(self, turn: TurnRef, terminal_id: str, after: int,
                      last: int) -> list[LiveEvent] | None:
        """The turn's events with a seq in (``after``, ``last``), read back
        from its terminal event's entry in the shard's events stream (the
        log went with the turn's state); None if not all of them are within
        ``LOOK_BACK`` entries. A turn's events are in the stream in seq
        order, so the look-back stops at the first one at or below ``after + 1``."""
        events = turn.shard(self.namespace).events
        found: dict[int, LiveEvent] = {}
        top, read, reached = "(" + terminal_id, 0, False
        reader = PagedRead(self.read_budget, self.over_budget)
        while not reached and read < LOOK_BACK:
            entries = await reader.page(self.client.xrevrange, events, max=top, min="-",
                                        count=LOOK_BACK_PAGE)
            if entries is None:
                return None  # past the read budget: the merged response makes the end exact
            read += len(entries)
            for _, fields in entries:
                event = owned_event(turn, fields)
                if event is None:
                    continue
                if after < event.seq < last:
                    found[event.seq] = event
                reached = reached or event.seq <= after + 1  # (nothing older is missed)
            if len(entries) < reader.asked:
                break
            top = "(" + as_text(entries[-1][0])
        if len(found) != last - after - 1:
            return None
        return [found[seq] for seq in sorted(found)]


#: How many entries of the shard's events stream a resume of a turn that
#: finished meanwhile reads back from its terminal event, at most, for the
#: events the client missed (pages of ``LOOK_BACK_PAGE``).
LOOK_BACK = 10_000
LOOK_BACK_PAGE = 500


#: Entries of a turn's live log read at once under a read budget, at most
#: (fewer while the budget left holds fewer at the average size so far).
LOG_PAGE = 1000
#: Entries of the first page of a read under a budget (later ones follow
#: the average entry size).
FIRST_PAGE = 4


class PastTooLarge(Exception):
    """A turn's live log is larger than the source's read budget."""

    def __init__(self, read: int) -> None:
        super().__init__(f"the turn's live log is past the read budget (read {read} bytes)")
        self.read = read


class PagedRead:
    """Pages of one stream read under a total byte ``budget`` (None: no
    bound). Redis sends a page whole once asked, so a page asks for as many
    entries as the budget left holds at the average size read so far
    (``FIRST_PAGE`` to begin with): what Redis sends past the budget is
    at most one page. Each page's reply is also cut once past what is left
    (clients of ``processor.redis_io.connections.connect``; a cluster
    client's page is counted once parsed)."""

    def __init__(self, budget: int | None, over: Callable[[], object] | None = None) -> None:
        self.budget = budget
        self.over = over
        self.read = 0
        self.entries = 0
        self.asked = 0  # entries the last page asked for (fewer came: the stream ended)

    async def page(self, command: Any, *args: Any, count: int, **kwargs: Any) -> list[Any] | None:
        """Up to ``count`` entries, or None once the budget is spent."""
        if self.budget is None:
            self.asked = count
            entries: list[Any] = await command(*args, count=count, **kwargs)
            return entries
        left = self.budget - self.read
        if left <= 0:
            return self._spent()
        if self.entries:
            count = max(1, min(count, left * self.entries // max(self.read, 1)))
        else:
            count = min(count, FIRST_PAGE)
        self.asked = count
        try:
            with bounded(ReadBudget(left)) as budget:
                entries = await command(*args, count=count, **kwargs)
        except ReplyTooLarge:
            self.read = self.budget
            return self._spent()
        self.read += max(budget.bytes, _size(entries))
        self.entries += len(entries)
        return self._spent() if self.read > self.budget else entries

    def _spent(self) -> list[Any] | None:
        """None: the budget is spent (and whoever asked is told)."""
        if self.over is not None:
            self.over()
        return None



def _size(entries: list[Any]) -> int:
    """About the bytes of a stream reply: its ids, names and values."""
    total = 0
    for entry_id, fields in entries:
        total += len(entry_id) + sum(len(k) + len(v) for k, v in fields.items())
    return total


_update = msgspec.json.Decoder(Update)
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])
_encode = msgspec.json.Encoder().encode


def _int(fields: Mapping[Any, Any], name: str) -> int:
    text = _text(fields, name)
    return int(text) if text.isdigit() else 0


def _raws(fields: Mapping[Any, Any], name: str) -> list[bytes]:
    """The items of a JSON array field, each as its JSON text."""
    try:
        return [bytes(item) for item in _raw_list.decode(_raw(fields, name) or b"[]")]
    except msgspec.DecodeError:
        return []

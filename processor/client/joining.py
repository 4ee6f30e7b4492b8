"""What a stream sends before the live feed: ``join``, the one rule of
``processor serve``'s event streams and ``Subscriber.follow`` (docs/serve.md,
"Joining and resuming").

A turn's past is read in steps (its state, then its live log or its final
outputs), and the turn can end between them: its live log goes with its
state when it is published. So a read of the log that finds nothing to go
on (no event at all, or the empty merge) is not taken for "nothing
happened": the state is read again, and a turn that ended meanwhile is
joined as a finished one (its missed events read back from the shard's
events stream, its merged output, its terminal event). And a history that
does not reach back to what the client has (the log begins later) is never
sent as if it followed on: the client gets a snapshot instead, which
replaces what it built (``incomplete``), or, for a finished turn, the
merged output, which does the same.

The live feed is subscribed to before ``join`` runs, so whatever is
published after the reads is in the feed; the seq
``Cursor`` drops what both hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.client.source import TurnSource
from processor.client.turns import LiveEvent, MergedOutput, Snapshot, TurnRef

#: The SSE id of a ``gone`` notice (a finished turn whose terminal event is no
#: longer retained: its seq is unknown): the largest resume id. A client that
#: resumes with it has everything there is (204), so ``EventSource``, which
#: reconnects after every end, stops there instead of getting ``gone`` again
#: every second.
GONE_ID = 10**18 - 1

@dataclass
class Join:
    """What a stream sends before the live feed, in this order: ``snapshot``
    (its id its seq), then ``past`` (events with their seqs; a finished
    turn's merged output just before its terminal event), then a ``gone``
    notice when the finished turn's terminal event is no longer retained."""

    snapshot: Snapshot | None = None
    past: list[LiveEvent | MergedOutput] = field(default_factory=list)
    folded: list[LiveEvent] = field(default_factory=list)  # the client has them (AG-UI's state)
    gone: bool = False  # finished, and its terminal event is no longer retained
    status: str | None = None  # of a finished turn
    has_all: bool = False  # the client has the terminal event already: 204
    # The turn's past did not reach back to what the client has: it gets a
    # snapshot (running) or the merged output (finished) in its place.
    incomplete: bool = False
    unknown: bool = False  # not started yet, never sent, or forgotten


async def join(source: TurnSource, turn: TurnRef, after: int | None, *,
               whole: bool = False) -> Join:
    """A finished turn: the events after ``after`` it missed (when they can
    all be read back), its merged output and its terminal event. A running
    one: a snapshot (a fresh join, when the source has one), else the events
    after ``after``; a snapshot also when those do not follow on from
    ``after``. A turn not started yet: nothing (the feed brings it).
    ``whole``: a running turn's history is read from its start, and what
    the client has (up to ``after`` or the snapshot) comes back in
    ``folded`` (an AG-UI stream's ids depend on the events before).
    Resumed with ``GONE_ID``: nothing (the client had a ``gone`` notice)."""
    if after is not None and after >= GONE_ID:
        return Join(has_all=True)
    state = await source.state(turn)
    if state.phase == "running":
        found, sure = await _running(source, turn, after, whole)
        if sure:
            return found
        # Nothing to go on in the log: empty, or gone with the turn's state
        # (published between the two reads). The state says which.
        state = await source.state(turn)
        if state.phase != "finished":
            return found  # the log was read while the turn ran: it is so
    if state.phase == "finished":
        return await _finished(source, turn, after, whole, state.status)
    return Join(unknown=state.phase == "unknown")


async def _running(source: TurnSource, turn: TurnRef, after: int | None,
                   whole: bool) -> tuple[Join, bool]:
    """The join of a running turn from its log, and whether the log was
    there to be read (False: it was empty, which a turn published
    meanwhile leaves too)."""
    snapshot = None
    if after is None:
        snapshot = await source.snapshot(turn)
        if snapshot is not None and not whole:
            return Join(snapshot=snapshot), snapshot.seq > 0
    has = snapshot.seq if snapshot is not None else -1 if after is None else after
    history = await source.history(turn, -1 if whole else has)
    folded = [event for event in history.events if event.seq <= has]
    later = [event for event in history.events if event.seq > has]
    sure = bool(history.events)  # (a snapshot's log may have gone since)
    if not later or later[0].seq == has + 1 or after is None:
        return Join(snapshot=snapshot, past=list(later), folded=folded), sure
    # The log begins after the client's id: what it missed is not all there.
    # A snapshot replaces what it has (AG-UI: with what it folds).
    fresh, sure = await _running(source, turn, None, whole)
    fresh.incomplete = True
    return fresh, sure


async def _finished(source: TurnSource, turn: TurnRef, after: int | None, whole: bool,
                    status: str | None) -> Join:
    # A native resume gets the events it missed before the end (AG-UI's
    # MESSAGES_SNAPSHOT replaces them); the merged output makes the end
    # exact if they are no longer there.
    final = await source.final(turn, None if whole else after)
    if final.terminal is not None and after is not None and after >= final.terminal.seq:
        return Join(has_all=True)
    missed: list[LiveEvent | MergedOutput] = list(final.missed) if final.complete else []
    past = missed + [item for item in (final.merged, final.terminal) if item is not None]
    return Join(past=past, gone=final.terminal is None, status=status,
                incomplete=not final.complete)


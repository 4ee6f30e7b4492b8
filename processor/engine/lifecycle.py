"""A turn's life from first entry to terminal outcome, as a pure state machine.

``TurnLife`` wraps the merge (``Turn``) with the
rules of docs/contract.md §6 and §7: what an entry means once the turn has
ended, the per-turn limits, cancellation and timeout. ``processor merge`` and
the worker's finalisation both replay a turn's entries through it, which is
why they publish the same response for the same entries.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import NamedTuple

import msgspec

from processor.engine.events import Outcome, producer_error, terminal
from processor.engine.merge import Turn, UsageOverflow
from processor.ingest.validate import clip
from processor.wire import defaults
from processor.wire.ids import TurnKey
from processor.wire.models import MAX_USAGE_COUNT, Record, Update
from processor.wire.outputs import Counts, ErrorInfo, Meta, Response, Synthesis


class Limits(msgspec.Struct, frozen=True):
    """Per-entry and per-turn limits (docs/contract.md §7)."""

    max_entry_bytes: int = defaults.MAX_ENTRY_BYTES
    max_turn_updates: int = defaults.MAX_TURN_UPDATES
    max_turn_bytes: int = defaults.MAX_TURN_BYTES
    turn_timeout: float = defaults.TURN_TIMEOUT


class Verdict(StrEnum):
    """Where one entry ended up (docs/contract.md §4.7: exactly one of these)."""

    MERGED = "merged"
    DROPPED = "dropped"  # counted on a cancelled turn
    DUPLICATE = "duplicate"  # a number merged already: dropped, counted (§3.4)
    TURN_CLOSED = "turn_closed"  # DLQ reason
    TURN_LIMIT = "turn_limit"  # DLQ reason


# An Enum member read through its class costs about 60 ns (a descriptor
# lookup), a module name 5: the per-entry paths read these.
MERGED, DROPPED, DUPLICATE, TURN_CLOSED, TURN_LIMIT = (
    Verdict.MERGED, Verdict.DROPPED, Verdict.DUPLICATE, Verdict.TURN_CLOSED, Verdict.TURN_LIMIT)
#: The verdicts of an entry fed after its turn's end (the DLQ's reasons).
LATE = frozenset((TURN_CLOSED, TURN_LIMIT))


def late_detail(verdict: Verdict, outcome: Outcome | None) -> str:
    """The DLQ ``detail`` of a late entry (``verdict`` in ``LATE``),
    live and offline alike: for the entry that crossed a limit, the turn's
    error message (which names the limit); else that the turn had ended."""
    if verdict is TURN_LIMIT and outcome is not None and outcome.error is not None:
        return outcome.error.message
    return "the turn had already ended"


def usage_limit_message(refused: UsageOverflow) -> str:
    """The ``turn_limit`` message of a turn whose usage sum would pass the bound."""
    return (f"turn exceeds its limits (usage {clip(refused.counter)} would sum to "
            f"{refused.total}, above {MAX_USAGE_COUNT})")


def missing_message(missing: int) -> str:
    """The ``entries_lost`` message of a numbered turn with a gap."""
    entries = "entry" if missing == 1 else "entries"
    return (f"{missing} numbered {entries} of this turn never reached the merge (lost with "
            "Redis's data, trimmed or deleted before they were read, or dead-lettered): "
            "this is the merge of the others")


class TurnLife:
    """One turn: its merge, its counts and, once ended, its outcome.

    Numbered entries (docs/contract.md §3.4): ``next_n`` is the number the
    turn's next entry should carry (None until a numbered entry is fed). A
    turn's entries come in the order their producer numbered them (one
    producer per attempt, the stream's order), so a number below it is a
    repeat (dropped, ``counts.duplicates``) and one above it skips the
    numbers between (``counts.missing``; the first numbered entry fed
    skips those below it). A turn with numbers missing never completes:
    it ends ``entries_lost`` where it would have completed or timed out.
    """

    __slots__ = ("bytes", "counts", "first_id", "last_id", "limits", "next_n", "outcome", "turn")

    def __init__(self, key: TurnKey, limits: Limits | None = None) -> None:
        self.turn = Turn(key)
        self.limits = limits or Limits()
        self.counts = Counts()
        self.outcome: Outcome | None = None
        self.bytes = 0
        self.first_id: str | None = None
        self.last_id: str | None = None
        self.next_n: int | None = None

    @property
    def key(self) -> TurnKey:
        return self.turn.key

    def feed(self, entry_id: str | None, record: Record, size: int = 0) -> Verdict:
        """Account for one entry of this turn, in arrival order."""
        if self.outcome is not None:
            if self.outcome.status == "cancelled":
                self.counts.dropped += 1
                return DROPPED
            self.counts.dlq += 1
            return TURN_CLOSED
        counts, kind = self.counts, record.kind
        number = record.n
        if number is not None:
            expected = self.next_n or 0
            if number < expected:
                counts.duplicates += 1
                return DUPLICATE
            counts.missing += number - expected
            self.next_n = number + 1
        if kind == "update" and self._over_limit(size):
            return self._crossed(self._limit_message())
        try:
            self.turn.apply(record)
        except UsageOverflow as refused:  # (the merge changed nothing)
            return self._crossed(usage_limit_message(refused))
        self.bytes += size
        counts.entries += 1
        if kind == "update":
            counts.updates += 1
        elif kind == "end":
            self.outcome = (Outcome.completed() if not counts.missing
                            else Outcome.failed("entries_lost", missing_message(counts.missing)))
        else:
            self.outcome = producer_error(record)
        if self.first_id is None:
            self.first_id = entry_id
        self.last_id = entry_id
        return MERGED

    def _crossed(self, message: str) -> Verdict:
        """The entry being fed crosses a limit: the turn ends, it is dead-lettered."""
        self.outcome = Outcome.failed("turn_limit", message)
        self.counts.dlq += 1
        return TURN_LIMIT

    def feed_updates(self, updates: list[Update], first_id: str, last_id: str,
                     size: int, prefix: Callable[[int], tuple[int, str]]) -> int:
        """``feed`` of plain updates (no correlation ids), ``size`` bytes
        in all, from ``first_id`` to ``last_id``, when each would be merged;
        how many were fed. All of them when the turn is open and all of them
        within its limits. None when the turn has ended or the updates would
        cross its update or byte limit. When the merge refuses one (its
        usage does not fit, which only folding finds), the ones before it:
        ``prefix(k)`` gives the bytes and the last entry id of the first k.
        Feed the rest one by one with ``feed`` (the first then ends
        the turn), as each would have been."""
        counts, limits = self.counts, self.limits
        n = len(updates)
        if (self.outcome is not None or counts.updates + n > limits.max_turn_updates
                or self.bytes + size > limits.max_turn_bytes):
            return 0
        turn = self.turn
        before = turn.state.updates
        fold = turn.fold
        try:
            for update in updates:
                fold(update)
        except UsageOverflow:  # (raised before that update changed anything)
            n = turn.state.updates - before
            if not n:
                return 0
            size, last_id = prefix(n)
        self.bytes += size
        counts.entries += n
        counts.updates += n
        if self.first_id is None:
            self.first_id = first_id
        self.last_id = last_id
        return n

    def ends_turn(self, record: Record, size: int = 0) -> bool:
        """Whether feeding this entry next would end the turn (or find it ended)."""
        return (self.outcome is not None or record.kind != "update"
                or self._over_limit(size)
                or (record.update is not None
                    and self.turn.usage_overflow(record.update) is not None))

    def _over_limit(self, size: int) -> bool:
        return (
            self.counts.updates + 1 > self.limits.max_turn_updates
            or self.bytes + size > self.limits.max_turn_bytes
        )

    def _limit_message(self) -> str:
        lim = self.limits
        return (
            f"turn exceeds its limits ({lim.max_turn_updates} updates, "
            f"{lim.max_turn_bytes} bytes)"
        )

    def cancel(self, reason: str | None = None) -> bool:
        """Cancel the turn (``reason``: its cancel key's, if any); False if it
        had already ended (nothing changes)."""
        if self.outcome is not None:
            return False
        self.outcome = Outcome.cancelled(reason)
        return True

    def expire(self) -> bool:
        """End the turn as timed out; False if it had already ended."""
        if self.outcome is not None:
            return False
        seconds = self.limits.turn_timeout
        message = f"no entry for {seconds:g} seconds"
        missing = self.counts.missing
        self.outcome = (
            Outcome.failed("turn_timeout", message) if not missing
            else Outcome.failed("entries_lost", f"{missing_message(missing)}; then {message}"))
        return True

    def state_lost(self) -> None:
        """End the turn as ``state_lost`` whatever it came to so far: the
        namespace's state in Redis is gone (a Redis restarted without
        persistence), and the worker publishes what it had of the turn, which
        may be missing entries another worker or the lost state held."""
        self.outcome = Outcome.failed(
            "state_lost", "Redis lost the namespace's state while this turn was in flight "
            "(a restart without persistence?): this is what one worker had of it")

    def entries_lost(self, first_id: str) -> None:
        """End the turn as ``entries_lost`` if it completed or timed out: an
        entry of its shard that it may have had was deleted from the stream
        while pending (a trim), so it may be missing an update or its end.
        A cancel, the producer's own error or a limit says more, and stays."""
        outcome = self.outcome
        if outcome is None or outcome.status == "cancelled":
            return
        if outcome.error is not None and outcome.error.code != "turn_timeout":
            return
        self.outcome = Outcome.failed(
            "entries_lost", f"entries of this turn's shard were deleted from the stream while "
            f"pending (from {first_id}): this turn may be missing some of its own")

    def response(self) -> Response:
        return self.turn.finish()

    def meta(self, response: Response, started_ms: int | None, finished_ms: int | None) -> Meta:
        key = self.key
        counts = msgspec.structs.replace(self.counts, messages=len(response.messages))
        error: ErrorInfo | None = self.outcome.error if self.outcome else None
        reason = self.outcome.cancel_reason if self.outcome else None
        return Meta(
            response_id=key.response_id,
            attempt_id=key.attempt_id or None,
            synthesis_id=key.synthesis_id(),
            ids=dict(self.turn.state.ids),
            counts=counts,
            first_entry_id=self.first_id,
            last_entry_id=self.last_id,
            started_ms=started_ms,
            finished_ms=finished_ms,
            error=error,
            cancel_reason=reason,
        )


class Finished(NamedTuple):
    """What a finished turn renders to: its response, meta and terminal
    ``synthesis`` event (the worker's finalise and ``processor merge`` alike)."""

    outcome: Outcome
    response: Response
    meta: Meta
    terminal: Synthesis


def finish(life: TurnLife, started_ms: int | None, finished_ms: int | None,
           seq: int, response: Response | None = None) -> Finished:
    """Render a turn whose life has an outcome: the one renderer of a finished
    turn. ``seq``: the terminal event's (the events published before it).
    ``response``: ``life.response()`` if the caller rendered it already
    (nothing fed since; the worker's live step renders every turn a batch
    moved, and most turns end in the batch that started them)."""
    outcome = life.outcome
    assert outcome is not None
    if response is None:
        response = life.response()
    meta = life.meta(response, started_ms, finished_ms)
    final = terminal(life.key, life.turn.state.ids, outcome, response, meta.counts, seq,
                     finished_ms or 0)
    return Finished(outcome, response, meta, final)

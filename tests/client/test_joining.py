"""The join rule (processor/client/joining.py) on a source in memory whose
turn ends, or whose log begins late, exactly between two reads: a history
that does not reach back to the client's id is never sent as if complete.
(The same moments with a real worker: tests/serve/test_serve_resume.py.)"""

from __future__ import annotations

import json

from processor.client.joining import GONE_ID, join
from processor.client.source import Final, History, TurnState
from processor.client.turns import LiveEvent, MergedOutput, Snapshot, TurnRef

TURN = TurnRef("r")


def _event(seq: int, kind: str = "synthesis.chunk") -> LiveEvent:
    return LiveEvent(seq, kind, json.dumps({"type": kind, "seq": seq}).encode())


MERGED = MergedOutput(TURN, "completed", b"{}", b"{}")
TERMINAL = _event(9, "synthesis")


class Memory:
    """A turn whose log holds ``logged`` while it runs, and which ends (its
    log gone with it) at the read numbered ``ends_at`` (0: state, 1: the
    first log read ...)."""

    def __init__(self, logged: list[LiveEvent], ends_at: int | None = None) -> None:
        self.logged = logged
        self.ends_at = ends_at
        self.reads: list[str] = []

    def _read(self, kind: str) -> bool:
        """Whether the turn has ended by this read."""
        self.reads.append(kind)
        return self.ends_at is not None and len(self.reads) > self.ends_at

    async def state(self, turn: TurnRef) -> TurnState:
        return TurnState("finished", "completed") if self._read("state") else TurnState("running")

    async def snapshot(self, turn: TurnRef) -> Snapshot | None:
        log = [] if self._read("snapshot") else self.logged
        return Snapshot(turn, max((e.seq for e in log), default=0), b"{}")

    async def history(self, turn: TurnRef, after: int) -> History:
        log = [] if self._read("history") else self.logged
        found = [e for e in log if e.seq > after]
        return History(found, not found or found[0].seq == after + 1)

    async def final(self, turn: TurnRef, after: int | None = None) -> Final:
        self.reads.append("final")
        missed = [_event(seq) for seq in range(after + 1, 9)] if after is not None else []
        return Final(MERGED, TERMINAL, missed)


async def test_a_resume_whose_turn_ends_before_the_log_is_read_gets_what_it_missed() -> None:
    source = Memory([_event(seq) for seq in range(1, 9)], ends_at=1)
    start = await join(source, TURN, 3)
    assert source.reads == ["state", "history", "state", "final"]
    assert start.past == [*(_event(seq) for seq in range(4, 9)), MERGED, TERMINAL]
    assert not start.gone and not start.incomplete


async def test_a_fresh_join_whose_turn_ends_before_the_snapshot_gets_the_end() -> None:
    source = Memory([_event(seq) for seq in range(1, 9)], ends_at=1)
    start = await join(source, TURN, None)
    assert start.snapshot is None and start.past == [MERGED, TERMINAL]


async def test_an_empty_log_of_a_running_turn_is_taken_as_it_is() -> None:
    source = Memory([])
    start = await join(source, TURN, None)
    assert start.snapshot == Snapshot(TURN, 0, b"{}") and start.past == []
    assert source.reads == ["state", "snapshot", "state"]
    up_to_date = await join(Memory([_event(1), _event(2)]), TURN, 2)
    assert up_to_date.past == [] and up_to_date.snapshot is None


async def test_a_log_that_begins_after_the_clients_id_gives_a_snapshot_instead() -> None:
    source = Memory([_event(seq) for seq in range(6, 9)])
    start = await join(source, TURN, 3)
    assert start.incomplete and start.past == []
    assert start.snapshot == Snapshot(TURN, 8, b"{}")


async def test_a_log_that_follows_on_from_the_clients_id_is_sent_as_it_is() -> None:
    start = await join(Memory([_event(seq) for seq in range(1, 9)]), TURN, 3)
    assert start.past == [_event(seq) for seq in range(4, 9)]
    assert start.snapshot is None and not start.incomplete


async def test_a_client_that_had_the_gone_notice_has_it_all() -> None:
    source = Memory([])
    assert (await join(source, TURN, GONE_ID)).has_all and source.reads == []

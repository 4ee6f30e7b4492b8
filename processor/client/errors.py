"""What the client raises for a send Redis refused on purpose."""

from __future__ import annotations


class TurnEnded(Exception):
    """A send to a turn that has already ended (its merged response is
    published): turn ids are single-use while the workers keep the turn's done
    marker (``processor run --done-ttl``, a day by default). Nothing was added.
    Start a new turn under a new ``response_id`` (or ``attempt_id``).
    Sending to a *cancelled* turn is not refused: the worker drops and counts
    those entries."""

    def __init__(self, turn: str, status: str) -> None:
        self.turn = turn
        self.status = status
        super().__init__(
            f"turn {turn} has already ended ({status}); nothing was sent: turn ids are "
            "single-use within the workers' --done-ttl, so start a new turn with a new "
            "response_id")


class CancelNotTaken(Exception):
    """A cancel asked of the workers (the caller may not set cancellation keys
    itself: the ``serve`` and ``producer`` ACL users) that no worker carried
    out in time: no worker is running, or none could reach Redis. The turn
    is not cancelled yet; retry, or set the key as an administrator."""

    def __init__(self, key: str, waited: float) -> None:
        self.key = key
        self.waited = waited
        super().__init__(
            f"no worker set the cancellation key {key} within {waited:g} s: this client may "
            "not set it itself and asks the workers to; is a worker of this namespace "
            "running? (an administrator's SET of the key also cancels)")

"""The throughput targets' ratios, taken within each round of ``bench/run.py``.

Every consumer runs once per round, one after the other within minutes,
so a ratio of two rows of one round compares the same minute of the
machine. The best-of-rounds table can put one consumer's fastest minute
over another's slowest: on a shared host whose speed moved threefold
between rounds (2026-11-25: the drain at 129,947, 185,343 and 98,008
updates/s), best-of ratios said 5.88x FastStream with turns held where
the rounds said 2.1x, 7.3x and 3.6x. So the targets are judged on the
median of the rounds' ratios, as the latency target is on the median
round.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from scenarios import Throughput

#: The row of one worker holding turns (``--hold-turns``), when run.
HELD_ROW = "processor, 1 worker, held turns"


def one_worker(runs: list[Throughput]) -> Throughput:
    """The first one-worker row: ``processor, 1 worker``, or its name with
    the flags of ``--worker-flags``."""
    return next(t for t in runs if t.name.startswith("processor, 1 worker"))


def held_worker(runs: list[Throughput]) -> Throughput | None:
    """The row of one worker holding turns, if it was run."""
    return next((t for t in runs if t.name == HELD_ROW), None)


@dataclass(frozen=True)
class Round:
    """One round's rates (updates/s) of the rows the targets compare."""

    drain: float
    one: float
    peer: float | None
    held: float | None

    @classmethod
    def of(cls, runs: list[Throughput]) -> Round:
        drain = next(t for t in runs if t.name == "drain")
        peer = next((t for t in runs if t.name == "FastStream"), None)
        held = held_worker(runs)
        return cls(drain.rate, one_worker(runs).rate, peer.rate if peer else None,
                   held.rate if held else None)

    def ratios(self) -> dict[str, float]:
        """processor / drain and / FastStream, by default and with turns held."""
        found = {"drain": self.one / self.drain}
        if self.peer:
            found["peer"] = self.one / self.peer
        if self.held is not None:
            found["held_drain"] = self.held / self.drain
            if self.peer:
                found["held_peer"] = self.held / self.peer
        return found


def median_ratios(rounds: list[Round]) -> dict[str, float]:
    """Each ratio's median over the rounds (the lower middle of an even count)."""
    each = [r.ratios() for r in rounds]
    return {name: statistics.median_low(found[name] for found in each) for name in each[0]}

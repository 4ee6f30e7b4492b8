"""The throughput targets' ratios, taken within each round of ``bench/run.py``.

Every consumer runs once per round, one after the other within minutes,
so a ratio of two rows of one round compares the same minute of the
machine. The best-of-rounds table can put one consumer's fastest minute
over another's slowest: on a shared host whose speed moved threefold
between rounds (2026-11-25: the drain at 129,947, 185,343 and 98,008
updates/s), best-of ratios said 5.88x FastStream with turns held (then
``--hold-turns``, now the default) where the rounds said 2.1x, 7.3x and
3.6x. So the targets are judged on the median of the rounds' ratios, as
the latency target is on the median round; the same ratios of the worker
storing every entry (``--no-hold-turns``) are taken beside them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from scenarios import Throughput

#: The row of one worker storing every entry (``--no-hold-turns``), when run.
STORED_ROW = "processor, 1 worker, stored turns"
#: The row of the default worker without live progress (``--no-progress``), when run.
QUIET_ROW = "processor, 1 worker, no live progress"


def one_worker(runs: list[Throughput]) -> Throughput:
    """The first one-worker row: ``processor, 1 worker``, or its name with
    the flags of ``--worker-flags``."""
    return next(t for t in runs if t.name.startswith("processor, 1 worker"))


def stored_worker(runs: list[Throughput]) -> Throughput | None:
    """The row of one worker storing every entry, if it was run beside the
    default's (with ``--worker-flags --no-hold-turns`` it is the default's)."""
    one = one_worker(runs)
    return next((t for t in runs if t.name == STORED_ROW and t is not one), None)


@dataclass(frozen=True)
class Round:
    """One round's rates (updates/s) of the rows the targets compare."""

    drain: float
    one: float
    peer: float | None
    stored: float | None
    quiet: float | None = None  # the default worker with --no-progress

    @classmethod
    def of(cls, runs: list[Throughput]) -> Round:
        drain = next(t for t in runs if t.name == "drain")
        peer = next((t for t in runs if t.name == "FastStream"), None)
        stored = stored_worker(runs)
        quiet = next((t for t in runs if t.name == QUIET_ROW), None)
        return cls(drain.rate, one_worker(runs).rate, peer.rate if peer else None,
                   stored.rate if stored else None, quiet.rate if quiet else None)

    def ratios(self) -> dict[str, float]:
        """processor / drain and / FastStream, by default (turns held) and with
        every entry stored."""
        found = {"drain": self.one / self.drain}
        if self.peer:
            found["peer"] = self.one / self.peer
        if self.quiet:  # live progress on (the default) over off
            found["live"] = self.one / self.quiet
        if self.stored is not None:
            found["stored_drain"] = self.stored / self.drain
            if self.peer:
                found["stored_peer"] = self.stored / self.peer
        return found


def median_ratios(rounds: list[Round]) -> dict[str, float]:
    """Each ratio's median over the rounds (the lower middle of an even count)."""
    each = [r.ratios() for r in rounds]
    return {name: statistics.median_low(found[name] for found in each) for name in each[0]}

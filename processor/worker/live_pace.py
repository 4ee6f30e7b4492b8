"""How often the worker publishes a running turn's live progress, and
renews its live log's TTL: pure rules, kept apart from the publishing
(``processor.worker.live_progress``, which keeps their state per shard)."""

from __future__ import annotations

from processor.redis_io.replies import as_text
from processor.wire.ids import TurnKey

#: Seconds between two renewals of a live log's TTL by this worker (at most twice that).
RENEW_S = 60.0


class Renewals:
    """Which turns' live logs this worker gave their TTL lately: a log gets
    it with its first entry from this worker, then once per ``every`` to
    twice that (two generations of turns, the older forgotten at each turn
    of ``every``), instead of an EXPIRE per entry."""

    def __init__(self, every: float, now: float) -> None:
        self.every = every
        self._now: set[TurnKey] = set()
        self._before: set[TurnKey] = set()
        self._turned = now

    def due(self, key: TurnKey, now: float) -> bool:
        """Whether ``key``'s log is to get its TTL in the call being made
        (then counted as given)."""
        if now - self._turned >= self.every:
            self._before, self._now, self._turned = self._now, set(), now
        if key in self._now or key in self._before:
            return False
        self._now.add(key)
        return True


def live_interval(interval: float, lag: float, most: float) -> float:
    """Least seconds between two live publishes of a running turn:
    ``interval`` (--live-interval-ms), stretched to the read's ``lag``
    behind its producers, up to ``most`` (--live-interval-max-ms).

    A worker that reads behind its producers shows every turn that late
    anyway; publishing each turn as often as when it keeps up would cost one
    publish per update (the round-robin pattern of many live turns) and
    make it fall further behind. Stretched, its turns' updates coalesce
    more the further behind it is, until it catches up: the lag settles
    where the publishes it can afford keep pace with the producers."""
    return max(interval, min(lag, most))


def read_lag(newest_id: bytes | str, now_ms: int) -> float:
    """Seconds between the time in a stream id (Redis's clock when it was
    added) and ``now_ms``: how far behind its producers a read is. 0 for an
    id ahead of the clock or not of the ``ms-seq`` form."""
    ms = as_text(newest_id).partition("-")[0]
    return max(0, now_ms - int(ms)) / 1000 if ms.isdigit() else 0.0

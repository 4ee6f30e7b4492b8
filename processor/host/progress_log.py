"""The worker's progress line: every ``--log-interval`` seconds, one ``info``
line with what the worker did since the last one (turns published, input
entries applied, dead letters, and their rates) and the namespace's lag,
pending entries and active turns (sampled from Redis right before).

The counts are the worker's own metrics (``processor.worker.metrics.Metrics``);
what a line says is ``progress_fields``, a pure function of two readings.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from processor.worker.metrics import Metrics
from processor.worker.sampler import Sampler

log = logging.getLogger("processor.progress")


@dataclass(frozen=True)
class Reading:
    """The worker's counters, and the sampled shard gauges, at one time."""

    at: float  # time.monotonic()
    turns: int  # merged entries published, any status
    entries: int  # input entries applied to their turn
    dead: int  # entries dead-lettered, any reason
    lag: int | None  # summed over the shards; None before any was sampled
    pending: int | None
    active: int | None


def _total(metric: Counter | Gauge) -> int | None:
    """The sum of a metric's series (a counter's ``_total`` samples); None without any."""
    values = [sample.value for family in metric.collect() for sample in family.samples
              if not sample.name.endswith("_created")]
    return int(sum(values)) if values else None


def read(metrics: Metrics) -> Reading:
    """What ``metrics`` count now."""
    return Reading(
        at=time.monotonic(),
        turns=_total(metrics.merged) or 0,
        entries=_total(metrics.stored) or 0,
        dead=_total(metrics.dlq) or 0,
        lag=_total(metrics.lag),
        pending=_total(metrics.pending),
        active=_total(metrics.active),
    )


def progress_fields(before: Reading, now: Reading) -> dict[str, Any]:
    """The fields of the progress line for the time between two readings."""
    seconds = max(round(now.at - before.at, 3), 0.001)
    turns, entries = now.turns - before.turns, now.entries - before.entries
    fields: dict[str, Any] = {
        "interval_s": seconds,
        "turns_published": turns,
        "turns_per_s": round(turns / seconds, 1),
        "entries": entries,
        "entries_per_s": round(entries / seconds, 1),
        "dead_lettered": now.dead - before.dead,
    }
    for name in ("lag", "pending", "active"):
        value = getattr(now, name)
        if value is not None:
            fields["active_turns" if name == "active" else name] = value
    return fields


async def log_progress(metrics: Metrics, sampler: Sampler, interval: float) -> None:
    """Log a progress line every ``interval`` seconds, until cancelled."""
    before = read(metrics)
    while True:
        await asyncio.sleep(interval)
        await sampler.sample()  # (errors are counted and logged by the sampler)
        now = read(metrics)
        log.info("progress", extra=progress_fields(before, now))
        before = now

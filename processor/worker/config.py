"""What ``processor run`` can tell a worker (``WorkerConfig``; the
command line's option table is processor.service.config)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from processor.engine.lifecycle import Limits
from processor.wire import defaults
from processor.wire.keys import DEFAULT_GROUP, DEFAULT_NAMESPACE
from processor.worker.batches import BatchOptions


def default_consumer() -> str:
    """A consumer name unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerConfig:
    """Everything ``processor run`` can be told (see ``processor run --help``)."""

    namespace: str = DEFAULT_NAMESPACE
    shards: int = 1
    group: str = DEFAULT_GROUP
    consumer: str = field(default_factory=default_consumer)
    limits: Limits = field(default_factory=Limits)
    progress: bool = True  # live progress events and each turn's live log (processor.engine.live)
    live_interval_ms: int = defaults.LIVE_INTERVAL_MS
    agui: bool = False
    batch: int = defaults.BATCH
    block_ms: int = defaults.BLOCK_MS
    sweep_interval: float = defaults.SWEEP_INTERVAL
    reclaim_idle_ms: int = defaults.RECLAIM_IDLE_MS
    max_deliveries: int = defaults.MAX_DELIVERIES
    affinity: bool = True
    worker_ttl: float = defaults.WORKER_TTL
    cancel_slice: int = defaults.CANCEL_SLICE
    # Seconds of the inbox bell's BLPOP and of a read of the cancel channel: a
    # stopping worker leaves within it (no option: the tests give a short one).
    idle_wait: float = defaults.IDLE_WAIT
    merged_maxlen: int = defaults.MERGED_MAXLEN
    events_maxlen: int = defaults.EVENTS_MAXLEN
    dlq_maxlen: int = defaults.DLQ_MAXLEN
    done_ttl: int = defaults.DONE_TTL
    compact_threshold: int = defaults.COMPACT_THRESHOLD
    mirror_turns: int = defaults.MIRROR_TURNS
    hold_turns: bool = defaults.HOLD_TURNS
    hold_ms: int = defaults.HOLD_MS

    def batch_options(self) -> BatchOptions:
        return BatchOptions(
            group=self.group, shards=self.shards, limits=self.limits,
            max_deliveries=self.max_deliveries, events_maxlen=self.events_maxlen,
            dlq_maxlen=self.dlq_maxlen, merged_maxlen=self.merged_maxlen,
            done_ttl=self.done_ttl, ready_limit=max(self.batch, 100), agui=self.agui,
            compact_threshold=self.compact_threshold,
            live_ttl=self.done_ttl + max(1, int(self.limits.turn_timeout)),
        )

"""What ``processor run`` can tell a worker (``WorkerConfig``; the
command line's option table is processor.host.config)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from processor.engine.lifecycle import Limits
from processor.wire import defaults
from processor.wire.keys import DEFAULT_GROUP, DEFAULT_NAMESPACE


def default_consumer() -> str:
    """A consumer name unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerConfig:
    """Everything ``processor run`` can be told (see ``processor run --help``);
    the script-call builders read it as their ``BatchOptions``
    (processor.scripts.calls)."""

    namespace: str = DEFAULT_NAMESPACE
    shards: int = 1
    group: str = DEFAULT_GROUP
    consumer: str = field(default_factory=default_consumer)
    limits: Limits = field(default_factory=Limits)
    progress: bool = True  # live progress events and each turn's live log (processor.engine.live)
    live_interval_ms: int = defaults.LIVE_INTERVAL_MS
    live_interval_max_ms: int = defaults.LIVE_INTERVAL_MAX_MS
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

    # Names and values of an entry copied into its DLQ entry as fields (one
    # XADD from Lua carries ~8000 values); a wider entry is kept whole, packed.
    dlq_fields_max: int = defaults.DLQ_FIELDS_MAX

    @property
    def ready_limit(self) -> int:
        """Most closing or timed-out turns one script call reports ready."""
        return max(self.batch, 100)

    @property
    def live_ttl(self) -> int:
        """Seconds a turn's live log is kept after its last entry: it
        outlives an abandoned turn (--done-ttl plus --turn-timeout)."""
        return self.done_ttl + max(1, int(self.limits.turn_timeout))

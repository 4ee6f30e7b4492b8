"""Every default of the worker's settings, once: the option table
(``processor run --help``, ``processor.host.config``), ``WorkerConfig``,
``BatchOptions`` and ``Limits`` all read them here."""

from __future__ import annotations

GROUP = "processor"

# Limits (docs/contract.md §7).
MAX_ENTRY_BYTES = 1 << 20
MAX_TURN_UPDATES = 100_000
MAX_TURN_BYTES = 64 << 20
TURN_TIMEOUT = 300.0

# Reading and sweeping.
BATCH = 500
BLOCK_MS = 100
SWEEP_INTERVAL = 0.1
RECLAIM_IDLE_MS = 30_000
MAX_DELIVERIES = 5
WORKER_TTL = 5.0
CANCEL_SLICE = 1000
#: Seconds the worker's idle waits last (the inbox bell's BLPOP, a read of the
#: cancel channel): a stopping worker leaves within it.
IDLE_WAIT = 1.0

# What the worker writes, and for how long it remembers.
MERGED_MAXLEN = 100_000
EVENTS_MAXLEN = 1_000_000
DLQ_MAXLEN = 100_000
DONE_TTL = 86_400
#: Names and values of an entry a dead letter copies as fields (one XADD from
#: Lua carries about 8,000 values); a wider entry is kept whole, packed.
DLQ_FIELDS_MAX = 7800

# Turns in memory and in Redis.
COMPACT_THRESHOLD = 256
#: Turns per shard whose merge the worker also keeps in memory (--mirror-turns;
#: 0 = none: a stored turn is always read back).
MIRROR_TURNS = 10_000
#: Turns per shard a worker holds (--hold-turns) before the oldest is spilled:
#: a bound of its own, not --mirror-turns (the mirrors of stored turns).
HELD_TURNS = 10_000
HOLD_TURNS = True
HOLD_MS = 5000
#: Least ms between two live progress publishes of one running turn (its
#: updates in between are coalesced into the next; 0: every read batch).
LIVE_INTERVAL_MS = 100
#: Most ms the live interval stretches to while a worker reads behind its
#: producers: a running turn then publishes at most once per the read's lag
#: (the age of the newest entry read), up to this. A reader already sees
#: the turn that late; publishing more often only slows the worker down and
#: the backlog grows. At or below LIVE_INTERVAL_MS it never stretches.
LIVE_INTERVAL_MAX_MS = 1000

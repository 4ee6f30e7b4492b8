"""The worker's memory, bounded in bytes: each number with its reason.

A worker's memory is what it has read and not yet applied, the turns it
holds or keeps a mirror of, and the turns it is finalising. Each is bounded
here in bytes (a count of entries bounds nothing when an entry may be
1 MiB), so that the whole fits the shipped Deployment's 512Mi
(deploy/k8s/deployment.yaml) with room; docs/reliability.md (*Memory*)
adds them up and quotes the measured peak.
"""

from __future__ import annotations

#: One read's reply, over all of a worker's shards (each shard's read gets
#: its share, never less than ``read_bytes``' floor): XREADGROUP, the
#: take-back of its own pending entries, XAUTOCLAIM and XCLAIM. The parser
#: cuts a reply past it (read_budget.LimitedParser); the entries cut are
#: pending to the worker and read again, fewer at a time.
READ_BYTES = 8 << 20
#: Reads a shard keeps in memory between read and ack: the batch being
#: applied and the one read ahead (runner.Handoff holds one).
READS_IN_FLIGHT = 2
#: Entries of held turns (--hold-turns), over all shards: past it the
#: oldest held turns spill to the stored path, which keeps them in Redis.
HELD_BYTES = 32 << 20
#: Entries behind the worker's mirrors of stored turns (processor.mirror),
#: over all shards: past it the oldest mirrors are dropped (their turns are
#: finalised from their records in Redis).
MIRROR_BYTES = 32 << 20
#: Stored bytes of the turns one finalise call settles (at least one turn,
#: which --max-turn-bytes bounds): more ready turns are settled in turn.
FINALISE_BYTES = 16 << 20


def read_bytes(shards: int, max_entry_bytes: int) -> int:
    """One shard's read budget: its share of ``READ_BYTES``, but room
    for at least two entries of the largest valid size (with their field
    names and the reply's framing), so that every valid entry can be read."""
    return max(READ_BYTES // max(1, shards), 2 * max_entry_bytes + (64 << 10))


def read_count(budget: int, batch: int, reply_bytes: int, entries: int) -> int:
    """How many entries the next read asks for: ``batch``, or fewer when the
    last reply's entries were large (half the budget at their mean size,
    so that a few larger ones do not make the parser cut the reply)."""
    if entries <= 0 or reply_bytes <= 0:
        return batch
    mean = reply_bytes / entries
    return max(1, min(batch, int(budget / 2 / mean)))

"""Shard affinity: which shards a worker reads new entries from.

Any worker can finish any turn (its state is in Redis), but a worker that
reads all of a turn's entries publishes it from its own mirror of the merge,
while a turn whose entries were spread over several workers is replayed from
the records read back from Redis, which costs more per update. So the live
workers of a consumer group split the shards between them:

- each worker beats every ``ttl / 5`` seconds (``beat_worker.lua``); the
  live set is who beat within ``ttl``, on Redis's clock;
- shard ``s`` is read by the ``ceil(W / S)`` live workers that rank highest
  for it (rendezvous hashing): with at least as many shards as workers each
  shard has one reader, with fewer every shard keeps being shared, so
  adding workers still adds readers to a single shard;
- a worker joining or leaving moves only the shards it gains or gives up,
  and for a moment two workers may read one shard: harmless, as before.

Nothing is lost if views disagree or a worker hangs: a worker also reads a
shard it does not own while that shard has entries nobody has delivered and
none of its owners has read from it for ``ttl`` (``stalled``).

Pure functions here; ``processor.worker.membership`` does the I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping

#: How many beats fit in the TTL: a worker misses up to four before it is
#: taken for dead.
BEATS_PER_TTL = 5


def readers_per_shard(workers: int, shards: int) -> int:
    """How many live workers read each shard: enough that every worker can
    have one when there are more workers than shards."""
    return max(1, -(-workers // max(1, shards)))


def _rank(consumer: str, shard: int) -> bytes:
    # A stable hash of (consumer, shard), the same in every process (unlike
    # hash()): every worker computes the same owners from the same live set.
    return hashlib.blake2b(f"{shard}\x00{consumer}".encode(), digest_size=8).digest()


def shard_readers(live: Collection[str], shard: int, shards: int) -> list[str]:
    """The live workers that read ``shard``, best-ranked first."""
    ranked = sorted(live, key=lambda consumer: _rank(consumer, shard), reverse=True)
    return ranked[: readers_per_shard(len(ranked), shards)]


def owned_shards(me: str, live: Collection[str], shards: int) -> frozenset[int]:
    """The shards ``me`` reads, given the live workers (``me`` counts as
    live whatever the set says: a worker that reads is alive)."""
    everyone = set(live) | {me}
    return frozenset(s for s in range(shards) if me in shard_readers(everyone, s, shards))


def stalled(owners_idle_ms: Mapping[str, int | None], owners: Collection[str],
            undelivered: bool, ttl_ms: int) -> bool:
    """Whether a shard this worker does not own needs it anyway: entries
    wait that no one delivered, and none of the shard's owners has read from
    it (XREADGROUP, XAUTOCLAIM) for ``ttl_ms``, or ever (``None``, or absent
    from the group's consumers)."""
    if not undelivered:
        return False
    for owner in owners:
        idle = owners_idle_ms.get(owner)
        if idle is not None and idle < ttl_ms:
            return False
    return True

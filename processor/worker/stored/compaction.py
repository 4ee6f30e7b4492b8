"""Compacting long turns: the worker's side of ``compact_turn.lua``.

``apply_entries`` reports the turns whose stored records reached the
threshold; here one pipeline reads the shard's watermark (oldest pending
entry) and then their records, ``processor.engine.compaction.plan_compaction``
folds the records below the watermark into a snapshot, and ``compact_turn``
swaps them atomically if nothing changed meanwhile. Reading the watermark
*before* the records is what makes the plan complete: the watermark only
moves forward, so every entry below it was applied, and stored, before the
records were read. Docs: docs/design.md, "Compaction".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from processor.engine.compaction import plan_compaction
from processor.redis_io.replies import as_text
from processor.scripts.calls import BatchOptions
from processor.scripts.stored_calls import build_compact, compact_turn
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient
    from processor.scripts import Scripts


async def compact_turns(
    client: RedisClient, scripts: Scripts, shard: Shard, keys: list[TurnKey], options: BatchOptions
) -> dict[TurnKey, int]:
    """Compact each turn as far as the watermark allows; returns the script's
    answer per turn it tried (1 compacted, 0 gone, -1 changed, 2 not yet)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.xpending(shard.updates, options.group)  # first: see the module docstring
        for key in keys:
            tk = key.encode()
            pipe.hexists(shard.turn(tk), "closing")
            pipe.hgetall(shard.recs(tk))
        replies = await pipe.execute()
    summary = replies[0]
    watermark = as_text(summary["min"]) if summary["pending"] else None
    # Rewriting the snapshot costs its size: only when enough records fold.
    minimum = max(1, options.compact_threshold // 4)
    results: dict[TurnKey, int] = {}
    for i, key in enumerate(keys):
        closing, recs = replies[1 + 2 * i], replies[2 + 2 * i]
        if closing or not recs:
            continue  # finalised soon (or already): nothing to gain
        plan = plan_compaction(key, recs, watermark, options.limits, minimum)
        if plan is None:
            continue
        call = build_compact(shard, key, plan, options)
        results[key] = await compact_turn(scripts.compact_turn, call)
    return results

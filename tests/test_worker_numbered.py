"""Numbered entries (docs/contract.md §3.4) through real workers, held and
stored: a turn that lost entries never says ``completed``.

- entries deleted from the stream before any worker read them (``XDEL`` of
  one in the middle, ``XTRIM MINID`` of a turn's first two): the turn ends
  ``error`` ``entries_lost`` with the merge of the rest and
  ``counts.missing``; an unnumbered turn that lost one completes, as before;
- a producer's retry that got one entry through twice: merged once,
  ``counts.duplicates`` 1, and the turn's live log (which ``processor
  serve`` folds for a joining client) holds it once too;
- Redis restarted without persistence under load: no numbered turn is
  published ``completed`` with content missing.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
import redis.asyncio
from strategies import numbered, random_turn
from turn_reference import offline_results
from worker_harness import Harness

from processor.client import Producer, RetryPolicy
from processor.client.source import LogSource
from processor.client.turns import TurnRef
from processor.embedded import EmbeddedRedis

HOLD = pytest.mark.parametrize("hold", [True, False], ids=["held", "stored"])


def update(rid: str, text: str) -> dict[str, Any]:
    return {"response_id": rid, "update": {"contents": [{"type": "text", "text": text}],
                                           "role": "assistant", "message_id": "m1"}}


def turn(rid: str, texts: list[str]) -> list[dict[str, Any]]:
    """A turn of text updates and its end, numbered from 0."""
    return numbered([*(update(rid, t) for t in texts), {"response_id": rid, "kind": "end"}])


def merged_of(outputs: Any, rid: str) -> dict[str, Any]:
    (found,) = [t for k, t in outputs.turns.items() if k.response_id == rid]
    (merged,) = found.merged
    return {**merged, "meta": json.loads(merged["meta"]),
            "response": json.loads(merged["response"])}


def text_of(response: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for m in response["messages"] for c in m["contents"])


def terminal_of(outputs: Any, rid: str) -> dict[str, Any]:
    (found,) = [t for k, t in outputs.turns.items() if k.response_id == rid]
    return found.events[-1]


async def _group_first(harness: Harness) -> None:
    """The consumer group, before any entry: entries added now wait unread."""
    for shard in harness.shards:
        await harness.client.xgroup_create(shard.updates, harness.group, id="0", mkstream=True)


@HOLD
async def test_entries_deleted_before_they_were_read_end_their_turn_entries_lost(
        redis_url: str, namespace: str, hold: bool) -> None:
    """``head`` loses its first two entries to an XTRIM (caught from the
    first entry the worker sees, number 2), ``cut`` one in the middle to an
    XDEL; ``whole`` loses nothing, and ``plain`` (unnumbered) loses one and
    completes as it always did (no number, no check)."""
    async with Harness(redis_url, namespace, 1, hold_turns=hold) as harness:
        await _group_first(harness)
        head = await harness.add(turn("head", ["h0 ", "h1 ", "h2 ", "h3 "]))
        cut = await harness.add(turn("cut", ["c0 ", "c1 ", "c2 ", "c3 "]))
        await harness.add(turn("whole", ["w0 ", "w1 "]))
        plain = await harness.add([update("plain", "p0 "), update("plain", "p1 "),
                                   {"response_id": "plain", "kind": "end"}])
        updates = harness.ns.shard(0).updates
        assert await harness.client.xtrim(updates, minid=head[2], approximate=False) == 2
        assert await harness.client.xdel(updates, cut[2], plain[1]) == 2
        await harness.start_worker()
        await harness.wait_merged(4, timeout=30)
        await harness.wait_drained(timeout=30)
        outputs = await harness.outputs()
    for rid, text, missing in (("head", "h2 h3 ", 2), ("cut", "c0 c1 c3 ", 1)):
        merged = merged_of(outputs, rid)
        assert merged["status"] == "error", (rid, merged)
        assert merged["meta"]["error"]["code"] == "entries_lost"
        assert text_of(merged["response"]) == text
        assert merged["meta"]["counts"]["missing"] == missing
        final = terminal_of(outputs, rid)
        assert final["type"] == "synthesis" and final["status"] == "error"
        assert final["error"]["code"] == "entries_lost" and final["counts"]["missing"] == missing
    whole = merged_of(outputs, "whole")
    assert whole["status"] == "completed" and text_of(whole["response"]) == "w0 w1 "
    assert whole["meta"]["counts"]["missing"] == 0
    plain_merged = merged_of(outputs, "plain")
    assert plain_merged["status"] == "completed" and text_of(plain_merged["response"]) == "p0 "
    assert outputs.dlq == []


@HOLD
async def test_a_producer_retry_that_doubled_an_entry_is_merged_once(
        redis_url: str, namespace: str, hold: bool) -> None:
    """Entry 1 of the turn is in the stream twice (a retry that got through
    twice, its idempotency key gone): merged once, counted in
    ``counts.duplicates``, nothing dead-lettered, and the turn's live log
    (what ``processor serve`` folds for a client that joins) holds it once."""
    entries = turn("twice", ["a ", "b ", "c ", "d "])
    first, rest = entries[:3], entries[3:]
    doubled = [first[0], first[1], dict(first[1]), first[2]]
    async with Harness(redis_url, namespace, 1, hold_turns=hold, hold_ms=60_000) as harness:
        await harness.start_worker()
        await harness.add(doubled)
        source = LogSource(harness.client, harness.ns)
        ref = TurnRef("twice")

        async def logged() -> str:  # the live log's merge, once it has the entries so far
            snapshot = await source.snapshot(ref)
            text = text_of(json.loads(snapshot.response)) if snapshot is not None else ""
            return text if text.endswith("c ") else ""

        await harness.wait_for(logged, 20, "the live log of the first entries")
        assert await logged() == "a b c "
        await harness.add(rest)
        await harness.wait_merged(1, timeout=30)
        await harness.wait_drained(timeout=30)
        outputs = await harness.outputs()
    merged = merged_of(outputs, "twice")
    assert merged["status"] == "completed"
    assert text_of(merged["response"]) == "a b c d "
    counts = merged["meta"]["counts"]
    assert (counts["entries"], counts["updates"], counts["duplicates"], counts["missing"]) == (
        5, 4, 1, 0)
    assert terminal_of(outputs, "twice")["counts"]["duplicates"] == 1
    assert outputs.dlq == []
    (want,) = offline_results(entries).values()
    assert merged["response"] == json.loads(json.dumps(want.line["response"]))

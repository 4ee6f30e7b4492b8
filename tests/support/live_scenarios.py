"""The scenario files of tests/data/scenarios fed to live workers: shared by the
live scenario, ACL and Cluster tests, which feed them the same way."""

from __future__ import annotations

import json
from typing import Any

from processor.engine.lifecycle import Limits
from support.turn_reference import TurnOutput, offline_results
from support.worker_harness import Harness

# Turns without an end entry end as turn_timeout, offline at the end of the
# file and live after this many seconds without an entry.
TURN_TIMEOUT = 3.0


def scenario_segments(lines: list[str]) -> list[tuple[list[dict[str, Any]], str | None]]:
    """The scenario's entries split at its cancel lines: (entries, then cancel this id)."""
    out: list[tuple[list[dict[str, Any]], str | None]] = []
    current: list[dict[str, Any]] = []
    for line in lines:
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry.get("kind") == "cancel":
            out.append((current, entry["response_id"]))
            current = []
        else:
            current.append(entry)
    out.append((current, None))
    return out


def offline_results_of_lines(lines: list[str]) -> dict:
    """``processor merge`` of the scenario file as it is (cancel lines included)."""
    entries = [json.loads(line) for line in lines if line.strip()]
    return offline_results(entries, Limits(turn_timeout=TURN_TIMEOUT))


def cancel_reasons(lines: list[str]) -> dict[str, str]:
    """Each cancelled turn's reason as its key's value: its first cancel line's
    ``reason``, or empty (a cancel with no reason: ``processor merge`` gives
    the same null ``cancel_reason``)."""
    reasons: dict[str, str] = {}
    for line in lines:
        entry = json.loads(line) if line.strip() else {}
        if entry.get("kind") == "cancel":
            reasons.setdefault(entry["response_id"], entry.get("reason") or "")
    return reasons


async def feed_scenario(harness: Harness, lines: list[str]) -> None:
    """Add the scenario's entries in file order; a cancel line sets its key once
    the entries before it were applied, and the entries after it are added
    once the workers saw it (its turn published, if it had started). Live,
    the cancel cuts a turn where a worker first sees it (docs/design.md,
    *Cancellation*): an entry a worker read before that is merged, so the
    file's order is kept only if nothing is read in between."""
    started: set[str] = set()
    reasons = cancel_reasons(lines)
    for entries, cancel in scenario_segments(lines):
        await harness.add(entries)
        started.update(str(e.get("response_id")) for e in entries)
        if cancel is not None:
            await harness.wait_applied()
            await cancel_seen(harness, cancel, cancel in started, reasons[cancel])


async def cancel_seen(harness: Harness, response_id: str, started: bool,
                      reason: str = "") -> None:
    """Set a turn's cancel key (to ``reason``) and, if the turn had started,
    wait until the workers saw it (its turn published): entries added after
    this are read after the cancel, so they are dropped (docs/design.md,
    *Cancellation*)."""
    await harness.cancel(response_id, reason=reason)
    if started:
        await harness.wait_for(_published(harness, response_id), 30, f"{response_id} cancelled")


def _published(harness: Harness, response_id: str) -> Any:
    async def published() -> bool:
        shard = harness.ns.shard_for(response_id)
        found = await harness.client.xrange(shard.merged, "-", "+")
        return any(fields.get(b"response_id", fields.get("response_id")) in
                   (response_id, response_id.encode()) for _id, fields in found)
    return published


async def with_late_drops(harness: Harness, turn: TurnOutput) -> dict:
    """The turn's result, its ``dropped`` count including the entries that came
    after its terminal event: a cancel may end the turn before the producer's
    last entries arrive (which one wins is timing), and those are counted on
    the turn's done marker instead (docs/design.md, "Offline vs live")."""
    result = turn.result()
    shard = harness.ns.shard_for(turn.key.response_id)
    late = await harness.client.hget(shard.done(turn.key.encode()), "dropped")
    result["meta"]["counts"]["dropped"] += int(late or 0)
    return result

"""Every scenario of tests/data/scenarios through live workers on a real Redis:
the same ``response`` as ``processor merge``, byte for byte, and the
scenario's expectations hold on what the workers published."""

from __future__ import annotations

import json

import pytest
from expectations import check_scenario, scenario_lines, scenario_names
from worker_harness import Harness, compare_with_offline, offline_results

from processor.lifecycle import Limits

# Turns without an end entry end as turn_timeout, offline at the end of the
# file and live after this many seconds without an entry.
TURN_TIMEOUT = 3.0


def _segments(lines: list[str]) -> list[tuple[list[dict], str | None]]:
    """The scenario's entries split at its cancel lines: (entries, then cancel this id)."""
    out: list[tuple[list[dict], str | None]] = []
    current: list[dict] = []
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


@pytest.mark.parametrize("name", scenario_names())
async def test_scenario_live_equals_offline(name: str, redis_url: str, namespace: str) -> None:
    lines = scenario_lines(name)
    offline = offline_results_of_lines(lines)
    async with Harness(redis_url, namespace,
                       limits=Limits(turn_timeout=TURN_TIMEOUT)) as harness:
        await harness.start_workers(2)
        for entries, cancel in _segments(lines):
            await harness.add(entries)
            if cancel is not None:
                # The cancel key is set once the entries before it were applied.
                await harness.wait_applied()
                await harness.cancel(cancel)
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline, name)
    check_scenario(name, [t.result() for t in outputs.turns.values()])


def offline_results_of_lines(lines: list[str]) -> dict:
    """``processor merge`` of the scenario file as it is (cancel lines included)."""
    entries = [json.loads(line) for line in lines if line.strip()]
    return offline_results(entries, Limits(turn_timeout=TURN_TIMEOUT))

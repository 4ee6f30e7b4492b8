"""Every scenario of tests/data/scenarios through live workers on a real Redis:
the same ``response`` as ``processor merge``, byte for byte, the scenario's
expectations hold on what the workers published, and (``--agui``) each
turn's AG-UI run in ``{ns:s}:agui`` is valid AG-UI 1.0 and the run
``processor.engine.agui.project`` makes offline."""

from __future__ import annotations

import json

import msgspec
import pytest
from support.agui_checks import check_run, read_runs, without_timestamps
from support.expectations import check_scenario, scenario_lines, scenario_names
from support.live_scenarios import (
    TURN_TIMEOUT,
    feed_scenario,
    offline_results_of_lines,
    with_late_drops,
)
from support.turn_reference import compare_with_offline
from support.worker_harness import Harness

from processor.engine.agui import project
from processor.engine.lifecycle import Limits
from processor.engine.offline import merge_lines


@pytest.mark.parametrize("hold", [False, True], ids=["stored", "held"])
@pytest.mark.parametrize("name", scenario_names())
async def test_scenario_live_equals_offline(
    name: str, hold: bool, redis_url: str, namespace: str
) -> None:
    """Both paths: turns stored entry by entry (the default), and held in
    the worker's memory (--hold-turns), spilling to the stored path when a
    cancel, a dead letter or a limit calls for it."""
    lines = scenario_lines(name)
    offline = offline_results_of_lines(lines)
    # Held: spilled within 1 s, so that waiting for the entries before a
    # cancel to be applied (stored) stays under the 3 s turn timeout.
    held = {"hold_ms": 1000} if hold else {"hold_turns": False}
    async with Harness(redis_url, namespace, agui=True,
                       limits=Limits(turn_timeout=TURN_TIMEOUT), **held) as harness:
        await harness.start_workers(2)
        await feed_scenario(harness, lines)
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        outputs = await harness.outputs()
        runs = await read_runs(harness.client, [s.agui for s in harness.shards])
        results = [await with_late_drops(harness, t) for t in outputs.turns.values()]
    compare_with_offline(outputs, offline, name)
    check_scenario(name, results)
    _check_agui(lines, runs)


def _check_agui(lines: list[str], runs: dict[str, list[dict]]) -> None:
    """One valid AG-UI run per turn, the one ``project`` makes offline."""
    want = {}
    for result in merge_lines(lines, limits=Limits(turn_timeout=TURN_TIMEOUT)).results():
        want[result.meta.synthesis_id] = (
            json.loads(json.dumps(project(result.response, result.meta, result.status))),
            json.loads(msgspec.json.encode(result.response)), result.status)
    assert set(runs) == set(want)
    for sid, (events, response, status) in want.items():
        check_run(runs[sid], response, status)
        assert without_timestamps(runs[sid]) == without_timestamps(events), sid

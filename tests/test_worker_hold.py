"""Held turns (``--hold-turns``, processor/hold.py, processor/holding.py):
a turn's entries stay pending and are merged in the worker's memory only,
then published and acked in one ``finalise_held``; whenever holding stops
being safe (a crash, another consumer's entries, a cancel, the hold bound,
a stop) the turn is spilled to ``apply_entries`` and finishes as a stored
turn. Every path publishes what ``processor merge`` of the same entries
publishes, exactly once."""

from __future__ import annotations

import random
from typing import Any

from strategies import random_turn
from turn_reference import compare_with_offline, interleave, offline_results, simple_turn
from worker_harness import Harness

from processor.decode import decode_entry
from processor.hold import Holds
from processor.ids import TurnKey
from processor.lifecycle import Limits
from processor.mirror import Applied
from processor.worker import Worker

HOLD = {"hold_turns": True}


def _metric(worker: Worker, name: str, **labels: str) -> float:
    value = worker.metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


def _turns(n: int, seed: int = 7) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [random_turn(rng, f"r{i}") for i in range(n)]


async def test_held_turns_publish_the_offline_merge_without_storing_a_record(
    redis_url: str, namespace: str
) -> None:
    turns = _turns(60)
    entries = interleave(turns, random.Random(3))
    async with Harness(redis_url, namespace, batch=50, **HOLD) as harness:
        (running,) = await harness.start_workers(1)
        await harness.add(entries)
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
        worker = running.worker
        held = _metric(worker, "processor_turns_settled_total", source="held")
        spilled = _metric(worker, "processor_held_turns_spilled_total")
    compare_with_offline(outputs, offline_results(entries))
    assert held == len(turns) and spilled == 0


def _applied(key: TurnKey, entry_id: str, fields: dict[str, Any]) -> Applied:
    _key, record = decode_entry(fields)
    return Applied(key, entry_id, record, 10)


def test_a_turn_is_held_from_its_first_entry_and_fed_each_entry_once() -> None:
    holds = Holds(Limits(), max_turns=10, max_bytes=1 << 20)
    key = TurnKey("r1")
    fields = [{"response_id": "r1", "update": e["update"]} for e in simple_turn("r1", 2)[:2]]
    raw = [(f"{i}-0", f) for i, f in enumerate(fields, 1)]
    applied = [_applied(key, i, f) for i, f in raw]
    assert holds.to_open(applied) == {key: {}}
    holds.opened({key: True}, "5", now=0.0)
    routed = holds.route(raw, applied)
    assert routed.held == [key] and routed.stored == []
    again = holds.route(raw, applied)  # the same batch after a lost reply: nothing twice
    assert again.held == [] and holds.turns[key].ids == ["1-0", "2-0"]
    assert holds.to_open(applied) == {}

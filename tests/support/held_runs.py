"""What the held-turn tests (tests/worker/test_worker_hold*.py) share: the
harness option that holds turns, a metric of an in-process worker, and
random turns to hold."""

from __future__ import annotations

import random
from typing import Any

from processor.worker.worker import Worker
from support.strategies import random_turn

HOLD = {"hold_turns": True}


def metric(worker: Worker, name: str, **labels: str) -> float:
    value = worker.metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


def random_turns(n: int, seed: int = 7) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [random_turn(rng, f"r{i}") for i in range(n)]

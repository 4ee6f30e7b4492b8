"""docs/contract.md §4.8: the merged output of a turn is byte-identical whatever the
number of workers and shards. The same 600 random multi-agent turns go
through 1 worker, 3 workers, and 3 workers on 3 shards; every turn is merged
exactly once with one terminal event, and equals ``processor merge``
byte for byte, so the three runs equal each other. Each run is its own test
(one parameter), so that pytest-xdist runs them side by side."""

from __future__ import annotations

import functools
import random
import uuid

import pytest
from support.delta_oracle import check_deltas
from support.expectations import check_invariants
from support.strategies import random_turn
from support.turn_reference import compare_with_offline, interleave, offline_results
from support.worker_harness import Harness

TURNS = 600
SEED = 20260101


@functools.cache
def _turns() -> list[list[dict]]:
    rng = random.Random(SEED)
    return [random_turn(rng, f"resp-{i:05d}") for i in range(TURNS)]


@functools.cache
def _arrival_and_offline() -> tuple[list[dict], dict]:
    # Concurrent producers: the turns' entries interleave in the stream.
    arrival = interleave(_turns(), random.Random(SEED + 1))
    return arrival, offline_results(arrival)


async def _run(url: str, namespace: str, arrival: list[dict], workers: int, shards: int) -> dict:
    async with Harness(url, namespace, shards=shards, batch=200) as harness:
        await harness.start_workers(workers)
        await harness.add(arrival)
        await harness.wait_merged(TURNS, timeout=120)
        await harness.wait_drained()
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    assert outputs.merged_count == TURNS
    assert not outputs.dlq, outputs.dlq[:3]
    return outputs


@pytest.mark.parametrize(("workers", "shards"), [(1, 1), (3, 1), (3, 3)])
async def test_worker_count_does_not_matter(redis_url: str, workers: int, shards: int) -> None:
    turns = _turns()
    arrival, offline = _arrival_and_offline()
    assert len(offline) == TURNS

    namespace = f"t{uuid.uuid4().hex[:8]}"
    outputs = await _run(redis_url, namespace, arrival, workers, shards)
    # Byte-identical to processor merge's response for every turn, whatever
    # the workers and shards: hence identical across the three parameters.
    compare_with_offline(outputs, offline, f"{workers} workers, {shards} shards")
    # docs/contract.md §4 on the live output of a sample of turns.
    sample = random.Random(SEED + 2).sample(range(TURNS), 50)
    for i in sample:
        key = next(k for k in offline if k.response_id == f"resp-{i:05d}")
        result = outputs.turns[key].result()
        check_invariants(result, f"turn {key.response_id}")
        check_deltas(turns[i], result["response"])


async def test_workers_on_a_redis_cluster(redis_cluster) -> None:
    """The same random turns on a 3-master Redis Cluster, 3 shards spread over
    the nodes by their hash tags, 2 workers: still processor merge's output."""
    rng = random.Random(SEED + 3)
    arrival = interleave([random_turn(rng, f"cl-{i:04d}") for i in range(200)], rng)
    offline = offline_results(arrival)
    namespace = f"t{uuid.uuid4().hex[:8]}"
    async with Harness(redis_cluster.url, namespace, shards=3, cluster=True) as harness:
        await harness.start_workers(2)
        await harness.add(arrival)
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    compare_with_offline(outputs, offline, "cluster")
    assert outputs.dlq == []

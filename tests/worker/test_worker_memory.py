"""No leak in Redis: ``used_memory`` after a 100,000-update run and a drain is
within 1 MiB of what it was before the run.

"Drain" is what happens downstream once a run is over: the output streams
(merged, events, dlq) are read and deleted, as a consumer that trims them
would, and the finished turns' ``done`` markers expire. The workers run with
a done TTL of 1 s (default 1 day) so that the test can wait for that expiry.
A fresh redis-server is used so that no other test's keys are counted.
bench/memory_drain.py runs the same code and prints the figures.
"""

from __future__ import annotations

from collections.abc import Callable

from support.memory_runs import memory_drain
from support.worker_harness import Harness

from processor.embedded import EmbeddedRedis

UPDATES = 100_000
DONE_TTL = 1  # seconds; see the module docstring


async def test_memory_returns_to_baseline_after_drain(
    make_redis_server: Callable[..., EmbeddedRedis], namespace: str
) -> None:
    server = make_redis_server()
    async with Harness(server.url, namespace, shards=2, done_ttl=DONE_TTL) as harness:
        await harness.start_workers(2)
        figures = await memory_drain(harness, UPDATES, per_turn=20, done_ttl=DONE_TTL)
        leftover = await harness.state_keys()
    assert figures.updates == UPDATES
    assert leftover == []
    # The run did hold state (the figure is not trivially flat) ...
    assert figures.peak > figures.before + (1 << 20)
    # ... and gave it all back.
    assert abs(figures.growth) < 1 << 20, figures

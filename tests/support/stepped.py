"""A worker the test drives itself, for races the shard loop would not
let a test stage: ``Stepped`` reads and applies one batch when asked (on a
``support.worker_harness.Harness``'s namespace), so other consumers get
exactly the entries the test gives them. ``settled_count`` reads one
in-process worker's settled turns."""

from __future__ import annotations

from typing import Any

from processor.redis_io.connections import fast_stream_reads, read_raw
from processor.worker.held.batch import decode_batch
from processor.worker.worker import Worker
from support.worker_harness import Harness


def settled_count(worker: Any, source: str) -> float:
    """``processor_turns_settled_total{source}`` of one in-process worker."""
    value = worker.metrics.registry.get_sample_value("processor_turns_settled_total",
                                                     {"source": source})
    return value or 0.0


class Stepped:
    """A held-turns worker driven step by step by the test (no loop of its
    own): the test reads for it and hands it each batch, so that other
    consumers get exactly the entries the test gives them."""

    def __init__(self, harness: Harness, **config: Any) -> None:
        self.harness = harness
        self.shard = harness.shards[0]
        config = {"hold_turns": True, **config}
        self.worker = Worker(harness.client, harness.worker_config(**config))
        for state in self.worker.shards:  # it knows every entry pending to it
            state.orphans = False

    async def start(self) -> Stepped:
        await self.harness.client.xgroup_create(self.shard.updates, self.harness.group,
                                                id="0", mkstream=True)
        return self

    async def read(self, consumer: str | None = None) -> list[Any]:
        """What ``consumer`` (default: this worker) gets from XREADGROUP >."""
        name = consumer or self.worker.config.consumer
        fast_stream_reads(self.harness.client)  # (read_raw's parser, as the worker's client has)
        return await read_raw(self.harness.client, self.harness.group, name,
                              self.shard.updates)

    async def step(self) -> None:
        """Read a batch and apply it as the shard loop would."""
        entries = await self.read()
        worker, shard = self.worker, self.shard
        worker.shard(0).floor_marks.read(entries[0][0].decode(), entries[-1][0].decode())
        call = decode_batch(shard, entries, worker.options, 0)
        await worker.held.apply_held(shard, entries, call)
        await worker.held.settle(shard)  # (its finalise committed, as before the loop's next step)

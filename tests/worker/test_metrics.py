"""The metrics of a live ``processor run``: every named metric is served, and
the counts match what the test pushed through (completed, failed, cancelled
turns, dead letters by reason, drops, reclaims); the sampled gauges match
what XINFO GROUPS, XLEN and the active set say."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import redis.exceptions
from support.scrape import Scrape, fetch, scrape, wait_status
from support.turn_reference import simple_turn
from support.worker_harness import Harness

from processor.embedded import free_port
from processor.wire.keys import Namespace
from processor.worker.metrics import Metrics, dead_letter_reasons, label
from processor.worker.sampler import Sampler

NAMES = (
    "processor_entries_consumed", "processor_entries_stored", "processor_merged_published",
    "processor_terminal_events_published", "processor_dlq_entries", "processor_cancels",
    "processor_dropped_entries", "processor_reclaimed_entries", "processor_redis_errors",
    "processor_redis_retries", "processor_step_failures", "processor_batch_entries",
    "processor_merge_seconds", "processor_turns_settled", "processor_finalise_seconds",
    "processor_end_to_merged_seconds",
    "processor_active_turns",
    "processor_group_lag", "processor_group_pending", "processor_group_consumers",
    "processor_dlq_length", "processor_loop_heartbeat_seconds", "processor_sample_errors",
    "processor_inbox_admitted", "processor_inbox_length",
)


def _update(text: str) -> str:
    return json.dumps({"type": "agent_response_update", "role": "assistant",
                       "contents": [{"type": "text", "text": text}]})


async def test_metrics_move_with_the_turns_pushed_through(redis_url, namespace, tmp_path) -> None:
    port = free_port()
    async with Harness(redis_url, namespace, shards=2, log_dir=tmp_path) as harness:
        # A dead consumer holds the entries of one turn: the worker reclaims them.
        ghost = simple_turn("ghost", 4)
        shard = harness.shard_of(ghost[0])
        for s in harness.shards:
            await harness.client.xgroup_create(s.updates, "processor", id="0", mkstream=True)
        await harness.add(ghost)
        await harness.client.xreadgroup("processor", "dead", {shard.updates: ">"})
        sub = harness.spawn(metrics_port=port, metrics_host="127.0.0.1", metrics_interval=0.2,
                            reclaim_idle_ms=500)
        await harness.wait_started([sub])
        await wait_status(port, "/metrics", 200)
        before = await scrape(port)
        assert set(NAMES) <= set(before.families), set(NAMES) - set(before.families)
        assert before.total("processor_merged_published_total") == 0

        await harness.cancel("cancelled", "test")
        turns = [
            *simple_turn("ok-1", 3), *simple_turn("ok-2", 5),
            *simple_turn("cancelled", 3),  # 4 entries, all dropped
            {"response_id": "failed", "update": _update("half")},
            {"response_id": "failed", "kind": "error", "error": "boom", "code": "x"},
            {"response_id": "bad", "update": "{not json"},  # bad_encoding
            {"response_id": "bad-2", "update": json.dumps({"contents": "nope"})},
            {"response_id": "open", "update": _update("never ends")},
        ]
        late = {"response_id": "ok-1", "update": _update("after the end")}  # turn_closed
        await harness.add(turns)
        await harness.wait_merged(5)  # ghost, ok-1, ok-2, cancelled, failed
        await harness.add([late])
        # (The open turn's entry is held, pending, until it has been held
        # --hold-ms, 5 s: then it is stored like the others.)
        await harness.wait_applied()
        pushed = len(ghost) + len(turns) + 1

        async def settled() -> Scrape:
            deadline = time.monotonic() + 20
            while True:
                now = await scrape(port)
                if (now.total("processor_active_turns") == 1
                        and now.total("processor_group_pending") == 0
                        and now.total("processor_dlq_entries_total") == 3) \
                        or time.monotonic() > deadline:
                    return now
                await asyncio.sleep(0.1)

        after = await settled()
        consumed = after.by_label("processor_entries_consumed_total", "source")
        reclaimed = after.total("processor_reclaimed_entries_total")
        assert consumed["reclaim"] == reclaimed == len(ghost)
        assert sum(consumed.values()) == pushed
        assert after.value("processor_batch_entries_sum") == pushed
        # Every entry is acked exactly once, into exactly one of these.
        stored = after.value("processor_entries_stored_total")
        dropped = after.value("processor_dropped_entries_total")
        dlq = after.by_label("processor_dlq_entries_total", "reason")
        assert dropped == 4
        assert dlq == {"bad_encoding": 1, "invalid_update": 1, "turn_closed": 1}
        assert stored + dropped + sum(dlq.values()) == pushed
        for name in ("merged_published", "terminal_events_published"):
            assert after.by_label(f"processor_{name}_total", "status") == {
                "completed": 3, "error": 1, "cancelled": 1}
        assert after.value("processor_cancels_total") == 1
        assert after.value("processor_merge_seconds_count") >= 5
        assert after.value("processor_finalise_seconds_count") >= 1
        # Timed for the turns an entry ended (ghost, ok-1, ok-2 and failed), not
        # the cancelled one; the ghost waited for its reclaim (500 ms idle).
        assert after.value("processor_end_to_merged_seconds_count") == 4
        assert 0.5 <= after.value("processor_end_to_merged_seconds_sum") < 60
        # Sampled per shard: the open turn is the one active turn left.
        assert after.total("processor_active_turns") == 1
        assert set(after.by_label("processor_group_lag", "shard")) == {"0", "1"}
        assert after.total("processor_group_pending") == 0
        assert after.total("processor_group_lag") == 0
        assert after.by_label("processor_dlq_length", "shard") == {
            str(s.index): float(await harness.client.xlen(s.dlq)) for s in harness.shards}
        assert after.total("processor_dlq_length") == 3
        # Labels never carry a response id.
        assert "ok-1" not in (await fetch(port, "/metrics"))[1]
        assert harness.terminate(sub) == 0


async def test_sampler_reports_lag_and_pending_as_redis_does(async_redis_client, namespace):
    ns = Namespace(namespace, 2)
    metrics = Metrics()
    sampler = Sampler(async_redis_client, ns, "processor", metrics)
    shard = ns.shard(1)
    await async_redis_client.xgroup_create(shard.updates, "processor", mkstream=True)
    ids = [await async_redis_client.xadd(shard.updates, {"n": i}) for i in range(5)]
    await sampler.sample()  # shard 0 has no stream: skipped, not an error
    assert metrics.sample_errors._value.get() == 0
    assert metrics.lag.labels("1")._value.get() == 5
    assert metrics.pending.labels("1")._value.get() == 0
    await async_redis_client.xreadgroup("processor", "c", {shard.updates: ">"}, count=2)
    await sampler.sample()
    assert metrics.lag.labels("1")._value.get() == 3
    assert metrics.pending.labels("1")._value.get() == 2
    assert metrics.consumers.labels("1")._value.get() == 1
    # As the worker does: ack and delete out of order. Redis can no longer
    # tell the lag (nil); length minus pending still can.
    await async_redis_client.xack(shard.updates, "processor", ids[1])
    await async_redis_client.xdel(shard.updates, ids[1])
    await async_redis_client.xdel(shard.updates, ids[3])
    await sampler.sample()
    assert metrics.pending.labels("1")._value.get() == 1
    assert metrics.lag.labels("1")._value.get() == 2  # ids[2], ids[4]
    await async_redis_client.zadd(shard.active, {"a": 1, "b": 2})
    await sampler.sample()
    assert metrics.active.labels("1")._value.get() == 2


def test_labels_are_bounded() -> None:
    assert label("turn_closed") == "turn_closed"
    assert label(b"ConnectionError") == "ConnectionError"
    for unbounded in ("resp-123", "a" * 49, "has space", "x:y", ""):
        assert label(unbounded) == "other"
    metrics = Metrics()
    metrics.applied([b"stored", 3, b"dropped", 1, b"dlq:max_deliveries", 2, b"dlq:r-1", 1])
    assert metrics.stored._value.get() == 3
    assert metrics.dlq.labels("max_deliveries")._value.get() == 2
    assert metrics.dlq.labels("other")._value.get() == 1


def test_dead_letter_reasons_read_the_packed_fields() -> None:
    import msgspec

    packed = msgspec.msgpack.encode([["kind", "update", "reason", "turn_limit", "x", "y"],
                                     ["reason", "turn_closed"]])
    assert dead_letter_reasons(packed) == ["turn_limit", "turn_closed"]
    assert dead_letter_reasons(msgspec.msgpack.encode([])) == []


async def test_sampler_and_readiness_work_on_a_cluster(redis_cluster, namespace) -> None:
    from redis.asyncio.cluster import RedisCluster

    from processor.host.health import groups_check

    ns = Namespace(namespace, 3)  # each shard on the master its hash tag picks
    client = RedisCluster.from_url(redis_cluster.url)
    try:
        check = groups_check(client, ns, "processor")
        assert "shard 0" in await check()
        for shard in ns.all():
            await client.xgroup_create(shard.updates, "processor", mkstream=True)
            await client.xadd(shard.updates, {"n": 1})
        assert await check() is None
        metrics = Metrics()
        await Sampler(client, ns, "processor", metrics).sample()
        assert metrics.sample_errors._value.get() == 0
        assert [metrics.lag.labels(str(s.index))._value.get() for s in ns.all()] == [1, 1, 1]
    finally:
        await client.aclose()


def test_a_redis_error_reply_counts_as_a_redis_error_and_a_step_failure() -> None:
    from redis.exceptions import ResponseError

    metrics = Metrics()
    metrics.step_failed(ResponseError("OOM command not allowed"))
    metrics.step_failed(KeyError("bug"))
    assert metrics.step_failures._value.get() == 2
    assert metrics.redis_errors.labels("ResponseError")._value.get() == 1
    assert metrics.redis_retries._value.get() == 0


async def test_a_read_that_fails_in_the_samplers_pipeline_is_a_sample_error_not_a_crash(
    async_redis_client, namespace, caplog
) -> None:
    """The pipeline answers a failed read with the exception as its value
    (``raise_on_error=False``): the stream's length lost in a cluster
    failover was passed to ``int()``, and a ``TypeError`` logged at error
    level (a chaos soak on a cluster caught it). It counts as a failed
    sample, logged at debug like any Redis failure."""
    ns = Namespace(namespace, 1)
    metrics = Metrics()
    shard = ns.shard(0)
    await async_redis_client.xgroup_create(shard.updates, "processor", mkstream=True)

    class LostLength:
        """The client, but its pipelines' XLEN answers a ConnectionError."""

        def __getattr__(self, name: str) -> Any:
            return getattr(async_redis_client, name)

        def pipeline(self, **kw: Any) -> Any:
            pipe = async_redis_client.pipeline(**kw)
            execute = pipe.execute

            async def lost(raise_on_error: bool = True) -> list[Any]:
                out = await execute(raise_on_error=raise_on_error)
                out[1] = redis.exceptions.ConnectionError("Connection closed by server.")
                return out

            pipe.execute = lost
            return pipe

    sampler = Sampler(LostLength(), ns, "processor", metrics)
    with caplog.at_level(logging.DEBUG, logger="processor.metrics"):
        await sampler.sample()
    assert metrics.sample_errors._value.get() == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

"""A namespace's record ({ns:0}:meta, processor/scripts/meta.py): the shard count
every party of a namespace must agree on lives in Redis, written once by
``processor init`` or the first worker and read by every worker, tool and
client. Each test is a way the count given to every party separately went
wrong silently (issue 26 item 1): a cancel written to the wrong shard, a
producer writing where no worker reads, a tool showing shards that do not
exist, a worker reading too few shards."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
from support.worker_harness import ROOT, Harness

from processor.client import Producer, Subscriber
from processor.scripts import meta
from processor.scripts.meta import Mismatch, NotInitialised
from processor.wire.ids import shard_of
from processor.wire.keys import Namespace
from processor.worker.worker import Worker, WorkerConfig

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
for _name in ("PROCESSOR_SHARDS", "PROCESSOR_NAMESPACE", "PROCESSOR_GROUP", "REDIS_URL"):
    ENV.pop(_name, None)


def cli(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "processor.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False, env={**ENV, **(env or {})})


def init(url: str, namespace: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return cli("init", "--redis-url", url, "--namespace", namespace, *args, **kwargs)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def on_shard(shard: int, shards: int, prefix: str = "turn") -> str:
    """A response id whose shard of ``shards`` is ``shard``."""
    return next(f"{prefix}{i}" for i in range(1000) if shard_of(f"{prefix}{i}", shards) == shard)


# --------------------------------------------------------------------------- the record


def test_init_writes_the_record_once_and_refuses_another_count(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    proc = init(redis_url, namespace, "--shards", "2")
    assert proc.returncode == 0, proc.stderr
    record = redis_client.hgetall(Namespace(namespace).meta)
    assert record[b"shards"] == b"2" and record[b"group"] == b"processor"
    assert len(record[b"epoch"]) == 32
    # Without --shards: the record's count, the record unchanged.
    proc = init(redis_url, namespace)
    assert proc.returncode == 0, proc.stderr
    assert "2 shard(s)" in proc.stdout
    assert redis_client.hgetall(Namespace(namespace).meta) == record
    assert redis_client.xinfo_groups(Namespace(namespace, 2).shard(1).updates)
    # A count given explicitly, by a flag or the environment, that disagrees.
    for args, env, source in ((["--shards", "3"], {}, "--shards"),
                              ([], {"PROCESSOR_SHARDS": "3"}, "PROCESSOR_SHARDS")):
        proc = init(redis_url, namespace, *args, env=env)
        assert proc.returncode == 2, proc.stderr
        line = one_line(proc.stderr)
        assert "has 2 shard(s)" in line and f"{source} says 3" in line, line
    assert redis_client.hgetall(Namespace(namespace).meta) == record
    assert not redis_client.exists(Namespace(namespace, 3).shard(2).updates)


async def test_the_record_is_written_once_whoever_comes_first(
    async_redis_client: Any, namespace: str
) -> None:
    found = await asyncio.gather(*(meta.create(async_redis_client, namespace, n, f"g{n}")
                                   for n in (2, 5, 3, 2)))
    assert len(set(found)) == 1
    (first,) = set(found)
    assert await meta.read(async_redis_client, namespace) == first


# --------------------------------------------------------------------------- workers


def test_run_refuses_a_shard_count_the_record_does_not_have(redis_url: str,
                                                             namespace: str) -> None:
    assert init(redis_url, namespace, "--shards", "2").returncode == 0
    proc = cli("run", "--redis-url", redis_url, "--namespace", namespace, "--shards", "3",
               timeout=30)
    assert proc.returncode == 2, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("processor run:")]
    assert len(line) == 1, proc.stderr
    assert "has 2 shard(s)" in line[0] and "--shards says 3" in line[0]


async def test_run_without_shards_serves_every_shard_of_the_record(
    redis_url: str, namespace: str, tmp_path: Any
) -> None:
    assert init(redis_url, namespace, "--shards", "2").returncode == 0
    rid = on_shard(1, 2)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "processor.cli", "run", "--redis-url",
                                 redis_url, "--namespace", namespace], stdout=out,
                                stderr=subprocess.STDOUT, env=ENV)
    try:
        async with Harness(redis_url, namespace, 2) as harness:
            await harness.add([{"response_id": rid, "update": '{"contents": []}'},
                               {"response_id": rid, "kind": "end"}])
            await harness.wait_merged(1, timeout=30)
            assert await harness.client.xlen(harness.ns.shard(1).merged) == 1
    finally:
        proc.terminate()
        proc.wait(30)
    assert '"shards": 2' in log.read_text()


async def test_a_worker_refuses_another_shard_count(redis_url: str, namespace: str) -> None:
    async with Harness(redis_url, namespace, 2) as harness:
        await harness.start_worker()
        client = harness.connect()
        try:
            worker = Worker(client, WorkerConfig(namespace=namespace, shards=3, consumer="w3"))
            with pytest.raises(Mismatch, match=r"has 2 shard\(s\).*says 3"):
                await asyncio.wait_for(worker.run(), 30)
        finally:
            await client.aclose()


# --------------------------------------------------------------------------- clients


async def test_producer_and_subscriber_take_the_shard_count_from_the_record(
    async_redis_client: Any, namespace: str
) -> None:
    await meta.create(async_redis_client, namespace, 2, "processor")
    keys = Namespace(namespace, 2)
    rid = on_shard(1, 2)
    producer = Producer(async_redis_client, namespace)
    await producer.send(rid, {"contents": []})
    await producer.cancel(rid)
    assert await async_redis_client.xlen(keys.shard(1).updates) == 1
    assert await async_redis_client.exists(keys.shard(1).cancel(rid)) == 1
    assert not await async_redis_client.exists(keys.shard(0).updates)
    subscriber = Subscriber(async_redis_client, namespace, block_ms=10)
    await subscriber.read(10)
    assert set(subscriber.positions) == {s.merged for s in keys.all()} | {
        s.events for s in keys.all()}
    # A count given that disagrees: refused, naming both, nothing written.
    wrong = Producer(async_redis_client, namespace, shards=1)
    with pytest.raises(Mismatch, match=r"has 2 shard\(s\).*shards= says 1"):
        await wrong.send(on_shard(0, 1), {"contents": []})
    with pytest.raises(Mismatch):
        await Subscriber(async_redis_client, namespace, 3).read(10)
    assert await async_redis_client.xlen(keys.shard(0).updates) == 0


async def test_a_client_of_an_uninitialised_namespace_is_told_so(
    async_redis_client: Any, namespace: str
) -> None:
    producer = Producer(async_redis_client, namespace, shards=1)
    with pytest.raises(NotInitialised, match="processor init"):
        await producer.send("t", {"contents": []})
    with pytest.raises(NotInitialised, match=f"'{namespace}' is not initialised"):
        await Subscriber(async_redis_client, namespace).read(10)
    assert not await async_redis_client.exists(Namespace(namespace).shard(0).updates)
    # Once a worker or init wrote the record, the same producer works.
    await meta.create(async_redis_client, namespace, 1, "processor")
    await producer.send("t", {"contents": []})


# --------------------------------------------------------------------------- tools


def test_cancel_without_shards_reaches_the_turns_shard(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    assert init(redis_url, namespace, "--shards", "2").returncode == 0
    rid = on_shard(1, 2)
    proc = cli("cancel", rid, "--redis-url", redis_url, "--namespace", namespace)
    assert proc.returncode == 0, proc.stderr
    assert redis_client.exists(Namespace(namespace, 2).shard(1).cancel(rid)) == 1
    assert not redis_client.exists(Namespace(namespace, 1).shard(0).cancel(rid))
    proc = cli("cancel", rid, "--redis-url", redis_url, "--namespace", namespace,
               "--shards", "3")
    assert proc.returncode == 2
    assert "has 2 shard(s)" in one_line(proc.stderr) and "says 3" in proc.stderr


def test_tools_need_no_shards_and_refuse_a_wrong_count(
    redis_url: str, namespace: str
) -> None:
    assert init(redis_url, namespace, "--shards", "3").returncode == 0
    common = ("--redis-url", redis_url, "--namespace", namespace)
    proc = cli("stats", *common, "--json")
    assert proc.returncode == 0, proc.stderr
    import json
    stats = json.loads(proc.stdout)
    assert [s["shard"] for s in stats["shards"]] == [0, 1, 2]
    assert all(s["group"] for s in stats["shards"]), "a shard without its group"
    for args in (("stats",), ("dlq", "list"), ("tail", "--no-follow")):
        proc = cli(*args, *common, "--shards", "2")
        assert proc.returncode == 2, (args, proc.stderr)
        assert "has 3 shard(s)" in one_line(proc.stderr) and "--shards says 2" in proc.stderr
        assert cli(*args, *common).returncode == 0, args


def test_tools_on_an_uninitialised_namespace_say_so(redis_url: str, namespace: str) -> None:
    common = ("--redis-url", redis_url, "--namespace", namespace)
    for args in (("stats",), ("dlq", "list"), ("tail", "--no-follow"), ("cancel", "t1")):
        proc = cli(*args, *common)
        assert proc.returncode == 1, (args, proc.stderr)
        line = one_line(proc.stderr)
        assert f"namespace '{namespace}' is not initialised" in line, line
        assert "processor init" in line


# --------------------------------------------------------------------------- resharding


def test_reshard_is_refused_until_every_shard_is_drained_and_no_worker_lives(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    assert init(redis_url, namespace, "--shards", "2").returncode == 0
    epoch = redis_client.hget(Namespace(namespace).meta, "epoch")
    old = Namespace(namespace, 2)
    entry = redis_client.xadd(old.shard(1).updates, {"response_id": "x", "kind": "end"})
    redis_client.zadd(old.shard(0).active, {"x": 1})
    proc = init(redis_url, namespace, "--shards", "3", "--reshard")
    assert proc.returncode == 1
    assert "shard 0 is not drained: 1 active turns" in proc.stderr
    assert "shard 1 is not drained: 1 entries" in proc.stderr
    assert redis_client.hget(Namespace(namespace).meta, "shards") == b"2"
    redis_client.xdel(old.shard(1).updates, entry)
    redis_client.zrem(old.shard(0).active, "x")
    seconds, micros = redis_client.time()
    redis_client.zadd(old.workers("processor"), {"w1": seconds * 1000 + micros // 1000})
    proc = init(redis_url, namespace, "--shards", "3", "--reshard")
    assert proc.returncode == 1 and "worker(s) live: w1" in proc.stderr
    redis_client.delete(old.workers("processor"))
    assert init(redis_url, namespace, "--reshard").returncode == 2  # no --shards
    proc = init(redis_url, namespace, "--shards", "3", "--reshard")
    assert proc.returncode == 0, proc.stderr
    assert "resharded from 2 to 3" in proc.stdout
    record = redis_client.hgetall(Namespace(namespace).meta)
    assert record[b"shards"] == b"3" and record[b"epoch"] == epoch
    assert redis_client.xinfo_groups(Namespace(namespace, 3).shard(2).updates)


async def test_a_worker_stops_when_its_namespace_is_resharded_under_it(
    redis_url: str, namespace: str
) -> None:
    async with Harness(redis_url, namespace, 2, worker_ttl=0.5) as harness:
        running = await harness.start_worker()
        await harness.client.hset(harness.ns.meta, "shards", "3")
        await asyncio.wait_for(running.task, 30)  # returns: it stopped by itself
        assert running.worker.fatal is not None and "3" in running.worker.fatal
        harness.workers.remove(running)
        await running.client.aclose()


# --------------------------------------------------------------------------- crowding


async def test_more_live_workers_than_shards_is_said_once_and_measured(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="processor.worker")
    async with Harness(redis_url, namespace, 1, worker_ttl=0.5) as harness:
        first, second = await harness.start_workers(2)
        registry = first.worker.metrics.registry

        def live() -> float | None:
            return registry.get_sample_value("processor_live_workers")

        await harness.wait_for(lambda: live() == 2, 10, "two live workers")
        deadline = time.monotonic() + 1.0  # several more beats (one every 0.1 s)
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert registry.get_sample_value("processor_shards") == 1
        crowded = [r for r in caplog.records
                   if r.getMessage().startswith("more live workers than shards")]
        assert len(crowded) == 2, [r.getMessage() for r in crowded]  # once per worker
        await harness.stop_worker(second)
        await harness.wait_for(lambda: live() == 1, 10, "one live worker")
        assert len([r for r in caplog.records
                    if r.getMessage() == "no more live workers than shards now"]) == 1

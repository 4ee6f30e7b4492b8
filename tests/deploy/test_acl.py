"""deploy/redis/users.acl, loaded into a real redis-server (7.0+): workers
running as the least-privilege ``processor`` user get every scenario right
without a single refused command, and each user is refused what its line
does not grant (commands, keys, and commands a Lua script runs). The cancel
keys, the producers and setting up with the file are test_acl_cancels.py's,
test_acl_producers.py's and test_acl_setup.py's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
import redis
from redis.exceptions import ResponseError
from support.acl_users import (
    NAMESPACE,
    PRODUCERS,
    SCRIPT_REFUSED,
    acl_log,
    cli,
    refused,
    run_every_scenario,
    shipped_lines,
    url_for,
)
from support.live_scenarios import TURN_TIMEOUT
from support.records import init_namespace_sync
from support.serve_harness import bearer, open_stream, payloads, spawn_serve, text_update
from support.worker_harness import Harness

from processor.client import Producer
from processor.embedded import EmbeddedRedis
from processor.engine.lifecycle import Limits
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace


def test_the_shipped_file_has_no_password_and_no_open_default_user() -> None:
    lines = shipped_lines()
    assert set(lines) == {"default", "processor", "producer", "producer-trusted", "keda",
                          "serve"}
    assert lines["default"].split()[2] == "off"
    for line in lines.values():
        tokens = line.split()
        assert not [t for t in tokens if t.startswith((">", "#", "<", "!"))], line
        assert "nopass" not in tokens and "+@all" not in tokens and "allkeys" not in tokens


@pytest.mark.parametrize("hold", [False, True], ids=["stored", "held"])
async def test_every_scenario_as_the_processor_user(acl_server: EmbeddedRedis, hold: bool) -> None:
    # The harness's own client (producing, cancelling, reading outputs) is the
    # admin; the workers connect with the URL of the ACL user.
    # --agui: the user may write the AG-UI stream too. Held: open_turns,
    # finalise_held, and the XCLAIM that keeps held entries from being
    # reclaimed (every 0.2 s here) run as the user too.
    held = {"hold_ms": 1000, "reclaim_idle_ms": 600} if hold else {"hold_turns": False}
    async with Harness(acl_server.url, NAMESPACE, shards=2, agui=True,
                       limits=Limits(turn_timeout=TURN_TIMEOUT), **held) as harness:
        harness.url = url_for(acl_server, "processor")
        await harness.start_workers(2)
        await run_every_scenario(harness)
        assert sum([await harness.client.xlen(s.agui) for s in harness.shards]) > 0
        await harness.stop_all()  # the drain's XPENDING / XGROUP DELCONSUMER run as the user
    assert acl_log(acl_server) == []  # nothing the workers did was refused


def test_processor_user_is_refused_other_commands_and_keys(acl_server: EmbeddedRedis) -> None:
    with redis.Redis.from_url(url_for(acl_server, "processor")) as worker:
        assert worker.ping()
        for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("KEYS", "*"),
                        ("SCAN", "0"), ("BGSAVE",), ("SHUTDOWN",), ("MONITOR",),
                        ("ACL", "LIST"), ("CLIENT", "KILL", "ID", "1"), ("SCRIPT", "FLUSH"),
                        ("EVAL", "return 1", "0"), ("PUBLISH", "c", "m"),
                        ("SET", "{agent:0}:turn:x", "v")):
            refused(worker, *command)
        # Keys outside the namespace's shard keys, and the producers' idempotency keys.
        refused(worker, "XADD", "{other:0}:updates", "*", "f", "v")
        refused(worker, "HSET", "agent:0:turn:x", "f", "v")
        refused(worker, "HSET", "{agent:0}:idem:x", "f", "v")
        refused(worker, "DEL", "somebody-elses-key")
        # Allowed: its own keys.
        assert worker.hset("{agent:0}:turn:x", "f", "v") == 1
        # A script runs as its caller: what the user may not run directly, it
        # may not run from Lua either, nor on keys it may not touch.
        with redis.Redis(**acl_server.client_kwargs()) as admin:
            flush = admin.script_load("return redis.call('FLUSHALL')")
            other = admin.script_load("return redis.call('HSET', KEYS[1], 'f', 'v')")
        with pytest.raises(ResponseError, match=SCRIPT_REFUSED):
            worker.evalsha(flush, 0)
        with pytest.raises(ResponseError, match=SCRIPT_REFUSED):
            worker.evalsha(other, 1, "{other:0}:turn:x")
        assert worker.evalsha(other, 1, "{agent:0}:turn:y") == 1


async def test_serve_as_the_serve_user_streams_and_cancels_but_writes_no_output(
    acl_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """``processor serve`` as the ``serve`` user (the command, as deployed):
    it starts (the namespace's record), streams a turn, answers its state and
    cancels it (the workers set the key: that user may not), the reason
    reaching the terminal event, with no refused command; and that user may
    write nothing."""
    async with Harness(acl_server.url, NAMESPACE, progress=True) as harness:
        harness.url = url_for(acl_server, "processor")
        await harness.start_worker()
        serve = spawn_serve(url_for(acl_server, "serve"), NAMESPACE, tmp_path)
        try:
            await serve.wait_serving()
            producer = Producer(harness.client, NAMESPACE)
            async with aiohttp.ClientSession(serve.url) as session:
                stream = await open_stream(session, "/v1/turns/s1/events", bearer("s1"))
                await producer.send("s1", text_update("half an answer"))
                while json.loads((await stream.event()).data)["type"] != "synthesis.chunk":
                    pass
                async with session.get("/v1/turns/s1", headers=bearer("s1")) as response:
                    assert response.status == 202
                async with session.post("/v1/turns/s1/cancel", headers=bearer("s1"),
                                        json={"reason": "user pressed stop"}) as response:
                    assert response.status == 202
                data = payloads(await stream.rest())
                async with session.get("/v1/turns/s1", headers=bearer("s1")) as response:
                    assert response.status == 200
                    assert (await response.json())["status"] == "cancelled"
                async with session.get("/readyz") as response:
                    assert response.status == 200
            assert data[-1]["type"] == "synthesis" and data[-1]["status"] == "cancelled"
            assert data[-1]["cancel_reason"] == "user pressed stop"
            assert serve.terminate() == 0
        finally:
            serve.kill()
    assert acl_log(acl_server) == []  # nothing serve did was refused
    shard = Namespace(NAMESPACE).shard(0)
    with redis.Redis.from_url(url_for(acl_server, "serve")) as user:
        assert user.xrevrange(shard.merged, count=1) and user.hgetall(Namespace(NAMESPACE).meta)
        for command in (("XADD", shard.merged, "*", "f", "v"),
                        ("XADD", shard.events, "*", "f", "v"),
                        ("XADD", shard.updates, "*", "f", "v"), ("RPUSH", shard.inbox, "x"),
                        ("HSET", shard.turn("r1"), "f", "v"), ("SET", shard.done("r1"), "v"),
                        ("DEL", shard.cancel("r1")), ("XTRIM", shard.merged, "MAXLEN", "0"),
                        ("HSET", Namespace(NAMESPACE).meta, "shards", "9"),
                        ("XREADGROUP", "GROUP", "processor", "s", "STREAMS", shard.updates, ">"),
                        ("XRANGE", shard.updates, "-", "+"), ("GET", shard.cancel("r2")),
                        ("SET", shard.cancel("r2"), "stop", "EX", "60"),
                        ("SET", shard.turn("x}:cancel:y"), "v"), ("SET", "{other:0}:cancel:r", "v"),
                        ("EVAL", "return 1", "0"), ("FCALL", "f", "1", shard.updates),
                        ("FLUSHALL",),
                        ("KEYS", "*"), ("CONFIG", "GET", "*")):
            refused(user, *command)


def test_keda_user_reads_lag_and_pending_only(acl_server: EmbeddedRedis) -> None:
    stream = Namespace(NAMESPACE).shard(0).updates
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        admin.xgroup_create(stream, "processor", id="0", mkstream=True)
        for i in range(3):
            admin.xadd(stream, {"response_id": f"r{i}", "kind": "end"})
    with redis.Redis.from_url(url_for(acl_server, "keda"), decode_responses=True) as keda:
        (group,) = keda.xinfo_groups(stream)
        assert group["lag"] == 3  # what KEDA's lagCount trigger reads
        assert keda.xpending(stream, "processor")["pending"] == 0
        refused(keda, "XADD", stream, "*", "f", "v")
        refused(keda, "XREADGROUP", "GROUP", "processor", "k", "STREAMS", stream, ">")
        refused(keda, "XRANGE", stream, "-", "+")
        refused(keda, "XINFO", "GROUPS", "{other:0}:updates")
        refused(keda, "GET", "{agent:0}:cancel:r1")


@pytest.mark.parametrize("user", PRODUCERS)
def test_producer_user_writes_inputs_but_not_worker_state_nor_cancel_keys(
    acl_server: EmbeddedRedis, user: str
) -> None:
    shard = Namespace(NAMESPACE).shard(0)
    with redis.Redis.from_url(url_for(acl_server, user)) as producer:
        if PRODUCERS[user]:
            producer.rpush(shard.inbox, "anything")
        else:
            producer.xadd(shard.updates, {"response_id": "r1", "kind": "end"})
        refused(producer, "SET", shard.cancel("r1"), "stop", "EX", "60")  # cancel_turn's
        assert producer.xrange(shard.merged) == []
        producer.hgetall(Namespace(NAMESPACE).meta)  # the namespace's record: read-only
        refused(producer, "HSET", Namespace(NAMESPACE).meta, "shards", "9")
        refused(producer, "XADD", shard.merged, "*", "f", "v")  # outputs are read-only
        refused(producer, "HGETALL", shard.turn("r1"))
        refused(producer, "XREADGROUP", "GROUP", "processor", "p", "STREAMS", shard.updates, ">")
        refused(producer, "XACK", shard.updates, "processor", "0-1")
        refused(producer, "XDEL", shard.updates, "0-1")
        refused(producer, "FLUSHALL")


async def test_processor_cancel_as_the_producer_user(acl_server: EmbeddedRedis,
                                                     tmp_path: Path) -> None:
    """It cancels (a worker sets the key for it), says when a turn had already
    ended, with no refused command; and without a running worker it says
    that no worker took the cancel, exit 1."""
    shard = Namespace(NAMESPACE).shard(0)
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        init_namespace_sync(admin, NAMESPACE)  # as a worker or processor init would
        admin.hset(shard.done(TurnKey("over").encode()), "status", "completed")
    url = url_for(acl_server, "producer")
    async with Harness(acl_server.url, NAMESPACE, log_dir=tmp_path) as harness:
        harness.url = url_for(acl_server, "processor")
        running = await harness.start_worker()
        over = await asyncio.to_thread(cli, "cancel", "over", "--redis-url", url)
        assert (over.returncode, over.stdout.strip()) == (
            0, "over had already ended (completed): nothing to cancel"), over.stderr
        cancelled = await asyncio.to_thread(cli, "cancel", "running", "--redis-url", url,
                                            "--reason", "user pressed stop")
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.startswith("cancelled running"), cancelled.stdout
        assert await harness.client.get(shard.cancel("running")) == b"user pressed stop"
        await harness.stop_worker(running)
        alone = await asyncio.to_thread(cli, "cancel", "alone", "--redis-url", url)
        assert alone.returncode == 1, alone.stderr
        assert "no worker set the cancellation key" in alone.stderr, alone.stderr
    assert acl_log(acl_server) == []

"""deploy/redis/users.acl, loaded into a real redis-server (7.0+): workers
running as the least-privilege ``processor`` user get every scenario right
without a single refused command, and each user is refused what its line
does not grant (commands, keys, and commands a Lua script runs)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
import redis.asyncio
from redis.exceptions import NoPermissionError, ResponseError
from support.acl_users import (
    ADMIN_PASSWORD,
    PASSWORDS,
    redis7_binary,
    rendered_acl,
    shipped_lines,
    url_for,
)
from support.expectations import scenario_lines, scenario_names
from support.live_scenarios import TURN_TIMEOUT, feed_scenario, offline_results_of_lines
from support.records import init_namespace_sync
from support.scrape import scrape, wait_status
from support.serve_harness import bearer, open_stream, payloads, spawn_serve, text_update
from support.turn_reference import compare_with_offline, text_delta
from support.worker_harness import ROOT, Harness

from processor.client import (
    CancelNotTaken,
    LibraryNotLoaded,
    MergedItem,
    NotInitialised,
    Producer,
    Subscriber,
    TurnEnded,
)
from processor.embedded import (
    EmbeddedRedis,
    free_port,
)
from processor.engine.lifecycle import Limits
from processor.redis_io.connections import connect
from processor.redis_io.options import RedisOptions
from processor.scripts.library import function_name, library_name, library_text
from processor.wire.cancels import MAX_TTL
from processor.wire.ids import TurnKey, shard_of
from processor.wire.keys import Namespace

NAMESPACE = "agent"  # the namespace the shipped ACL file is written for
SCRIPT_REFUSED = r"(?i)script can.t run this command|no permissions|NOPERM"
#: The two producer profiles (docs/security.md): the least-privilege one sends
#: through the inbox, the trusted one XADDs.
PRODUCERS = {"producer": True, "producer-trusted": False}  # user -> Producer(inbox=...)


def acl_log(server: EmbeddedRedis) -> list[dict]:
    with redis.Redis(**server.client_kwargs(), decode_responses=True) as admin:
        return admin.acl_log()


def test_the_shipped_file_has_no_password_and_no_open_default_user() -> None:
    lines = shipped_lines()
    assert set(lines) == {"default", "processor", "producer", "producer-trusted", "keda",
                          "serve"}
    assert lines["default"].split()[2] == "off"
    for line in lines.values():
        tokens = line.split()
        assert not [t for t in tokens if t.startswith((">", "#", "<", "!"))], line
        assert "nopass" not in tokens and "+@all" not in tokens and "allkeys" not in tokens


async def run_every_scenario(harness: Harness) -> None:
    """Every shared scenario through the harness's workers at once (their
    response ids are distinct): the same responses as ``processor merge``.
    Cancels are set once everything before them in the file order was applied."""
    lines = [line for name in scenario_names() for line in scenario_lines(name)]
    offline = offline_results_of_lines(lines)
    await feed_scenario(harness, lines)
    await harness.wait_merged(len(offline))
    await harness.wait_drained()
    outputs = await harness.outputs()
    # Byte-identical responses and equal statuses for every turn. The scenarios'
    # own expectations are test_worker_scenarios' job: seed_cancel_midway's
    # "dropped_min" depends on whether the cancel sweep or the late entries come
    # first (a late entry after the terminal event goes to the DLQ instead), which
    # under load fails there too; it says nothing about permissions.
    compare_with_offline(outputs, offline, "every scenario as the processor user")


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


def _refused(client: redis.Redis, *command: str) -> None:
    with pytest.raises(NoPermissionError):
        client.execute_command(*command)


def test_processor_user_is_refused_other_commands_and_keys(acl_server: EmbeddedRedis) -> None:
    with redis.Redis.from_url(url_for(acl_server, "processor")) as worker:
        assert worker.ping()
        for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("KEYS", "*"),
                        ("SCAN", "0"), ("BGSAVE",), ("SHUTDOWN",), ("MONITOR",),
                        ("ACL", "LIST"), ("CLIENT", "KILL", "ID", "1"), ("SCRIPT", "FLUSH"),
                        ("EVAL", "return 1", "0"), ("PUBLISH", "c", "m"),
                        ("SET", "{agent:0}:turn:x", "v")):
            _refused(worker, *command)
        # Keys outside the namespace's shard keys, and the producers' idempotency keys.
        _refused(worker, "XADD", "{other:0}:updates", "*", "f", "v")
        _refused(worker, "HSET", "agent:0:turn:x", "f", "v")
        _refused(worker, "HSET", "{agent:0}:idem:x", "f", "v")
        _refused(worker, "DEL", "somebody-elses-key")
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
            _refused(user, *command)


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
        _refused(keda, "XADD", stream, "*", "f", "v")
        _refused(keda, "XREADGROUP", "GROUP", "processor", "k", "STREAMS", stream, ">")
        _refused(keda, "XRANGE", stream, "-", "+")
        _refused(keda, "XINFO", "GROUPS", "{other:0}:updates")
        _refused(keda, "GET", "{agent:0}:cancel:r1")


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
        _refused(producer, "SET", shard.cancel("r1"), "stop", "EX", "60")  # cancel_turn's
        assert producer.xrange(shard.merged) == []
        producer.hgetall(Namespace(NAMESPACE).meta)  # the namespace's record: read-only
        _refused(producer, "HSET", Namespace(NAMESPACE).meta, "shards", "9")
        _refused(producer, "XADD", shard.merged, "*", "f", "v")  # outputs are read-only
        _refused(producer, "HGETALL", shard.turn("r1"))
        _refused(producer, "XREADGROUP", "GROUP", "processor", "p", "STREAMS", shard.updates, ">")
        _refused(producer, "XACK", shard.updates, "processor", "0-1")
        _refused(producer, "XDEL", shard.updates, "0-1")
        _refused(producer, "FLUSHALL")


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
        over = await asyncio.to_thread(_cli, "cancel", "over", "--redis-url", url)
        assert (over.returncode, over.stdout.strip()) == (
            0, "over had already ended (completed): nothing to cancel"), over.stderr
        cancelled = await asyncio.to_thread(_cli, "cancel", "running", "--redis-url", url,
                                            "--reason", "user pressed stop")
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.startswith("cancelled running"), cancelled.stdout
        assert await harness.client.get(shard.cancel("running")) == b"user pressed stop"
        await harness.stop_worker(running)
        alone = await asyncio.to_thread(_cli, "cancel", "alone", "--redis-url", url)
        assert alone.returncode == 1, alone.stderr
        assert "no worker set the cancellation key" in alone.stderr, alone.stderr
    assert acl_log(acl_server) == []


# ------------------------------------------------------------ cancel keys (docs/security.md)

#: The users that cancel but may not SET cancel keys: they FCALL cancel_turn,
#: which publishes their request, and a worker sets the key.
CANCELLERS = ("serve", "producer", "producer-trusted")


@pytest.mark.parametrize("user", CANCELLERS)
def test_cancel_keys_are_no_weapon_for_serve_or_the_producers(
    acl_server: EmbeddedRedis, user: str
) -> None:
    """Before, these users could SET any cancel key to any size without a TTL
    (3 x 100 MB took Redis to 450 MB) and erase another client's cancel with
    SET ... PX 1 before a worker saw it. Now every command that writes a
    cancel key is refused them, directly or from the function (which runs
    with their rights), and the function keeps its bounds: the other
    client's cancel keeps its reason and its TTL."""
    shard = Namespace(NAMESPACE).shard(0)
    victim, fresh, channel = shard.cancel("victim"), shard.cancel("fresh"), Namespace(
        NAMESPACE).cancels
    big = b"x" * (8 << 20)
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        admin.function_load(library_text(), replace=True)
        admin.set(victim, "first", ex=600)
    with redis.Redis.from_url(url_for(acl_server, user)) as client:
        for command in (
                ("SET", fresh, big), ("SET", fresh, "x"), ("SET", victim, "x", "PX", "1"),
                ("SET", victim, "x", "KEEPTTL"), ("SET", victim, "x", "NX", "EX", "60"),
                ("SETEX", victim, "1", "x"), ("PSETEX", victim, "1", "x"), ("SETNX", fresh, big),
                ("MSET", fresh, "x"), ("MSETNX", fresh, "x"), ("GETSET", victim, "x"),
                ("GETDEL", victim), ("GETEX", victim, "PX", "1"), ("GETEX", victim, "PERSIST"),
                ("APPEND", victim, big), ("SETRANGE", fresh, "100000000", "x"),
                ("SETBIT", fresh, "100000000", "1"), ("INCR", fresh), ("DEL", victim),
                ("UNLINK", victim), ("EXPIRE", victim, "1"), ("PEXPIRE", victim, "1"),
                ("EXPIREAT", victim, "1"), ("PERSIST", victim), ("RENAME", victim, fresh),
                ("COPY", victim, fresh), ("RESTORE", fresh, "0", "x"), ("HSET", fresh, "f", big),
                ("RPUSH", fresh, big), ("XADD", fresh, "*", "f", "v"), ("SADD", fresh, "x"),
                ("PUBLISH", "another-channel", "x"), ("SUBSCRIBE", channel),
                ("EVAL", "return redis.call('SET', KEYS[1], 'x')", "1", fresh)):
            _refused(client, *command)
        function = function_name("cancel_turn")
        for reason, ttl in (("x" * (1 << 20), 60), ("", 60), ("stop", 0), ("stop", MAX_TTL + 1)):
            with pytest.raises(ResponseError, match="CANCELARG"):
                client.fcall(function, 1, fresh, reason, ttl, channel)
        # Nor is the key's name a way to store more: the id is 1 to 512 characters.
        for too_long in (shard.cancel("é" * 513), shard.cancel("")):
            with pytest.raises(ResponseError, match=r"CANCELARG .*id is 1 to 512 characters"):
                client.fcall(function, 1, too_long, "stop", 60, channel)
        # A huge one is refused by its length in bytes, never copied or counted
        # character by character (20 MB took Redis 0.7 s; 512 MB, 19 s).
        with pytest.raises(ResponseError, match=r"characters, not 20971520 bytes"):
            client.fcall(function, 1, shard.cancel("x" * (20 << 20)), "stop", 60, channel)
        assert client.fcall(function, 1, shard.cancel("é" * 512), "stop", 60, channel)[0] \
            == b"asked"
        # The function cannot shorten a cancel either: it is kept as it is.
        kept, left = client.fcall(function, 1, victim, "second", 1, channel)
        assert kept == b"kept" and left > 590_000
        # A new cancel is asked of the workers (none runs here): nothing is written.
        asked, _reached = client.fcall(function, 1, fresh, "stop", 60, channel)
        assert asked == b"asked"
        # Without a channel (a worker carrying out a request), it may not ask either.
        with pytest.raises(ResponseError, match="CANCELNOPERM"):
            client.fcall(function, 1, fresh, "stop", 60, "")
        client.publish(channel, big)  # the request channel: Pub/Sub stores nothing
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        assert admin.get(victim) == b"first" and admin.pttl(victim) > 590_000
        assert not admin.exists(fresh)
        assert admin.dbsize() == 1


@pytest.mark.parametrize("user", ["serve", "producer"])
async def test_a_cancel_they_ask_for_is_set_by_a_worker_bounded_and_never_shortened(
    acl_server: EmbeddedRedis, tmp_path: Path, user: str
) -> None:
    """Producer.cancel as that user: the worker sets the key with the reason
    and TTL asked; a second cancel keeps the first reason and gets the longer
    TTL; a shorter one changes nothing; the reason reaches the terminal event
    and meta. What a hostile client publishes on the channel (not JSON,
    another namespace's key, a reason out of bounds) is refused and the
    worker goes on. No command of the user's or the worker's was refused."""
    shard, channel = Namespace(NAMESPACE).shard(0), Namespace(NAMESPACE).cancels
    key = shard.cancel("t")
    client = redis.asyncio.Redis.from_url(url_for(acl_server, user))
    try:
        async with Harness(acl_server.url, NAMESPACE, log_dir=tmp_path,
                           limits=Limits(turn_timeout=300)) as harness:
            harness.url = url_for(acl_server, "processor")
            running = await harness.start_worker()
            refused = running.worker.metrics.cancel_requests.labels("refused")
            await harness.add([text_delta("t", "half an answer")])
            await harness.wait_applied()
            producer = Producer(client, NAMESPACE)
            assert await producer.cancel("t", reason="user pressed stop", ttl=600) == "asked"
            assert await harness.client.get(key) == b"user pressed stop"
            assert 590_000 < await harness.client.pttl(key) <= 600_000
            assert await producer.cancel("t", reason="again", ttl=MAX_TTL) == "asked"
            await harness.wait_for(lambda: _pttl_above(harness, key, 600_000), 10,
                                   "the worker lengthens the TTL")
            assert await producer.cancel("t", reason="short", ttl=1) == "kept"
            assert await harness.client.get(key) == b"user pressed stop"
            long_key = shard.cancel("x" * 513)  # (a PUBLISH skips the function's bounds)
            for junk in (b"\xff not json", json.dumps(["{other:0}:cancel:t", "x", 60]),
                         json.dumps([key, "x" * 2000, 60]), json.dumps([key, "x", 10**9]),
                         json.dumps([long_key, "x", 60]),
                         json.dumps([shard.cancel("y" * (20 << 20)), "x", 60])):
                await client.publish(channel, junk)
            await harness.wait_for(lambda: refused._value.get() >= 6, 10, "junk refused")
            assert not await harness.client.exists(long_key)
            await harness.wait_merged(1)
            outputs = await harness.outputs()
    finally:
        await client.aclose()
    final = outputs.turns[TurnKey("t")].events[-1]
    assert (final["status"], final["cancel_reason"]) == ("cancelled", "user pressed stop")
    [merged] = outputs.turns[TurnKey("t")].merged
    assert json.loads(merged["meta"])["cancel_reason"] == "user pressed stop"
    assert acl_log(acl_server) == []


async def test_cancels_are_taken_while_junk_floods_the_request_channel(
    acl_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """A holder of the producer password publishes 40 MB messages on the
    cancel channel: past Redis's Pub/Sub output limit (32 MB), each one
    disconnects every worker's subscription, and a request published in the
    gap reaches no worker. Workers subscribe again at once and the client
    asks again while no worker has set the key, so every cancel asked
    during the flood is still taken (before: 1 of 8 got CancelNotTaken)."""
    shard, channel = Namespace(NAMESPACE).shard(0), Namespace(NAMESPACE).cancels
    junk = b"j" * (40 << 20)
    serve = redis.asyncio.Redis.from_url(url_for(acl_server, "serve"))
    hostile = redis.asyncio.Redis.from_url(url_for(acl_server, "producer"))
    flooding, taken = True, []

    async def flood() -> None:
        while flooding:
            await hostile.publish(channel, junk)

    try:
        async with Harness(acl_server.url, NAMESPACE, log_dir=tmp_path) as harness:
            harness.url = url_for(acl_server, "processor")
            await harness.start_worker()
            producer = Producer(serve, NAMESPACE)
            assert await producer.cancel("warm", reason="stop") == "asked"
            flooder = asyncio.create_task(flood())
            try:
                for i in range(8):
                    taken.append(await producer.cancel(f"t{i}", reason="stop"))
            finally:
                flooding = False
                await flooder
            for i in range(8):
                assert await harness.client.get(shard.cancel(f"t{i}")) == b"stop"
    finally:
        await serve.aclose()
        await hostile.aclose()
    assert taken == ["asked"] * 8


async def test_serve_answers_503_when_no_worker_can_take_a_cancel(
    acl_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """``POST .../cancel`` as the serve user: 503 ``cancel_not_taken`` saying
    what to do, before any worker loaded the library and then with no worker
    running; nothing written."""
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        init_namespace_sync(admin, NAMESPACE)
    serve = spawn_serve(url_for(acl_server, "serve"), NAMESPACE, tmp_path)
    try:
        await serve.wait_serving()
        async with aiohttp.ClientSession(serve.url) as session:
            async with session.post("/v1/turns/s1/cancel", headers=bearer("s1")) as response:
                assert response.status == 503
                body = await response.json()
                assert body["error"] == "cancel_not_taken" and "processor init" in body["detail"]
            with redis.Redis(**acl_server.client_kwargs()) as admin:
                admin.function_load(library_text(), replace=True)
            async with session.post("/v1/turns/s1/cancel", headers=bearer("s1")) as response:
                assert response.status == 503
                assert "no worker set the cancellation key" in (await response.json())["detail"]
        assert serve.terminate() == 0
    finally:
        serve.kill()
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        assert not admin.exists(Namespace(NAMESPACE).shard(0).cancel("s1"))


async def _pttl_above(harness: Harness, key: str, ms: int) -> bool:
    return int(await harness.client.pttl(key)) > ms


async def test_without_the_library_or_a_worker_a_cancel_says_what_to_do(
    acl_server: EmbeddedRedis
) -> None:
    """As the serve user (which may load no Lua): before any worker or
    `processor init` loaded the library, LibraryNotLoaded says to; with the
    library and no worker running, CancelNotTaken says no worker set the key.
    Nothing is written either way."""
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        init_namespace_sync(admin, NAMESPACE)
    client = redis.asyncio.Redis.from_url(url_for(acl_server, "serve"))
    try:
        producer = Producer(client, NAMESPACE)
        with pytest.raises(LibraryNotLoaded, match=r"run `processor init` or start a worker"):
            await producer.cancel("r")
        with redis.Redis(**acl_server.client_kwargs()) as admin:
            admin.function_load(library_text(), replace=True)
        with pytest.raises(CancelNotTaken, match=r"no worker set the cancellation key .* 0.3 s"):
            await producer.cancel("r", wait=0.3)
    finally:
        await client.aclose()
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        assert not admin.exists(Namespace(NAMESPACE).shard(0).cancel("r"))


# Busy for a few seconds (bounded, so that the test ends even where it is allowed;
# no command, so that it needs no right but running Lua).
BUSY = "local n = 0 for i = 1, 100000000 do n = n + 1 end return n"
BUSY_LIBRARY = f"#!lua name=busy\nredis.register_function('busy', function() {BUSY} end)"


def _busy_routes() -> dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]]:
    """Ways to run Lua of one's own: (load command, run command or None when the
    load already runs it). The EVALSHA route runs the SHA its SCRIPT LOAD returns."""
    return {
        "SCRIPT LOAD + EVALSHA": (("SCRIPT", "LOAD", BUSY), ("EVALSHA", "<sha>", "0")),
        "EVAL": (("EVAL", BUSY, "0"), None),
        "FUNCTION LOAD + FCALL": (("FUNCTION", "LOAD", BUSY_LIBRARY), ("FCALL", "busy", "0")),
    }


def _busy_replies(server: EmbeddedRedis, user: str) -> dict[str, str]:
    """Each route tried as ``user``, while the administrator pings every 50 ms:
    'refused' when the load was refused, else what the pings met ('BUSY' when
    the user's Lua froze the server for everyone)."""
    import threading
    import time

    out = {}
    with redis.Redis(**server.client_kwargs()) as admin:
        admin.config_set("busy-reply-threshold", 100)  # BUSY after 100 ms (7.0's name)
        for name, (load, run) in _busy_routes().items():
            with redis.Redis.from_url(url_for(server, user)) as client:
                try:
                    reply = client.execute_command(*load)
                except NoPermissionError:
                    out[name] = "refused"
                    continue
                busy: list[str] = []

                def ping_meanwhile(done: threading.Event, found: list[str] = busy) -> None:
                    while not done.is_set():
                        try:
                            admin.ping()
                        except ResponseError as exc:
                            found.append(str(exc).split()[0])
                        time.sleep(0.05)

                done = threading.Event()
                pinger = threading.Thread(target=ping_meanwhile, args=(done,))
                pinger.start()
                try:
                    if run is not None:
                        client.execute_command(*[reply if a == "<sha>" else a for a in run])
                finally:
                    done.set()
                    pinger.join()
                out[name] = "BUSY" if "BUSY" in busy else "ran"
        admin.function_flush()
        admin.script_flush()
    return out


def test_producer_user_runs_no_lua_of_its_own(acl_server: EmbeddedRedis) -> None:
    """Issue 25 item 2: a producer that may load and run Lua froze Redis for
    every client (BUSY while it ran; SCRIPT KILL cannot stop a script that
    wrote). The shipped producer may only FCALL the functions the workers
    load: SCRIPT LOAD, EVAL, EVALSHA and FUNCTION LOAD are refused."""
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        sha = admin.script_load("return 1")
    for user in PRODUCERS:
        assert _busy_replies(acl_server, user) == dict.fromkeys(_busy_routes(), "refused")
        with redis.Redis.from_url(url_for(acl_server, user)) as producer:
            for command in (("EVALSHA", sha, "0"), ("EVAL_RO", "return 1", "0"),
                            ("EVALSHA_RO", sha, "0"), ("SCRIPT", "FLUSH"), ("SCRIPT", "KILL"),
                            ("FUNCTION", "FLUSH"), ("FUNCTION", "DELETE", "busy"),
                            ("FUNCTION", "RESTORE", "x"), ("FUNCTION", "KILL")):
                _refused(producer, *command)
    # The keda user runs no Lua either.
    assert _busy_replies(acl_server, "keda") == dict.fromkeys(_busy_routes(), "refused")


def test_a_function_runs_with_its_callers_rights(acl_server: EmbeddedRedis) -> None:
    """Why a producer that may call send_update must itself have XADD, and so
    can choose ids and trim (docs/security.md), hence the inbox: Redis runs a
    function's commands as the user who calls it, so a producer without XADD
    cannot add an entry through the send function either."""
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        admin.function_load(library_text(), replace=True)
        admin.acl_setuser("fcall-only", enabled=True, passwords=["+pw"], keys=["{agent:*}:*"],
                          commands=["-@all", "+fcall"])
    shard = Namespace(NAMESPACE).shard(0)
    args = [shard.updates, shard.idem("k"), 60, "response_id", "r", "kind", "end"]
    url = f"redis://fcall-only:pw@{acl_server.host}:{acl_server.port}"
    with redis.Redis.from_url(url) as client, pytest.raises(ResponseError, match=SCRIPT_REFUSED):
        client.fcall(function_name("send_update"), 2, *args)


@pytest.mark.parametrize("user", PRODUCERS)
def test_producer_user_cannot_overwrite_or_retype_other_keys(
    acl_server: EmbeddedRedis, user: str
) -> None:
    """Each of the producer's write commands is granted on its own keys only (ACL
    selectors): SET, which a key pattern alone allowed on the updates stream,
    would have replaced the stream (every undelivered entry and the group) with
    a string; XADD on a cancel key would have made it a stream."""
    shard = Namespace(NAMESPACE).shard(0)
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        admin.xgroup_create(shard.updates, "processor", id="0", mkstream=True)
    with redis.Redis.from_url(url_for(acl_server, user)) as producer:
        _refused(producer, "SET", shard.updates, "gone")
        _refused(producer, "XADD", shard.cancel("r1"), "*", "f", "v")
        _refused(producer, "XADD", shard.idem("k"), "*", "f", "v")
        _refused(producer, "GET", shard.updates)
        _refused(producer, "HSET", shard.done("1:r1:"), "status", "completed")  # read only
        _refused(producer, "SET", shard.done("1:r1:"), "x")
        # A turn's keys end with its ids, which a producer chooses (ids may
        # hold '}'): with an attempt id ending "}:inbox" or holding
        # "}:cancel:" or "}:idem:", the patterns {agent:*}:inbox,
        # {agent:*}:cancel:*, ... named that turn's state and done marker,
        # which a SET or RPUSH would retype (the worker's scripts then fail
        # on the turn). The shard part of each pattern is digits only.
        for attempt in ("x}:inbox", "x}:inbox:bell", "x}:cancel:y", "x}:idem:y", "x}:updates",
                        "x:cancel:y"):
            tk = TurnKey("r", attempt).encode()
            for key in (shard.turn(tk), shard.recs(tk), shard.done(tk)):
                _refused(producer, "SET", key, "x")
                _refused(producer, "RPUSH", key, "x")
                _refused(producer, "XADD", key, "*", "f", "v")
        assert producer.set(shard.idem("k"), "1-1")
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        assert admin.type(shard.updates) == b"stream"
        assert admin.keys(f"{shard.tag}:turn:*") == admin.keys(f"{shard.tag}:done:*") == []


MAX_ID = "18446744073709551615-18446744073709551615"


def test_the_least_privilege_producer_cannot_write_the_stream(acl_server: EmbeddedRedis) -> None:
    """Issue 25 item 3: the `producer` user sends through the inbox and has no
    right on the updates stream: the XADD at the last possible id that
    exhausts the stream, an XADD that trims it (MAXLEN 0), XTRIM, XDEL, DEL,
    SET and the XADD-ing function are refused, and so is taking entries out of
    the inbox or jumping its queue (LPOP, LPUSH, ...). The stream keeps its
    entries and its ids; the inbox keeps what it pushed."""
    shard = Namespace(NAMESPACE).shard(0)
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        admin.function_load(library_text(), replace=True)
        admin.xgroup_create(shard.updates, "processor", id="0", mkstream=True)
        victim = admin.xadd(shard.updates, {"response_id": "victim", "kind": "end"})
    stream = shard.updates
    with redis.Redis.from_url(url_for(acl_server, "producer")) as producer:
        for command in (
            ("XADD", stream, MAX_ID, "response_id", "evil", "kind", "end"),
            ("XADD", stream, "MAXLEN", "0", "*", "response_id", "evil", "kind", "end"),
            ("XADD", stream, "MINID", "+", "*", "response_id", "evil", "kind", "end"),
            ("XADD", stream, "*", "response_id", "r", "kind", "end"),
            ("XTRIM", stream, "MAXLEN", "0"), ("XDEL", stream, victim), ("DEL", stream),
            ("SET", stream, "gone"), ("XSETID", stream, MAX_ID), ("UNLINK", stream),
            ("RENAME", stream, shard.inbox), ("XGROUP", "DESTROY", stream, "processor"),
        ):
            _refused(producer, *command)
        with pytest.raises(ResponseError, match=SCRIPT_REFUSED):  # runs as its caller
            producer.fcall(function_name("send_update"), 3, stream, shard.idem("k"),
                           shard.done("1:r:"), 60, "response_id", "r", "kind", "end")
        assert producer.rpush(shard.inbox, "mine") == 1
        for command in (("LPOP", shard.inbox), ("RPOP", shard.inbox), ("DEL", shard.inbox),
                        ("LTRIM", shard.inbox, "1", "0"), ("LSET", shard.inbox, "0", "x"),
                        ("LREM", shard.inbox, "0", "mine"), ("LPUSH", shard.inbox, "first"),
                        ("LRANGE", shard.inbox, "0", "-1"), ("DEL", shard.inbox_bell),
                        ("BLPOP", shard.inbox_bell, "0.01")):
            _refused(producer, *command)
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        assert admin.xrange(stream) == [(victim, {b"response_id": b"victim", b"kind": b"end"})]
        assert admin.xinfo_stream(stream)["last-generated-id"] == victim
        assert admin.lrange(shard.inbox, 0, -1) == [b"mine"]


@pytest.mark.parametrize("user", PRODUCERS)
async def test_producer_user_sends_cancels_and_reads_through_the_client(
    acl_server: EmbeddedRedis, tmp_path: Path, user: str
) -> None:
    """Producer.send/end/error/cancel/cancelled/watch and Subscriber (from the
    start and from "$") work as each shipped producer user (`producer` through
    the inbox, `producer-trusted` with XADD), whose only Lua is FCALL of the
    library a worker or `processor init` loaded. Before that, a send fails
    with one clear error (the producer may not load it)."""
    shards, update = 2, {"contents": [{"type": "text", "text": "hi"}]}
    client = redis.asyncio.Redis.from_url(url_for(acl_server, user))
    try:
        producer = Producer(client, namespace=NAMESPACE, shards=shards, inbox=PRODUCERS[user])
        with pytest.raises(NotInitialised, match=r"run `processor init` or start a worker"):
            await producer.send("r1", update)  # no namespace's record yet
        with redis.Redis(**acl_server.client_kwargs()) as admin:
            init_namespace_sync(admin, NAMESPACE, shards)  # the record, no library yet
        with pytest.raises(LibraryNotLoaded, match=r"run `processor init` or start a worker"):
            await producer.send("r1", update)
        init = _cli("init", "--redis-url", url_for(acl_server, "processor"),
                    "--shards", str(shards))
        assert init.returncode == 0, init.stderr
        assert library_name() in init.stdout
        newest = Subscriber(client, NAMESPACE, shards, ("merged",), start="$")
        assert await newest.read(1) == []  # XREVRANGE: where "$" is
        first = await producer.send("r1", update, idempotency_key="r1:0")
        assert await producer.send("r1", update, idempotency_key="r1:0") == first
        await producer.end("r1")
        await producer.error("r2", "boom", "E1")

        async def endless() -> AsyncIterator[dict[str, Any]]:
            while True:
                yield update
                await asyncio.sleep(0.02)

        async with Harness(acl_server.url, NAMESPACE, shards, log_dir=tmp_path) as harness:
            harness.url = url_for(acl_server, "processor")
            await harness.start_workers(1)  # (it also sets the cancel this user asks for)
            watch = producer.watch("r3", endless(), poll_interval=0.05)
            await producer.stream("r3", _cancel_after(producer, "r3", watch, 3))
            assert watch.cancelled and await producer.cancelled("r3")
            subscriber = Subscriber(client, NAMESPACE, shards)
            statuses = {}
            for rid in ("r1", "r2", "r3"):
                statuses[rid] = (await subscriber.wait_for(rid, timeout=30)).status
            seen = [item for item in await newest.read(2000) if isinstance(item, MergedItem)]
        assert statuses == {"r1": "completed", "r2": "error", "r3": "cancelled"}
        with pytest.raises(TurnEnded):  # the function reads the done marker as this user
            await producer.send("r1", update)
        await producer.send("r3", update)  # a cancelled turn takes (and drops) entries
        assert {item.response_id for item in seen} >= {"r1", "r2"}
    finally:
        await client.aclose()
    # Refused once: the producer's attempt to load the missing library.
    assert [(e["username"], e["object"]) for e in acl_log(acl_server)] == [
        (user, "function|load")]


def test_what_the_trusted_producer_can_still_do_with_xadd(acl_server: EmbeddedRedis) -> None:
    """docs/security.md's limits of the ACL: XADD, which send_update needs,
    takes an id of the caller's choosing and trimming options, which no ACL
    rule can refuse. Here the trusted producer trims away an entry a worker
    had not read yet (the least-privilege one cannot:
    test_the_least_privilege_producer_cannot_write_the_stream)."""
    shard = Namespace(NAMESPACE).shard(0)
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        admin.xgroup_create(shard.updates, "processor", id="0", mkstream=True)
        admin.xadd(shard.updates, {"response_id": "victim", "kind": "end"})
    with redis.Redis.from_url(url_for(acl_server, "producer-trusted")) as producer:
        assert producer.xadd(shard.updates, {"response_id": "r", "kind": "end"},
                             id="99999999999999-0") == b"99999999999999-0"
        producer.xadd(shard.updates, {"response_id": "r", "kind": "end"}, maxlen=1,
                      approximate=False)
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        assert [f[b"response_id"] for _, f in admin.xrange(shard.updates)] == [b"r"]


async def test_a_producer_poisons_a_shard_and_the_operator_repairs_it(
    acl_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """What the trusted producer user can still do (docs/security.md): XADD
    with an id of its choosing. At the last possible id every later send of the shard
    fails; the worker (as processor) reports it on /readyz, and, the worker
    stopped, `processor repair-stream` as an administrator brings the shard
    back: the same producer's sends work and are merged."""
    shards, update = 2, {"contents": [{"type": "text", "text": "hi"}]}
    stream = Namespace(NAMESPACE, shards).shard(1).updates
    rid = next(r for r in (f"t{i}" for i in range(100)) if shard_of(r, shards) == 1)
    client = redis.asyncio.Redis.from_url(url_for(acl_server, "producer-trusted"))
    try:
        producer = Producer(client, namespace=NAMESPACE, shards=shards)
        async with Harness(acl_server.url, NAMESPACE, shards, log_dir=tmp_path) as harness:
            harness.url = url_for(acl_server, "processor")
            port = free_port()
            worker = harness.spawn(None, "--log-level", "info", metrics_port=port,
                                   metrics_interval=0.2)
            await harness.wait_started([worker])
            await client.xadd(stream, {"response_id": "evil", "kind": "end"},
                              id="18446744073709551615-18446744073709551615")
            with pytest.raises(ResponseError, match="exhausted the last possible ID"):
                await producer.send(rid, update)
            body = await wait_status(port, "/readyz", 503)
            assert "ids exhausted" in body
            assert harness.terminate(worker) == 0  # the repair waits for the workers to stop
            repair = _cli("repair-stream", "--redis-url", acl_server.url, "--namespace",
                          NAMESPACE, "--shards", str(shards))
            assert repair.returncode == 0, repair.stderr
            worker = harness.spawn(None, metrics_port=port, metrics_interval=0.2)
            await wait_status(port, "/readyz", 200)
            await producer.send(rid, update)
            await producer.end(rid)
            assert (await Subscriber(client, NAMESPACE, shards).wait_for(rid, 30)).status == (
                "completed")
            assert harness.terminate(worker) == 0
    finally:
        await client.aclose()
    assert acl_log(acl_server) == []


async def _cancel_after(
    producer: Producer, rid: str, updates: AsyncIterator[dict[str, Any]], n: int
) -> AsyncIterator[dict[str, Any]]:
    """``updates``, with the turn cancelled after ``n`` of them."""
    sent = 0
    async for update in updates:
        yield update
        sent += 1
        if sent == n:
            await producer.cancel(rid, reason="user")


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "processor.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, check=False)


async def test_init_worker_producer_and_keda_each_as_their_user(
    acl_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """The compose/Kubernetes setup on one Redis with the ACL: `processor init`
    and `processor run` as processor, a trusted producer as producer-trusted,
    the demo producer (`--inbox`) as producer, KEDA's reads as keda; KEDA
    sees the backlog, then none once the workers caught up. The worker serves
    its metrics port: readiness and the sampled gauges work with the user's
    rights too."""
    shards, worker_url = 2, url_for(acl_server, "processor")
    ns = Namespace(NAMESPACE, shards)
    init = _cli("init", "--redis-url", worker_url, "--shards", str(shards))
    assert init.returncode == 0, init.stderr
    producer_client = redis.asyncio.Redis.from_url(url_for(acl_server, "producer-trusted"))
    try:
        producer = Producer(producer_client, namespace=NAMESPACE, shards=shards)
        for i in range(6):
            await producer.send(f"turn-{i}", {"contents": [{"type": "text", "text": "hi"}]})
            await producer.end(f"turn-{i}")
    finally:
        await producer_client.aclose()
    keda = redis.Redis.from_url(url_for(acl_server, "keda"), decode_responses=True)
    lag = sum(keda.xinfo_groups(s.updates)[0]["lag"] for s in ns.all())
    assert lag == 12  # every entry waits: workers are not running yet

    async with Harness(acl_server.url, NAMESPACE, shards, log_dir=tmp_path) as harness:
        harness.url = worker_url
        port = free_port()
        worker = harness.spawn(None, "--log-level", "info", metrics_port=port,
                               metrics_interval=0.2)
        await harness.wait_started([worker])
        await harness.wait_merged(6)
        await harness.wait_drained()
        await wait_status(port, "/readyz", 200)
        await asyncio.sleep(0.5)  # a sample after the drain
        metrics = await scrape(port)
        assert metrics.by_label("processor_group_lag", "shard") == {"0": 0, "1": 0}
        assert metrics.total("processor_group_pending") == 0
        # The worker acks and deletes what it applied: Redis still knows the lag.
        for shard in ns.all():
            (group,) = keda.xinfo_groups(shard.updates)
            assert group["lag"] == 0 and group["pending"] == 0
            assert keda.xpending(shard.updates, "processor")["pending"] == 0
        demo = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(ROOT / "deploy" / "demo_producer.py"), "--redis-url",
             url_for(acl_server, "producer"), "--shards", str(shards), "--turns", "2",
             "--interval", "0", "--timeout", "30", "--inbox"],
            capture_output=True, text=True, timeout=90, cwd=ROOT, check=False,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert demo.stdout.count(": completed: ") == 2
        assert harness.terminate(worker) == 0, worker.log()[-2000:]
        log = worker.log()
    keda.close()
    assert PASSWORDS["processor"] not in log
    denied = acl_log(acl_server)
    assert denied == [], json.dumps(denied, default=str)[:2000]


async def test_scenarios_on_a_cluster_as_the_processor_user(make_redis_cluster, tmp_path) -> None:
    """On a 3-master Redis Cluster whose nodes load the ACL file, workers started
    as `processor run` with the processor user's URL (cluster client: CLUSTER
    SLOTS, COMMAND, ...) merge every scenario, carry out the producer users'
    cancels, and no node refused anything."""
    path = tmp_path / "users.acl"
    path.write_text(rendered_acl())
    cluster = make_redis_cluster(3, binary=redis7_binary(), use_redis_cli=False,
                                 password=ADMIN_PASSWORD, args=["--aclfile", str(path)])
    worker_url = url_for(cluster.nodes[1], "processor")  # any node works
    async with Harness(cluster.url, NAMESPACE, shards=6, cluster=True,
                       log_dir=tmp_path) as harness:
        harness.url = worker_url
        # Held turns spill within 1 s (as in the other scenario runs), well
        # inside the 3 s turn timeout: waiting for the entries before a cancel
        # to be applied must not outlast the cancelled turn's own timeout.
        procs = [harness.spawn(turn_timeout=TURN_TIMEOUT, hold_ms=1000, log_level="info")
                 for _ in range(2)]
        await harness.wait_started(procs, timeout=60)
        await run_every_scenario(harness)
        # Each producer user's client works on the cluster too (Producer and its
        # function): the least-privilege one's turns go through the inboxes,
        # which the workers admit (BLPOP, admit_inbox) on every shard's node.
        for user, inbox in PRODUCERS.items():
            client = await connect(RedisOptions(url_for(cluster.nodes[2], user)))
            try:
                producer = Producer(client, namespace=NAMESPACE, shards=6, inbox=inbox)
                rids = [f"{user}-{i}" for i in range(12)]
                for rid in rids:
                    await producer.send(rid, {"contents": [{"type": "text", "text": "x"}]})
                    await producer.end(rid)
                subscriber = Subscriber(client, NAMESPACE, 6)
                for rid in rids:
                    assert (await subscriber.wait_for(rid, 30)).status == "completed"
                # A cancel: asked of the workers (on whichever node they
                # subscribed), set by one of them on the key's node.
                await producer.send(f"{user}-stop", {"contents": [{"type": "text", "text": "x"}]})
                assert await producer.cancel(f"{user}-stop", reason=f"stop {user}") == "asked"
                item = await subscriber.wait_for(f"{user}-stop", 30)
                assert (item.status, item.meta["cancel_reason"]) == ("cancelled", f"stop {user}")
            finally:
                await client.aclose()
        for sub in list(harness.procs):
            assert harness.terminate(sub) == 0
    for node in cluster.nodes:
        assert acl_log(node) == [], f"node {node.port} refused something"


def test_refused_credentials_or_rights_stop_with_one_line(acl_server: EmbeddedRedis) -> None:
    """A wrong password or a user without the rights is a configuration error:
    one line and a non-zero exit, not an endless "unreachable, retrying"."""
    base = f"{acl_server.host}:{acl_server.port}"
    cases = [
        ("run", f"redis://processor:wrong-pw@{base}", "invalid username-password"),
        ("init", f"redis://processor:wrong-pw@{base}", "invalid username-password"),
        ("run", url_for(acl_server, "keda"), "permission"),  # no INFO for keda
        ("init", url_for(acl_server, "producer"), "refused the namespace's record"),
    ]
    procs = [subprocess.Popen([sys.executable, "-m", "processor.cli", command, "--redis-url", url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for command, url, _ in cases]  # at once: each pays Python's start-up
    for (command, url, why), running in zip(cases, procs, strict=True):
        _, stderr = running.communicate(timeout=30)
        proc = subprocess.CompletedProcess(running.args, running.returncode, "", stderr)
        assert proc.returncode != 0, (command, url)
        # Log lines are JSON; the reason is the one plain line.
        lines = [ln for ln in proc.stderr.splitlines() if ln and not ln.startswith("{")]
        assert len(lines) == 1 and why.lower() in lines[0].lower(), proc.stderr
        assert "wrong-pw" not in proc.stderr
        assert all(pw not in proc.stderr for pw in PASSWORDS.values())


async def test_a_worker_user_without_function_load(acl_server: EmbeddedRedis,
                                                   tmp_path: Path) -> None:
    """A processor user from before the function library (no FUNCTION LOAD):
    `processor init` stops with one line naming the library; a worker logs
    it once and keeps merging (producers would fail until it is loaded)."""
    line = shipped_lines()["processor"].replace(" +function|load", "")
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        admin.execute_command("ACL", "SETUSER", "old-worker", *line.split()[2:], ">pw")
    url = f"redis://old-worker:pw@{acl_server.host}:{acl_server.port}"
    init = _cli("init", "--redis-url", url)
    assert init.returncode == 1
    (message,) = init.stderr.strip().splitlines()
    assert message.startswith(f"processor init: redis refused to load the producers' "
                              f"function library {library_name()}: ")
    assert "no permissions" in message
    async with Harness(acl_server.url, NAMESPACE, 1, log_dir=tmp_path) as harness:
        harness.url = url
        worker = harness.spawn(None, "--log-level", "info")
        await harness.wait_started([worker])
        await harness.add([{"response_id": "r", "kind": "end"}])
        await harness.wait_merged(1)
        assert harness.terminate(worker) == 0
        refusals = [json.loads(x) for x in worker.log().splitlines()
                    if "cannot load the producers' function library" in x]
    assert len(refusals) == 1 and refusals[0]["library"] == library_name()


class AdminRedis(EmbeddedRedis):
    """A server whose own pings and clients log in as the ``admin`` user."""

    def client_kwargs(self) -> dict:
        return {**super().client_kwargs(), "username": "admin", "password": ADMIN_PASSWORD}


def test_the_readme_recipe_makes_a_loadable_file(tmp_path: Path) -> None:
    """deploy/README.md's shell recipe (passwords as SHA-256, an admin line) on
    the shipped file gives an ACL file Redis loads as is: each user logs in
    with its password, the default user cannot."""
    readme = (ROOT / "deploy" / "README.md").read_text()
    (recipe,) = [block for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
                 if "users.acl" in block]
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    env = {"PATH": "/usr/bin:/bin", "ADMIN_PASSWORD": ADMIN_PASSWORD,
           **{f"{user.upper().replace('-', '_')}_PASSWORD": pw for user, pw in PASSWORDS.items()}}
    env["WORKER_PASSWORD"] = env.pop("PROCESSOR_PASSWORD")
    subprocess.run(["bash", "-euc", recipe], cwd=tmp_path, env=env, check=True, timeout=30)
    text = (tmp_path / "users.acl").read_text()
    assert all(pw not in text for pw in [ADMIN_PASSWORD, *PASSWORDS.values()])  # hashes only
    with AdminRedis(binary=redis7_binary(), args=["--aclfile", str(tmp_path / "users.acl")]) as srv:
        for user in PASSWORDS:
            with redis.Redis.from_url(url_for(srv, user)) as client:
                assert client.ping()
        with pytest.raises(redis.AuthenticationError), redis.Redis(
                host=srv.host, port=srv.port) as anonymous:
            anonymous.ping()

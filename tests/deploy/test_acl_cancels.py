"""Cancel keys (docs/security.md) with deploy/redis/users.acl on a real
redis-server (7.0+): the users that cancel (``serve`` and the producers)
may write no cancel key, directly or through the ``cancel_turn`` function,
which keeps its bounds; a worker running as ``processor`` sets the key they
ask for, bounded and never shortened, refuses the junk published on the
request channel and takes every cancel while it is flooded; with no library
or no worker, the client and ``processor serve`` say what to do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import redis
import redis.asyncio
from redis.exceptions import ResponseError
from support.acl_users import NAMESPACE, acl_log, refused, url_for
from support.records import init_namespace_sync
from support.serve_harness import bearer, spawn_serve
from support.turn_reference import text_delta
from support.worker_harness import Harness

from processor.client import CancelNotTaken, LibraryNotLoaded, Producer
from processor.embedded import EmbeddedRedis
from processor.engine.lifecycle import Limits
from processor.scripts.library import function_name, library_text
from processor.wire.cancels import MAX_TTL
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace

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
            refused(client, *command)
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
            refusals = running.worker.metrics.cancel_requests.labels("refused")
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
            await harness.wait_for(lambda: refusals._value.get() >= 6, 10, "junk refused")
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
    cancel channel from a process of its own: past Redis's Pub/Sub output
    limit (32 MB), each one disconnects every worker's subscription, and a
    request published in the gap reaches no worker. Workers subscribe again
    at once and the client asks again while no worker has set the key, so
    every cancel asked during the flood is still taken (before: 1 of 8 got
    CancelNotTaken).

    (The flood runs in another process, as an attacker's would: from this
    test's event loop, each 40 MB publish blocked the loop the worker and
    the producer share while it was packed, so they answered in step with
    the flood, and a slow machine could starve a cancel of its 5 s.)"""
    shard, channel = Namespace(NAMESPACE).shard(0), Namespace(NAMESPACE).cancels
    serve = redis.asyncio.Redis.from_url(url_for(acl_server, "serve"))
    taken = []
    try:
        async with Harness(acl_server.url, NAMESPACE, log_dir=tmp_path) as harness:
            harness.url = url_for(acl_server, "processor")
            await harness.start_worker()
            producer = Producer(serve, NAMESPACE)
            assert await producer.cancel("warm", reason="stop") == "asked"
            async with flooding(url_for(acl_server, "producer"), channel, 40 << 20) as reached:
                for i in range(8):
                    taken.append(await producer.cancel(f"t{i}", reason="stop"))
            for i in range(8):
                assert await harness.client.get(shard.cancel(f"t{i}")) == b"stop"
    finally:
        await serve.aclose()
    assert taken == ["asked"] * 8
    assert sum(reached) >= 1  # (the flood did reach the worker, and so dropped it)


#: The flooding process: PUBLISH argv[3] bytes on channel argv[2] as argv[1]'s
#: user until killed, printing how many subscribers each message reached.
FLOOD = """
import sys, redis
client, junk = redis.Redis.from_url(sys.argv[1]), b"j" * int(sys.argv[3])
while True:
    print(client.publish(sys.argv[2], junk), flush=True)
"""


@contextlib.asynccontextmanager
async def flooding(url: str, channel: str, size: int) -> AsyncIterator[list[int]]:
    """A process publishing ``size`` bytes on ``channel`` in a loop, from
    its first message until the block ends; yields the list that then holds
    how many subscribers each message reached."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FLOOD, url, channel, str(size), stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    reached = [int(await proc.stdout.readline())]
    try:
        yield reached
    finally:
        proc.kill()
        rest, _ = await proc.communicate()
        reached += [int(line) for line in rest.split()]
    assert proc.returncode == -signal.SIGKILL, "the flood stopped by itself"


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

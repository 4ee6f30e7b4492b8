"""The producer users of deploy/redis/users.acl (docs/security.md's two
profiles: ``producer`` sends through the inbox, ``producer-trusted`` XADDs)
on a real redis-server (7.0+): neither runs Lua of its own (a function runs
with its caller's rights), each writes its own keys only, the
least-privilege one cannot touch the updates stream, both work through the
client; and what the trusted one can still do with XADD, up to poisoning a
shard that the operator then repairs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.exceptions import NoPermissionError, ResponseError
from support.acl_users import (
    NAMESPACE,
    PRODUCERS,
    SCRIPT_REFUSED,
    acl_log,
    cli,
    refused,
    url_for,
)
from support.records import init_namespace_sync
from support.scrape import wait_status
from support.worker_harness import Harness

from processor.client import (
    LibraryNotLoaded,
    MergedItem,
    NotInitialised,
    Producer,
    Subscriber,
    TurnEnded,
)
from processor.embedded import EmbeddedRedis, free_port
from processor.scripts.library import function_name, library_name, library_text
from processor.wire.ids import TurnKey, shard_of
from processor.wire.keys import Namespace

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
                refused(producer, *command)
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
        refused(producer, "SET", shard.updates, "gone")
        refused(producer, "XADD", shard.cancel("r1"), "*", "f", "v")
        refused(producer, "XADD", shard.idem("k"), "*", "f", "v")
        refused(producer, "GET", shard.updates)
        refused(producer, "HSET", shard.done("1:r1:"), "status", "completed")  # read only
        refused(producer, "SET", shard.done("1:r1:"), "x")
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
                refused(producer, "SET", key, "x")
                refused(producer, "RPUSH", key, "x")
                refused(producer, "XADD", key, "*", "f", "v")
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
            refused(producer, *command)
        with pytest.raises(ResponseError, match=SCRIPT_REFUSED):  # runs as its caller
            producer.fcall(function_name("send_update"), 3, stream, shard.idem("k"),
                           shard.done("1:r:"), 60, "response_id", "r", "kind", "end")
        assert producer.rpush(shard.inbox, "mine") == 1
        for command in (("LPOP", shard.inbox), ("RPOP", shard.inbox), ("DEL", shard.inbox),
                        ("LTRIM", shard.inbox, "1", "0"), ("LSET", shard.inbox, "0", "x"),
                        ("LREM", shard.inbox, "0", "mine"), ("LPUSH", shard.inbox, "first"),
                        ("LRANGE", shard.inbox, "0", "-1"), ("DEL", shard.inbox_bell),
                        ("BLPOP", shard.inbox_bell, "0.01")):
            refused(producer, *command)
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
        init = cli("init", "--redis-url", url_for(acl_server, "processor"),
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
            repair = cli("repair-stream", "--redis-url", acl_server.url, "--namespace",
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

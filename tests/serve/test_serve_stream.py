"""``GET /v1/turns/{id}/events`` over real HTTP, against real workers
(``--progress``) and a private Redis: framing and ids, joining a running
or finished turn, resuming (also on another ``processor serve`` process),
the end of the stream, heartbeats and slow clients."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import aiohttp
import msgspec
from support.merging import merge_entries
from support.serve_harness import (
    bearer,
    check_stream,
    chunk_text,
    config,
    merged_text,
    open_stream,
    payloads,
    served,
    spawn_serve,
    start_local,
    text_update,
    token,
    wait_logged,
)
from support.worker_harness import Harness

from processor.client import Producer, Subscriber
from processor.client.joining import GONE_ID
from processor.serve import sse


async def _merged(harness: Harness, rid: str) -> dict[str, Any]:
    item = await Subscriber(harness.client, harness.ns.name, harness.ns.shards).wait_for(rid, 30)
    return item.response


async def _until_type(stream: Any, kind: str, into: list[sse.Event]) -> dict[str, Any]:
    """Read events into ``into`` until one of type ``kind``; returns its data."""
    while True:
        event = await stream.event()
        into.append(event)
        data: dict[str, Any] = json.loads(event.data)
        if data["type"] == kind:
            return data


async def test_a_turn_streams_live_with_seq_ids_then_its_merged_response_and_end(
    redis_url, namespace
) -> None:
    async with served(redis_url, namespace, progress=True) as (harness, serve):
        producer = Producer(harness.client, namespace)
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, f"{serve.url}/v1/turns/r1/events",
                                       bearer("r1"))
            assert stream.response.headers["Cache-Control"] == "no-cache, no-transform"
            events: list[sse.Event] = []
            for i in range(4):
                await producer.send("r1", text_update(f"part {i}; "))
                while True:  # the chunk of this update arrives before the next is sent
                    data = await _until_type(stream, "synthesis.chunk", events)
                    if data["delta"] == f"part {i}; ":
                        break
            await producer.end("r1")
            events += await stream.rest()
            assert stream.parser.retry_ms == 1000
        data = check_stream(events)
        assert data[0]["type"] == "synthesis.started"
        chunks = chunk_text(data)
        merged = await _merged(harness, "r1")
        assert chunks == merged_text(merged) == "part 0; part 1; part 2; part 3; "
        assert data[-2]["response"] == merged and data[-2]["status"] == "completed"
        assert data[-1]["status"] == "completed"


async def _until_text(stream: Any, into: list[sse.Event], text: str) -> None:
    """Read events into ``into`` until their text chunks end with ``text``."""
    while not chunk_text(payloads(into)).endswith(text):
        into.append(await stream.event())


async def test_a_client_joining_mid_turn_gets_one_snapshot_then_the_live_events(
    redis_url, namespace
) -> None:
    """The snapshot is the merge of what the turn's log holds (the same
    shape as the merged response, id its seq); the live events follow on
    from its seq with no gap and no repeat; the stream ends with the exact
    merged response. Updates arrive while the client joins."""
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        early = [text_update(f"early {i} ") for i in range(3)]
        for update in early:
            await producer.send("late", update)
        await wait_logged(harness, "late", 3)
        async with aiohttp.ClientSession() as session:
            joining = asyncio.ensure_future(open_stream(
                session, f"{serve.url}/v1/turns/late/events", bearer("late")))
            for i in range(5):  # (some before the join's reads, some after)
                await producer.send("late", text_update(f"later {i} "))
            stream = await joining
            events = [await stream.event()]
            await producer.send("late", text_update("last"))
            await producer.end("late")
            events += await stream.rest()
        snapshot = json.loads(events[0].data)
        assert snapshot["type"] == "snapshot" and events[0].id == str(snapshot["seq"])
        data = check_stream(events, first_seq=snapshot["seq"])
        assert [d["type"] for d in data].count("snapshot") == 1
        merged = await _merged(harness, "late")
        chunks = chunk_text(data)
        assert merged_text(snapshot["response"]) + chunks == merged_text(merged)
        assert merged_text(merged) == "".join(f"early {i} " for i in range(3)) + "".join(
            f"later {i} " for i in range(5)) + "last"
        assert merged_text(snapshot["response"]).startswith("early 0 early 1 early 2 ")
        assert data[-2]["response"] == merged
        assert _sample(serve, 'processor_serve_incomplete_history_total') == 0


async def test_a_snapshot_is_the_merge_of_the_updates_so_far(redis_url, namespace) -> None:
    """Every field of the snapshot's response is the merge's (processor
    merge of the same updates), not only its text."""
    updates = [text_update("one ", "m1", "bob"), text_update("two ", None, "alice"),
               text_update("three", "m1", "bob")]
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        for update in updates:
            await producer.send("snap", update)
        await wait_logged(harness, "snap", 3)
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, f"{serve.url}/v1/turns/snap/events",
                                       bearer("snap"))
            snapshot = json.loads((await stream.event()).data)
            await producer.end("snap")
            await stream.rest()
        want = merge_entries([{"response_id": "snap", "update": u} for u in updates])
        assert snapshot["response"] == json.loads(msgspec.json.encode(want))


async def test_a_finished_turn_gives_its_merged_response_and_end_then_nothing(
    redis_url, namespace
) -> None:
    async with served(redis_url, namespace, progress=True) as (harness, serve):
        producer = Producer(harness.client, namespace)
        await producer.send("done", text_update("all of it"))
        await producer.end("done")
        merged = await _merged(harness, "done")
        async with aiohttp.ClientSession() as session:
            url = f"{serve.url}/v1/turns/done/events"
            events = await (await open_stream(session, url, bearer("done"))).rest()
            data = payloads(events)
            assert [d["type"] for d in data] == ["merged", "synthesis"]
            assert data[0]["response"] == merged and events[1].id == str(data[1]["seq"])
            # A client resuming from before the end gets the events it missed (read
            # back from the terminal event), then the same end; one that has the
            # terminal event gets 204, which tells EventSource not to reconnect.
            again = await open_stream(session, url, {**bearer("done"), "Last-Event-ID": "0"})
            resumed = await again.rest()
            assert [e.id for e in resumed if e.id is not None] == [
                str(seq) for seq in range(1, data[1]["seq"] + 1)]
            assert payloads(resumed)[-2:] == data
            assert chunk_text(payloads(resumed)) == "all of it"
            async with session.get(url, headers={**bearer("done"),
                                                 "Last-Event-ID": events[1].id}) as response:
                assert response.status == 204
            async with session.get(f"{url}?after={events[1].id}",
                                   headers=bearer("done")) as response:
                assert response.status == 204


async def test_a_stream_resumes_on_another_replica_without_gap_or_repeat(
    redis_url, namespace, tmp_path
) -> None:
    async with Harness(redis_url, namespace, progress=True, log_dir=tmp_path) as harness:
        worker = harness.spawn(progress=True, log_level="info")
        await harness.wait_started([worker])  # the namespace's record, which serve reads
        replicas = [spawn_serve(redis_url, namespace, tmp_path) for _ in range(2)]
        producer = Producer(harness.client, namespace)
        try:
            await harness.wait_started([worker])
            for replica in replicas:
                await replica.wait_serving()
            async with aiohttp.ClientSession() as session:
                path = "/v1/turns/moved/events"
                first = await open_stream(session, replicas[0].url + path, bearer("moved"))
                events: list[sse.Event] = []
                for i in range(3):
                    await producer.send("moved", text_update(f"a{i} "))
                await _until_text(first, events, "a2 ")
                first.close()  # the connection is gone; more is written meanwhile
                for i in range(3):
                    await producer.send("moved", text_update(f"b{i} "))
                await wait_logged(harness, "moved", 6)
                last = events[-1].id
                assert last is not None and int(last) >= 2
                second = await open_stream(session, replicas[1].url + path,
                                           {**bearer("moved"), "Last-Event-ID": last})
                resumed: list[sse.Event] = []
                await _until_text(second, resumed, "b2 ")
                await producer.end("moved")
                resumed += await second.rest()
                # ?after= (a client that cannot set the header) does the same.
                third = await open_stream(session, f"{replicas[0].url}{path}?after={last}",
                                          bearer("moved"))
                assert [e.data for e in await third.rest()][-2:] == [e.data for e in resumed][-2:]
                assert "processor_serve_resumes_total 1.0" in await _metrics(replicas[1].url)
                assert "processor_serve_resumes_total 1.0" in await _metrics(replicas[0].url)
        finally:
            for replica in replicas:
                replica.terminate()
        data = check_stream(events + resumed)
        chunks = chunk_text(data)
        assert chunks == merged_text(await _merged(harness, "moved")) == "a0 a1 a2 b0 b1 b2 "


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        return await response.text()


async def test_idle_streams_get_heartbeats(redis_url, namespace, caplog) -> None:
    """... and a client that goes away ends its stream at the next one, quietly."""
    serve = await start_local(config(redis_url, namespace, heartbeat=0.05))
    try:
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, f"{serve.url}/v1/turns/quiet/events",
                                       bearer("quiet"))
            seen = [await stream.next(comments=True) for _ in range(3)]
            assert seen == [sse.Comment("ping")] * 3
            assert _sample(serve, 'processor_serve_open_streams') == 1
            stream.close()
            await _until(lambda: _sample(serve, 'processor_serve_open_streams') == 0)
    finally:
        await serve.close()
    assert [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")] == []


def _sample(serve: Any, name: str, **labels: str) -> float:
    value = serve.server.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


async def _until(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_client_that_does_not_read_is_dropped_with_its_resume_id(
    redis_url, namespace
) -> None:
    """A client with a tiny receive window that stops reading: its writes
    block, its queue (4 events) fills, and it is dropped. When it reads
    again it finds everything up to the drop, then a ``dropped`` event
    naming its last id, from which it resumes to the end."""
    async with Harness(redis_url, namespace, progress=True) as harness:
        await harness.start_worker()
        serve = await start_local(config(redis_url, namespace, client_queue=4))
        producer = Producer(harness.client, namespace)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            loop = asyncio.get_running_loop()
            await loop.sock_connect(sock, ("127.0.0.1", serve.port))
            request = (f"GET /v1/turns/slow/events?token={token('slow')} HTTP/1.1\r\n"
                       f"Host: 127.0.0.1\r\n\r\n")
            await loop.sock_sendall(sock, request.encode())
            await _until(lambda: _sample(serve, 'processor_serve_open_streams') == 1)
            piece = "x" * 150_000
            for i in range(40):  # 6 MB of chunk events, one per update (logged before the next)
                await producer.send("slow", text_update(f"{i}:{piece}"))
                await wait_logged(harness, "slow", i + 1)
            await _until(lambda: _sample(serve, 'processor_serve_dropped_clients_total') == 1, 60)
            received = b""  # the server closes a dropped client's connection
            while chunk := await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 30):
                received += chunk
        finally:
            sock.close()
        head, _, body = received.partition(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n")[0] and b"chunked" in head.lower()
        # ended as a broken connection (no last chunk): every client resumes,
        # also one that takes a clean end for the turn's (fetch-event-source)
        assert not body.endswith(b"0\r\n\r\n")
        events = [e for e in sse.Parser().feed(_unchunk(body)) if isinstance(e, sse.Event)]
        notice = json.loads(events[-1].data)
        assert notice["type"] == "dropped" and notice["reason"] == "slow_client"
        assert notice["last_event_id"] == events[-2].id
        assert [e.id for e in events[:-1]] == [str(i) for i in range(len(events) - 1)]
        try:
            async with aiohttp.ClientSession() as session:
                resumed = await open_stream(
                    session, f"{serve.url}/v1/turns/slow/events",
                    {**bearer("slow"), "Last-Event-ID": notice["last_event_id"]})
                await producer.end("slow")
                rest = await resumed.rest(60)
        finally:
            await serve.close()
        data = check_stream(events[:-1] + rest)
        chunks = chunk_text(data)
        assert chunks == merged_text(await _merged(harness, "slow"))


def _unchunk(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body."""
    out = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += body[:size]
        body = body[size + 2:]
    return out


async def test_a_finished_turn_whose_outputs_were_trimmed_says_so(redis_url, namespace) -> None:
    """Streams are capped (--events-maxlen, --merged-maxlen): once a finished
    turn's terminal event is gone, a client is told so instead of waiting
    (the per-turn cache off: with it, a trim shows once its ``turn_cache`` s
    have passed)."""
    async with Harness(redis_url, namespace) as harness:
        await harness.start_worker()
        serve = await start_local(config(redis_url, namespace, turn_cache=0.0))
        producer = Producer(harness.client, namespace)
        shard = harness.ns.shard(0)
        try:
            await producer.send("old", text_update("long ago"))
            await producer.end("old")
            merged = await _merged(harness, "old")
            await harness.client.xtrim(shard.events, maxlen=0)
            async with aiohttp.ClientSession(serve.url) as session:
                stream = await open_stream(session, "/v1/turns/old/events", bearer("old"))
                events = await stream.rest()
                data = payloads(events)
                assert [d["type"] for d in data] == ["merged", "gone"]
                assert data[0]["response"] == merged and data[1]["status"] == "completed"
                # gone has an id: EventSource's reconnect with it is told 204 (it
                # stops), not gone again every second
                assert [e.id for e in events] == [None, str(GONE_ID)]
                async with session.get("/v1/turns/old/events", headers={
                        **bearer("old"), "Last-Event-ID": events[-1].id}) as response:
                    assert response.status == 204
                await harness.client.xtrim(shard.merged, maxlen=0)
                stream = await open_stream(session, "/v1/turns/old/events", bearer("old"))
                assert payloads(await stream.rest()) == [
                    {"type": "gone", "response_id": "old", "status": "completed"}]
                async with session.get("/v1/turns/old", headers=bearer("old")) as response:
                    assert response.status == 200
                    assert await response.json() == {"status": "completed", "response": None,
                                                     "meta": None}
        finally:
            await serve.close()


async def test_streams_and_turns_on_a_redis_cluster(redis_cluster) -> None:
    """Three shards on three masters: each shard's reader reads its own
    hash tag; the turn endpoint's reads stay in one slot."""
    from support.redis_servers import spread_namespace

    url = redis_cluster.url
    namespace = spread_namespace(redis_cluster, 3)
    async with Harness(url, namespace, shards=3, cluster=True, progress=True) as harness:
        await harness.start_worker()
        serve = await start_local(config(url, namespace, shards=3))
        producer = Producer(harness.client, namespace, shards=3)
        rids = [next(f"cl-{s}-{i}" for i in range(100)
                     if harness.ns.shard_for(f"cl-{s}-{i}").index == s) for s in range(3)]
        try:
            async with aiohttp.ClientSession(serve.url) as session:
                streams = [await open_stream(session, f"/v1/turns/{rid}/events", bearer(rid))
                           for rid in rids]
                for rid in rids:
                    await producer.send(rid, text_update(f"hello {rid}"))
                    await producer.end(rid)
                for rid, stream in zip(rids, streams, strict=True):
                    data = check_stream(await stream.rest())
                    assert data[-2]["response"]["messages"][0]["contents"][0]["text"] == (
                        f"hello {rid}")
                    async with session.get(f"/v1/turns/{rid}", headers=bearer(rid)) as response:
                        assert response.status == 200
        finally:
            await serve.close()

"""``processor serve`` under bursts and attackers (issue 33, item 1):

- a burst of joins at one replica all get 200: they wait for a Redis
  connection instead of failing with 503 while Redis is healthy;
- connections that send their headers slowly, or not at all, are closed,
  and those not yet in a request are bounded in number;
- malformed requests that carry a token leave it in no line of serve's
  output, and every line is JSON;
- repeated joins, resumes and GETs of one turn cost Redis one read of it
  (the per-turn cache), and one request's reads are bounded in bytes;
- ids with ``{`` and ``}`` are reachable.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from support.records import init_namespace_sync
from support.serve_harness import (
    bearer,
    check_stream,
    config,
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


async def _ready(session: aiohttp.ClientSession) -> None:
    for _ in range(300):
        async with session.get("/readyz") as response:
            if response.status == 200:
                return
        await asyncio.sleep(0.05)
    raise AssertionError("serve never got ready")


async def test_a_burst_of_joins_all_get_200(redis_url, namespace) -> None:
    """400 streams opened at once (redis-py's pool holds 100 connections):
    every one is answered 200; none gets 503 ``redis_unavailable`` (199 of
    300 did, before joins waited for a connection)."""
    serve = await start_local(config(redis_url, namespace))
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(serve.url, connector=connector) as session:
            await _ready(session)
            start = asyncio.Event()

            async def join(i: int) -> int:
                rid = f"burst-{i % 40}"
                await start.wait()
                async with session.get(f"/v1/turns/{rid}/events", headers=bearer(rid)) as r:
                    return r.status

            tasks = [asyncio.create_task(join(i)) for i in range(400)]
            await asyncio.sleep(0.1)
            start.set()
            statuses = await asyncio.gather(*tasks)
        waited = serve.server.metrics.registry.get_sample_value(
            "processor_serve_redis_wait_seconds_count")
    finally:
        await serve.close()
    assert statuses.count(200) == 400, {s: statuses.count(s) for s in set(statuses)}
    assert waited is not None and waited >= 400  # every join's wait was measured


async def _closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  trickle: bool, within: float) -> bool:
    """Whether the server closes the connection within ``within`` s (while
    the client sends one header byte every 0.3 s, with ``trickle``)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            data = await asyncio.wait_for(reader.read(1024), 0.3)
        except TimeoutError:
            if trickle:
                try:
                    writer.write(b"a")
                    await writer.drain()
                except ConnectionError:
                    return True
            continue
        except ConnectionError:
            return True
        if not data:
            return True
    return False


async def test_slow_headers_are_cut_and_waiting_connections_are_bounded(
    redis_url, namespace
) -> None:
    """Headers sent one byte at a time are cut after ``header_timeout``
    (they used to stay open 75 s, aiohttp's keep-alive timeout); past
    ``max_pending`` connections outside a request, the oldest are closed at
    once; a real request is answered all along."""
    serve = await start_local(config(redis_url, namespace, header_timeout=1.0, max_pending=20))
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(30):
            reader, writer = await asyncio.open_connection("127.0.0.1", serve.port)
            writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: a")
            await writer.drain()
            conns.append((reader, writer))
        async with aiohttp.ClientSession(serve.url) as session, \
                session.get("/healthz") as response:
            assert response.status == 200
        oldest = await asyncio.gather(*(_closed(r, w, False, 0.5) for r, w in conns[:10]))
        assert all(oldest), oldest  # closed at once: 20 waiting is the bound
        rest = await asyncio.gather(*(_closed(r, w, True, 8.0) for r, w in conns[10:]))
        assert all(rest), rest  # cut after the header timeout, although bytes kept coming
    finally:
        for _, writer in conns:
            writer.close()
        await serve.close()


def _malformed(tok: str) -> list[bytes]:
    """Requests aiohttp refuses before any handler runs, each carrying ``tok``."""
    t = tok.encode()
    return [
        b"GET /v1/turns/t1/events?token=" + t + b"\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/turns/t1/events?token=" + t + b" x HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/turns/t1?token=" + t + b" HTTP/9.9\r\nHost: x\r\n\r\n",
        b"GET /v1/turns/t1?token=" + t + b" HTTP/1.1x\r\nHost: x\r\n\r\n",
        b"GET /v1/turns/t1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + t
        + b"\r\nBad Header: v\r\n\r\n",
        b"GET /v1/turns/t1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + t
        + b"\r\n folded: " + t + b"\r\n\r\n",
        b"GET /v1/turns/t1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + t + b"\x00\r\n\r\n",
        b"GET /v1/turns/t1?token=" + t + b"&pad=" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n",
        b"GET /v1/turns/t1?token=" + t + b" HTTP/1.1\r\nX-Pad: " + b"a" * 10_000 + b"\r\n\r\n",
        b"G\x01T /v1/turns/t1?token=" + t + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/turns/t1?token=" + t + b" HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        b"POST /v1/turns/t1/cancel?token=" + t + b" HTTP/1.1\r\nTransfer-Encoding: zip\r\n\r\n",
    ]


async def test_malformed_requests_leave_no_token_in_the_log(
    redis_url, namespace, tmp_path: Path
) -> None:
    """Each malformed request carries a valid token (in its URL or a
    header); serve runs at debug level: no line of its output holds the
    token, and every line is JSON (aiohttp's own error lines used to print
    the request line, over several lines of plain text). The same malformed
    request 50 more times adds no line (one line of a kind a minute)."""
    import redis as sync_redis

    init_namespace_sync(sync_redis.Redis.from_url(redis_url), namespace)
    tok = token("t1")
    serve = spawn_serve(redis_url, namespace, tmp_path, "--log-level", "debug")
    try:
        await serve.wait_serving()
        for request in [*_malformed(tok), *[_malformed(tok)[2]] * 50]:
            reader, writer = await asyncio.open_connection("127.0.0.1", serve.port)
            writer.write(request)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(65536), 10)
            assert answer.split(b" ")[1].startswith(b"4"), (request[:60], answer[:200])
            writer.close()
        assert serve.terminate() == 0
    finally:
        serve.kill()
    lines = serve.log().splitlines()
    assert any('"msg": "stopped cleanly"' in line for line in lines)
    leaks = [line for line in lines if tok in line or tok.split(".")[2] in line]
    assert not leaks, leaks
    for line in lines:
        json.loads(line)  # every line is one JSON object
    # One line of a kind a minute: 50 more of one malformed request add none.
    errors = [json.loads(line) for line in lines if '"aiohttp.server"' in line]
    assert 1 <= len(errors) <= len(_malformed(tok)), errors


def _calls(info: dict[str, Any], command: str) -> int:
    return int(info.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_repeated_resumes_of_a_finished_turn_read_it_once(
    make_redis_server, namespace
) -> None:
    """20 resumes from seq 0 of a finished turn: the same events each time,
    from one look-back through the shard's events stream (each resume read
    it back again before: about 21 MB per request for a long turn)."""
    server = make_redis_server()
    # (--hold-ms 100: a held update is checkpointed, so acked, soon after it is
    # read, and wait_applied() waits for that, not for the default 5 s.)
    async with Harness(server.url, namespace, progress=True, hold_ms=100) as harness:
        await harness.start_worker()
        producer = Producer(harness.client, namespace)
        for i in range(12):
            await producer.send("f1", text_update(f"part {i} "))
            await harness.wait_applied()
        await producer.end("f1")
        await Subscriber(harness.client, namespace).wait_for("f1", 30)
        serve = await start_local(config(server.url, namespace, turn_cache=30.0))
        try:
            async with aiohttp.ClientSession(serve.url) as session:
                await _ready(session)
                before = await harness.client.info("commandstats")
                streams = []
                for i in range(20):
                    stream = await open_stream(session, "/v1/turns/f1/events",
                                               {**bearer("f1"), "Last-Event-ID": "0"})
                    streams.append(check_stream(await stream.rest(), first_seq=1))
                    if i == 0:
                        first = await harness.client.info("commandstats")
                after = await harness.client.info("commandstats")
        finally:
            await serve.close()
    assert all(data == streams[0] for data in streams)
    pages = _calls(first, "xrevrange") - _calls(before, "xrevrange")  # one look-back's
    assert pages >= 1
    assert _calls(after, "xrevrange") - _calls(first, "xrevrange") == 0
    assert _calls(after, "hmget") - _calls(before, "hmget") == 1


async def test_repeated_joins_and_gets_of_a_running_turn_read_it_once(
    make_redis_server, namespace
) -> None:
    """Fresh joins and GETs of a running turn whose log does not change
    share one read of it (each re-read and re-merged the whole log before);
    once the turn moves on, the next join reads it again and sees the new
    update."""
    server = make_redis_server()
    async with Harness(server.url, namespace, progress=True) as harness:
        # Held throughout (no handover to the stored path, which may publish
        # meanwhile): the turn changes only when the test sends to it. The
        # XRANGE count below is the server's: the worker's sweep
        # (sweep_shard.lua, one XRANGE of the updates stream) runs once at
        # start and then not during the requests, which take longer than a
        # sweep interval on a busy machine.
        await harness.start_worker(hold_ms=120_000, sweep_interval=600)
        producer = Producer(harness.client, namespace)
        await producer.send("r1", text_update("first "))
        await wait_logged(harness, "r1", 1)
        serve = await start_local(config(server.url, namespace, turn_cache=30.0))
        try:
            async with aiohttp.ClientSession(serve.url) as session:
                await _ready(session)
                before = await harness.client.info("commandstats")
                texts = []
                for _ in range(10):
                    async with session.get("/v1/turns/r1", headers=bearer("r1")) as response:
                        assert response.status == 202
                        texts.append((await response.json())["snapshot"]["response"])
                    stream = await open_stream(session, "/v1/turns/r1/events", bearer("r1"))
                    first = json.loads((await stream.event()).data)
                    stream.close()
                    assert first["type"] == "snapshot"
                    texts.append(first["response"])
                after = await harness.client.info("commandstats")
                await producer.send("r1", text_update("second"))
                await wait_logged(harness, "r1", 2)
                stream = await open_stream(session, "/v1/turns/r1/events", bearer("r1"))
                moved = json.loads((await stream.event()).data)
                stream.close()
        finally:
            await serve.close()
    assert all(text == texts[0] for text in texts)
    assert _calls(after, "xrange") - _calls(before, "xrange") == 1
    assert moved["type"] == "snapshot"
    assert [c["text"] for m in moved["response"]["messages"] for c in m["contents"]] == [
        "first second"]


async def test_one_request_reads_a_bounded_number_of_bytes(
    make_redis_server, namespace
) -> None:
    """With ``read_budget`` 16 KiB, a resume from seq 0 of a finished turn
    of 800 KB of events makes Redis send little more than its outputs (the
    merged entry and terminal event a GET reads too) and falls back to what
    stays exact: the merged response and the terminal event (before, it
    read every event back, and sent them); a GET of a running turn whose
    log is past the budget answers 202 without a snapshot."""
    server = make_redis_server()
    # (Every batch published: an event of about 8 KB per update. Coalesced
    # within --live-interval-ms, an entry would hold several, and the one
    # page Redis may send past the budget would be that much larger.)
    # (--hold-ms 100: a held update is checkpointed, so acked, soon after it is
    # read, and wait_applied() waits for that, not for the default 5 s.)
    async with Harness(server.url, namespace, progress=True, live_interval_ms=0,
                       hold_ms=100) as harness:
        await harness.start_worker()
        producer = Producer(harness.client, namespace)
        for i in range(100):
            await producer.send("big", text_update(f"{i:03d}" + "x" * 8000))
            if i % 10 == 9:
                await harness.wait_applied()
        await producer.send("run", text_update("y" * 8000))
        await producer.send("run", text_update("z" * 8000))
        await producer.end("big")
        item = await Subscriber(harness.client, namespace).wait_for("big", 60)
        await wait_logged(harness, "run", 2)
        serve = await start_local(config(server.url, namespace, read_budget=16384,
                                          turn_cache=0.0))
        try:
            async with aiohttp.ClientSession(serve.url) as session:
                await _ready(session)

                async def sent() -> int:
                    return int((await harness.client.info("stats"))["total_net_output_bytes"])

                before = await sent()  # the outputs alone: merged entry and terminal event
                async with session.get("/v1/turns/big", headers=bearer("big")) as response:
                    assert (await response.json())["response"] == item.response
                outputs, before = await sent() - before, await sent()
                stream = await open_stream(session, "/v1/turns/big/events",
                                           {**bearer("big"), "Last-Event-ID": "0"})
                data = payloads(await stream.rest())
                resumed = await sent() - before
                async with session.get("/v1/turns/run", headers=bearer("run")) as response:
                    running = (response.status, await response.json())
            cut = serve.server.metrics.registry.get_sample_value(
                "processor_serve_reads_over_budget_total")
        finally:
            await serve.close()
    assert [d["type"] for d in data] == ["merged", "synthesis"]
    assert data[0]["response"] == item.response
    # (the turn's events alone are over 800 KB: they were all read back and sent)
    assert resumed - outputs < 100_000, (resumed, outputs)
    assert running == (202, {"status": "running", "snapshot": None})
    assert cut == 2  # (the look-back, the log)


async def test_ids_with_braces_are_reachable(redis_url, namespace) -> None:
    """``a{b}c`` (workers accept it): its outcome, stream, page and cancel
    (each was a 404: aiohttp's default pattern for a path part refuses braces)."""
    rid, other = "a{b}c", "{x}"
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        await producer.send(rid, text_update("braced"))
        await producer.end(rid)
        await producer.send(other, text_update("open"))
        await Subscriber(harness.client, namespace).wait_for(rid, 30)
        async with aiohttp.ClientSession(serve.url) as session:
            path = f"/v1/turns/{quote(rid, safe='')}"
            async with session.get(path, headers=bearer(rid)) as response:
                assert response.status == 200
                assert (await response.json())["status"] == "completed"
            stream = await open_stream(session, f"{path}/events", bearer(rid))
            data = payloads(await stream.rest())
            assert [d["type"] for d in data[-2:]] == ["merged", "synthesis"]
            async with session.get(f"{path}/view", headers=bearer(rid)) as response:
                assert response.status == 200
            async with session.get(f"/v1/turns/{other}/view",
                                   headers=bearer(other)) as response:
                assert response.status == 200  # unquoted braces too
            async with session.post(f"/v1/turns/{quote(other, safe='')}/cancel",
                                    headers=bearer(other)) as response:
                assert response.status == 202
                assert await response.json() == {"cancelled": other}
            async with session.get(path, headers=bearer(other)) as response:
                assert response.status == 403  # the token still names its turn


async def test_odd_ids_and_resume_ids_get_clear_answers_and_reveal_nothing(
    redis_url, namespace
) -> None:
    """Held, and kept so with the route that takes any path segment: ids
    that try to leave their path part, a NUL, unicode, 100 KB, each with a
    token of its own, get 404 ``unknown_turn``, 400 past 512
    characters (a cancel too: it writes nothing), or a 4xx from aiohttp
    (never a 500); resume ids that are not whole numbers get 400; /metrics and
    /healthz then name no id and no token."""
    ids = ["../x", "..", "\x00", "a\x00b", "tür-✓", "{", "}", "a}:cancel:b", "y" * 513,
           "x" * 100_000]
    tokens = [token(rid) for rid in ids]
    serve = await start_local(config(redis_url, namespace))
    try:
        async with aiohttp.ClientSession(serve.url) as session:
            await _ready(session)
            for rid, tok in zip(ids, tokens, strict=True):
                path = f"/v1/turns/{quote(rid, safe='')}"
                async with session.get(path, headers={"Authorization": f"Bearer {tok}"}) as r:
                    if 512 < len(rid) < 1000:
                        assert r.status == 400 and "512" in (await r.json())["detail"]
                        async with session.post(path + "/cancel",
                                                headers={"Authorization": f"Bearer {tok}"}) as c:
                            assert c.status == 400 and (await c.json())["error"] == "bad_request"
                    elif len(rid) < 1000:
                        assert r.status == 404, (rid, r.status)
                        if r.content_type == "application/json":  # (else no route: "..")
                            assert (await r.json())["error"] == "unknown_turn"
                    else:
                        assert 400 <= r.status < 500, r.status  # (past aiohttp's line size)
            for value in ["seven", "-1", "1e3", "٣", "9" * 19, " 1", "1.0", "0x10", "+1"]:
                asked = [("/v1/turns/t/events?after=" + quote(value), bearer("t"))]
                if value.isascii() and value == value.strip():  # (HTTP strips a header's)
                    asked.append(("/v1/turns/t/events", {**bearer("t"), "Last-Event-ID": value}))
                for path, headers in asked:
                    async with session.get(path, headers=headers) as r:
                        assert r.status == 400, (value, r.status)
                        assert (await r.json())["error"] == "bad_request"
            async with session.get("/metrics") as r:
                shown = await r.text()
            async with session.get("/healthz") as r:
                shown += await r.text()
    finally:
        await serve.close()
    for secret in [*tokens, *(rid for rid in ids if len(rid) > 2), token("t")]:
        assert secret not in shown

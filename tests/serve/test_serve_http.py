"""``processor serve`` over real HTTP, against real workers and Redis: the
turn endpoint (404, 202, 200), cancel, tokens (401, 403, expired,
``--no-auth``), CORS, health, readiness and metrics, bad requests, the
command line's one-line errors, and what the package may import."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import aiohttp
from support.records import init_namespace_sync
from support.serve_harness import (
    SECRET,
    bearer,
    config,
    open_stream,
    payloads,
    served,
    start_local,
    text_update,
    token,
)
from support.worker_harness import ROOT, Harness

from processor.client import Producer, Subscriber
from processor.serve.tokens import issue
from processor.wire.ids import response_id_for_turn


def _sample(serve: Any, name: str, **labels: str) -> float:
    value = serve.server.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


async def test_the_turn_endpoint_answers_404_then_202_then_200(redis_url, namespace) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        async with aiohttp.ClientSession(serve.url) as session:
            async with session.get("/v1/turns/t1", headers=bearer("t1")) as response:
                assert response.status == 404
                assert (await response.json())["error"] == "unknown_turn"
            await producer.send("t1", text_update("hello "))
            await harness.wait_applied()  # held by the worker: the turn is running
            for _ in range(300):  # until the worker's live log has the update
                async with session.get("/v1/turns/t1", headers=bearer("t1")) as response:
                    assert response.status == 202
                    running = await response.json()
                if running["snapshot"]["response"]["messages"]:
                    break
                await asyncio.sleep(0.02)
            assert running["status"] == "running"
            snapshot = running["snapshot"]
            assert snapshot["type"] == "snapshot" and snapshot["seq"] >= 1
            assert [c["text"] for m in snapshot["response"]["messages"]
                    for c in m["contents"]] == ["hello "]
            await producer.send("t1", text_update("world"))
            await producer.end("t1")
            item = await Subscriber(harness.client, namespace).wait_for("t1", 30)
            async with session.get("/v1/turns/t1", headers=bearer("t1")) as response:
                assert response.status == 200
                body = await response.json()
        assert body == {"status": "completed", "response": item.response, "meta": item.meta}


async def test_cancel_ends_the_stream_cancelled_with_the_partial_merge(
    redis_url, namespace
) -> None:
    async with served(redis_url, namespace, progress=True) as (harness, serve):
        producer = Producer(harness.client, namespace)
        async with aiohttp.ClientSession(serve.url) as session:
            stream = await open_stream(session, "/v1/turns/c1/events", bearer("c1"))
            await producer.send("c1", text_update("half an answer"))
            while json.loads((await stream.event()).data)["type"] != "synthesis.chunk":
                pass
            async with session.post("/v1/turns/c1/cancel") as response:
                assert response.status == 401  # a cancel needs the turn's token too
            async with session.post("/v1/turns/c1/cancel", headers=bearer("c1"),
                                    json={"reason": "user pressed stop"}) as response:
                assert response.status == 202
                assert await response.json() == {"cancelled": "c1"}
            key = producer.cancel_key("c1")
            assert await harness.client.get(key) == b"user pressed stop"
            data = payloads(await stream.rest())
            async with session.post("/v1/turns/c1/cancel", headers=bearer("c1"),
                                    json={"reason": 5}) as response:
                assert response.status == 400
            # 513 characters, 1,026 bytes: past the function's bound (1 KiB).
            async with session.post("/v1/turns/c1/cancel", headers=bearer("c1"),
                                    json={"reason": "é" * 513}) as response:
                assert response.status == 400
                assert "1 to 1024 bytes" in (await response.json())["detail"]
            # A second cancel keeps the first one's reason.
            async with session.post("/v1/turns/c1/cancel", headers=bearer("c1"),
                                    json={"reason": "again"}) as response:
                assert response.status == 202
            assert await harness.client.get(key) == b"user pressed stop"
        assert [d["type"] for d in data[-2:]] == ["merged", "synthesis"]
        assert data[-2]["status"] == data[-1]["status"] == "cancelled"
        assert data[-1]["cancel_reason"] == "user pressed stop"  # the native stream passes it
        assert data[-2]["meta"]["cancel_reason"] == "user pressed stop"
        assert data[-2]["response"]["messages"][0]["contents"] == [
            {"type": "text", "text": "half an answer"}]


async def test_tokens_open_only_their_turn_until_they_expire(redis_url, namespace) -> None:
    serve = await start_local(config(redis_url, namespace))
    expired = issue(SECRET, "a", int(time.time()) - 1)
    cases = [  # (path, headers, expected status, refusal reason)
        ("/v1/turns/a", {}, 401, "missing"),
        ("/v1/turns/a?token=nonsense", {}, 401, "bad"),
        ("/v1/turns/a", {"Authorization": "Bearer " + issue("another-secret-xyz", "a",
                                                            int(time.time()) + 60)}, 401, "bad"),
        ("/v1/turns/a?token=" + expired, {}, 401, "expired"),
        ("/v1/turns/a", bearer("b"), 403, "forbidden"),
        ("/v1/turns/a/events?token=" + token("b"), {}, 403, "forbidden"),
        ("/v1/turns/a", bearer("a"), 404, None),  # allowed: the turn is just unknown
        ("/v1/turns/a?token=" + token("a"), {}, 404, None),
        ("/v1/turns/a", {"Authorization": "Basic eDp5"}, 401, "missing"),
    ]
    try:
        async with aiohttp.ClientSession(serve.url) as session:
            for path, headers, status, reason in cases:
                async with session.get(path, headers=headers) as response:
                    assert response.status == status, (path, headers)
                    body = await response.json()
                    if reason:
                        assert body["error"] == reason, path
                    if status == 401:
                        assert response.headers["WWW-Authenticate"].startswith("Bearer")
            async with session.get("/v1/turns/a/view") as response:  # the page says why
                assert response.status == 401
                assert response.headers["Content-Type"].startswith("text/html")
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
            async with session.get("/v1/turns/a/view?token=" + token("a")) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/html")
                assert "script-src 'sha256-" in response.headers["Content-Security-Policy"]
                assert response.headers["Referrer-Policy"] == "no-referrer"
        refusals = {r: _sample(serve, "processor_serve_auth_refusals_total", reason=r)
                    for r in ("missing", "bad", "expired", "forbidden")}
        assert refusals == {"missing": 3, "bad": 2, "expired": 1, "forbidden": 2}
    finally:
        await serve.close()


async def test_without_auth_every_turn_is_served(redis_url, namespace) -> None:
    serve = await start_local(config(redis_url, namespace, token_secret=None))
    try:
        async with aiohttp.ClientSession(serve.url) as session:
            async with session.get("/v1/turns/anything") as response:
                assert response.status == 404
            stream = await open_stream(session, "/v1/turns/anything/events")
            stream.close()
    finally:
        await serve.close()


async def test_cors_lets_listed_origins_in_and_no_others(redis_url, namespace) -> None:
    app_origin = "https://app.example.com"
    serve = await start_local(config(redis_url, namespace, cors_origins=(app_origin,)))
    anyone = await start_local(config(redis_url, namespace, cors_origins=("*",)))
    nobody = await start_local(config(redis_url, namespace))
    preflight = {"Access-Control-Request-Method": "GET",
                 "Access-Control-Request-Headers": "authorization, last-event-id"}
    try:
        async with aiohttp.ClientSession() as session:
            url = f"{serve.url}/v1/turns/x"
            async with session.options(url, headers={**preflight, "Origin": app_origin}) as r:
                assert r.status == 204
                assert r.headers["Access-Control-Allow-Origin"] == app_origin
                assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
                assert "Last-Event-ID" in r.headers["Access-Control-Allow-Headers"]
                assert "POST" in r.headers["Access-Control-Allow-Methods"]
            async with session.options(url, headers={**preflight,
                                                     "Origin": "https://evil.example"}) as r:
                assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
            async with session.get(url, headers={**bearer("x"), "Origin": app_origin}) as r:
                assert r.status == 404  # errors carry the header too, or a browser hides them
                assert r.headers["Access-Control-Allow-Origin"] == app_origin
                assert "Origin" in r.headers.getall("Vary")
            async with session.get(url, headers={**bearer("x"), "Origin": "https://evil.example"}
                                   ) as r:
                assert "Access-Control-Allow-Origin" not in r.headers
            stream = await open_stream(session, f"{url}/events?token={token('x')}",
                                       {"Origin": app_origin})
            assert stream.response.headers["Access-Control-Allow-Origin"] == app_origin
            stream.close()
            async with session.get(f"{anyone.url}/v1/turns/x", headers={
                    **bearer("x"), "Origin": "https://elsewhere.example"}) as r:
                assert r.headers["Access-Control-Allow-Origin"] == "*"
            async with session.get(f"{nobody.url}/v1/turns/x", headers={
                    **bearer("x"), "Origin": app_origin}) as r:
                assert "Access-Control-Allow-Origin" not in r.headers
            async with session.options(f"{nobody.url}/v1/turns/x",
                                       headers={**preflight, "Origin": app_origin}) as r:
                assert r.status == 403
    finally:
        for server in (serve, anyone, nobody):
            await server.close()


async def test_bad_requests_get_400(redis_url, namespace) -> None:
    serve = await start_local(config(redis_url, namespace, token_secret=None))
    try:
        async with aiohttp.ClientSession(serve.url) as session:
            for path, headers in [("/v1/turns/a/events", {"Last-Event-ID": "seven"}),
                                  ("/v1/turns/a/events?after=-3", {}),
                                  ("/v1/turns/a?turn_id=t", {})]:
                async with session.get(path, headers=headers) as response:
                    assert response.status == 400, path
                    assert (await response.json())["error"] == "bad_request"
            async with session.post("/v1/turns/a/cancel", data=b"{not json",
                                    headers={"Content-Type": "application/json"}) as response:
                assert response.status == 400
    finally:
        await serve.close()


async def test_a_turn_sent_with_only_a_turn_id_is_found_by_its_turn_id(
    redis_url, namespace
) -> None:
    """Its ResponseId is assigned, and its shard is its turn_id's (docs/contract.md §3)."""
    async with Harness(redis_url, namespace, shards=4) as harness:
        await harness.start_worker()
        serve = await start_local(config(redis_url, namespace, shards=4, token_secret=None))
        producer = Producer(harness.client, namespace, shards=4)
        rid = next(response_id_for_turn(f"turn-{i}") for i in range(50)
                   if harness.ns.shard_for(response_id_for_turn(f"turn-{i}"))
                   != harness.ns.shard_for(f"turn-{i}"))
        turn_id = next(f"turn-{i}" for i in range(50) if response_id_for_turn(f"turn-{i}") == rid)
        try:
            await producer.send(None, text_update("routed"), turn_id=turn_id)
            await producer.end(None, turn_id=turn_id)
            await Subscriber(harness.client, namespace, 4).wait_for(None, 30, turn_id=turn_id)
            async with aiohttp.ClientSession(serve.url) as session:
                async with session.get(f"/v1/turns/{rid}") as response:
                    assert response.status == 404  # looked for on the response id's shard
                async with session.get(f"/v1/turns/{rid}?turn_id={turn_id}") as response:
                    assert response.status == 200
                    assert (await response.json())["status"] == "completed"
                stream = await open_stream(session, f"/v1/turns/{rid}/events?turn_id={turn_id}")
                assert [d["type"] for d in payloads(await stream.rest())] == [
                    "merged", "synthesis"]
        finally:
            await serve.close()


async def test_health_readiness_and_metrics(make_redis_server, namespace) -> None:
    redis = make_redis_server()
    serve = await start_local(config(redis.url, namespace, token_secret=None))
    try:
        async with aiohttp.ClientSession(serve.url) as session:
            async with session.get("/healthz") as response:
                assert (response.status, await response.text()) == (200, "ok\n")
            # Ready once its feed readers have found where the streams end:
            # until then (a moment, longer on a busy machine) 503 saying so.
            deadline = time.monotonic() + 30
            while True:
                async with session.get("/readyz") as response:
                    answer = (response.status, await response.text())
                if answer[0] == 200 or time.monotonic() > deadline:
                    break
                assert answer[0] == 503 and "positioned" in answer[1], answer
                await asyncio.sleep(0.02)
            assert answer == (200, "ok\n")
            stream = await open_stream(session, "/v1/turns/m/events?after=3")
            async with session.get("/metrics") as response:
                text = await response.text()
                assert response.headers["Content-Type"].startswith("text/plain")
            assert "processor_serve_open_streams 1.0" in text
            assert "processor_serve_resumes_total 1.0" in text
            stream.close()
            redis.stop()
            async with session.get("/readyz") as response:
                assert response.status == 503
                assert "redis" in await response.text()
            async with session.get("/healthz") as response:
                assert response.status == 200  # alive: the readers retry
            async with session.get("/v1/turns/m") as response:
                assert response.status == 503
                assert (await response.json())["error"] == "redis_unavailable"
            redis.start()
            deadline = time.monotonic() + 30
            while True:
                async with session.get("/readyz") as response:
                    if response.status == 200:
                        break
                assert time.monotonic() < deadline
    finally:
        await serve.close()


def _serve(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("PROCESSOR_") and k != "REDIS_URL"}
    return subprocess.run([sys.executable, "-m", "processor.cli", "serve", *argv],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**base, "PYTHONPATH": str(ROOT), **(env or {})})


def test_bad_options_are_one_line_each_and_exit_2() -> None:
    done = _serve("--port", "70000", "--heartbeat", "0", "--cors-origins", "example.com",
                  "--token-secret", "short", "--redis-url", "http://user:hunter2@h",
                  env={"PROCESSOR_CLIENT_QUEUE": "lots"})
    assert done.returncode == 2 and done.stdout == "" and "hunter2" not in done.stderr
    assert done.stderr.splitlines() == [
        "processor serve: --port: must be at most 65535, got '70000'",
        "processor serve: --heartbeat: must be at least 0.05, got '0'",
        "processor serve: PROCESSOR_CLIENT_QUEUE: expected an integer, got 'lots'",
        # Named with its password masked, never echoed as given:
        "processor serve: redis URL http://user:***@h must start with redis://, rediss:// or "
        "unix://",
        "processor serve: --token-secret must be at least 16 characters, got 5",
        "processor serve: --cors-origins: not an origin (scheme://host[:port]): 'example.com'",
    ]
    done = _serve("--redis-url", "redis://127.0.0.1:1")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "processor serve: give --token-secret or set PROCESSOR_TOKEN_SECRET, or --no-auth to "
        "serve every turn without tokens"]
    done = _serve()
    assert done.returncode == 2 and "give --redis-url or set REDIS_URL" in done.stderr


def test_serve_port_taken_is_one_line_and_exit_2(redis_url, namespace, redis_client) -> None:
    import socket

    init_namespace_sync(redis_client, namespace)  # as a worker or processor init would
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve("--redis-url", redis_url, "--namespace", namespace, "--host",
                      "127.0.0.1", "--port", str(port), "--no-auth")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(
        f"processor serve: cannot listen on 127.0.0.1:{port}: ")
    no_auth = [json.loads(line) for line in done.stderr.splitlines()[:-1]]
    assert any(line["level"] == "warning" and "authentication is off" in line["msg"]
               for line in no_auth)


def test_serve_imports_no_worker_module() -> None:
    """processor serve reads what workers publish; it shares the contract's
    modules and the client, never the worker's own."""
    code = ("import sys, processor.cli.main, processor.serve.run; "
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('processor'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, check=True).stdout.split()
    allowed = {"processor", "processor.cli", "processor.cli.main", "processor.logs",
               "processor.stopping", "processor.redis_io", "processor.redis_io.connections",
               "processor.redis_io.read_budget",  # (a reply's bound in bytes)
               "processor.redis_io.packing",  # (commands packed by hiredis)
               "processor.redis_io.replies", "processor.wire.defaults",
               "processor.redis_io.options",  # (how to reach Redis: imports no redis-py)
               "processor.redis_io.client",  # (the Redis client's type, XREAD's arguments)
               "processor.wire", "processor.wire.ids", "processor.wire.keys",
               "processor.wire.cancels",  # (a cancel's bounds: the client's too)
               "processor.wire.models", "processor.wire.outputs",
               "processor.host", "processor.host.options",
               "processor.host.tool_shell", "processor.scripts",
               "processor.scripts.library",  # (the producers' function library: the client's too)
               "processor.scripts.meta",  # (the namespace's record: the client's too)
               # The pure merge, to fold a running turn's logged updates into its snapshot.
               "processor.engine", "processor.engine.merge", "processor.engine.combine",
               "processor.engine.turn_state", "processor.engine.usage",
               "processor.engine.agui", "processor.engine.agui_client",  # (pure AG-UI, as --agui's)
               "processor.engine.agui_live",  # (the live AG-UI projection)
               # The pure AI SDK UI message stream, and the one rule it shares with
               # live progress: how a call's chunks spell its arguments.
               "processor.engine.ui_messages", "processor.engine.ui_parts",
               "processor.engine.live", "processor.engine.shown"}  # (live's state types)
    extra = [m for m in loaded if m not in allowed and not m.startswith(
        ("processor.serve", "processor.client"))]
    assert extra == []

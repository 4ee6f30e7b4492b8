"""A stopping ``processor serve`` (SIGTERM, as in a rolling deploy) ends its
streams so that the real JavaScript clients, with their default settings,
reconnect and resume: ``@microsoft/fetch-event-source`` (whose default
handlers resolve their promise when a stream ends cleanly: it used to end
with a truncated turn and no terminal event) and ``eventsource`` (npm).

Each runs in Node.js (tests/js) against a ``processor serve`` subprocess
that is stopped mid-turn and started again on the same port while the
worker goes on: the client ends with every seq once, in order, the merged
response and the terminal event. A stream that a Redis failure ends is cut
the same way."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.exceptions
from support.node_clients import run
from support.serve_harness import (
    ServeProcess,
    bearer,
    check_followed,
    free_port,
    open_stream,
    served,
    spawn_serve,
    text_update,
    token,
    wait_logged,
)
from support.worker_harness import Harness

from processor.client import Producer, Subscriber
from processor.serve.stream import EventStream


async def _open_streams(serve: ServeProcess) -> float:
    async with aiohttp.ClientSession() as session, \
            session.get(serve.url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith("processor_serve_open_streams "):
                return float(line.split()[1])
    return 0.0


async def _stop_and_start_mid_turn(harness: Harness, tmp_path: Path, rid: str,
                                   client: Any) -> tuple[dict[str, Any], Any]:
    """Stream ``rid`` to ``client(url)`` (a coroutine: the Node.js run)
    through a serve stopped with SIGTERM and started again mid-turn."""
    port = free_port()
    serve = spawn_serve(harness.url, harness.ns.name, tmp_path, port=port)
    producer = Producer(harness.client, harness.ns.name)
    try:
        await serve.wait_serving()
        for i in range(3):
            await producer.send(rid, text_update(f"a{i} "))
        await wait_logged(harness, rid, 3)
        following = asyncio.ensure_future(client(f"http://127.0.0.1:{port}"))
        for _ in range(1500):
            if await _open_streams(serve) >= 1 or following.done():
                break
            await asyncio.sleep(0.02)
        for i in range(3):
            await producer.send(rid, text_update(f"b{i} "))
        await wait_logged(harness, rid, 6)
        await asyncio.sleep(0.2)  # (told to the client, or not: either way it resumes)
        assert await asyncio.to_thread(serve.terminate) == 0, serve.log()
        for i in range(3):  # while no serve runs
            await producer.send(rid, text_update(f"c{i} "))
        await wait_logged(harness, rid, 9)
        serve = spawn_serve(harness.url, harness.ns.name, tmp_path, port=port)
        await serve.wait_serving()
        await producer.send(rid, text_update("d0"))
        await producer.end(rid)
        result = await asyncio.wait_for(following, 60)
    finally:
        serve.terminate()
    merged = (await Subscriber(harness.client, harness.ns.name).wait_for(rid, 30)).response
    return merged, result


def _got(result: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    assert not result["timedOut"], result
    assert all(event["data"] for event in result["events"]), "a message without data"
    return [(event["id"], json.loads(event["data"])) for event in result["events"]]


async def test_fetch_event_source_with_default_handlers_resumes_across_a_serve_restart(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    rid = "fes-restart"
    async with Harness(redis_url, namespace) as harness:
        await harness.start_worker()

        async def client(base: str) -> Any:
            return await run("fetch_event_source_client.mjs",
                             f"{base}/v1/turns/{rid}/events", token(rid), "45000", timeout=60)

        merged, result = await _stop_and_start_mid_turn(harness, tmp_path, rid, client)
    check_followed(_got(result), merged)
    assert merged["messages"][0]["contents"][0]["text"].startswith("a0 a1 a2 b0 b1 b2 c0")
    # one reconnection at least, with the last id it had
    assert len(result["requests"]) >= 2 and result["requests"][0] is None
    assert all(sent is not None for sent in result["requests"][1:])


async def test_eventsource_resumes_exactly_across_a_serve_restart(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    rid = "es-restart"
    async with Harness(redis_url, namespace) as harness:
        await harness.start_worker()

        async def client(base: str) -> Any:
            return await run("eventsource_client.mjs",
                             f"{base}/v1/turns/{rid}/events?token={token(rid)}", "45000",
                             timeout=60)

        merged, result = await _stop_and_start_mid_turn(harness, tmp_path, rid, client)
    got = _got(result)
    # EventSource reports the last id seen: an event without one (merged) repeats it
    own = [(ident if "seq" in data else None, data) for ident, data in got]
    check_followed(own, merged)
    assert len(result["requests"]) >= 2 and result["requests"][0] is None




async def test_a_stream_that_redis_fails_ends_as_a_broken_connection(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the terminal event (or ``gone``) ends a stream cleanly: one that a
    Redis failure ends is cut, so that a client with default handlers resumes."""

    async def redis_fails(self: EventStream, subscription: Any) -> None:
        raise redis.exceptions.ConnectionError("Redis went away")

    async with served(redis_url, namespace) as (_harness, serve):
        monkeypatch.setattr(EventStream, "follow", redis_fails)
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, f"{serve.url}/v1/turns/r/events",
                                       bearer("r"))
            with pytest.raises(aiohttp.ClientPayloadError):
                await stream.rest(10)

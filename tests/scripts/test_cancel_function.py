"""The ``cancel_turn`` Redis Function (processor/scripts/cancel_turn.lua,
docs/contract.md §6), called by ``Producer.cancel``, ``processor cancel`` and
``processor serve``: a bounded reason, a TTL always (a default, a maximum),
and a cancel already set is never shortened, replaced or deleted: the first
reason stays, the TTL becomes the longer of the two. Here as a caller that
may SET (an administrator; a worker carrying out a request is one too); the
least-privilege users are tests/deploy/test_acl*.py's."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from redis.exceptions import ResponseError
from support.records import init_namespace

from processor.client import Producer
from processor.scripts.library import Function
from processor.wire.cancels import DEFAULT_TTL, MAX_TTL, REASON_BYTES
from processor.wire.keys import Namespace
from processor.worker.cancel_requests import Refused, parse_request


async def _producer(client: Any, namespace: str) -> Producer:
    await init_namespace(client, namespace, 2)
    producer = Producer(client, namespace=namespace)
    await producer.ready()
    return producer


async def test_a_cancel_is_set_once_with_a_ttl_and_never_shortened(
    async_redis_client: Any, namespace: str
) -> None:
    client = async_redis_client
    producer = await _producer(client, namespace)
    key = producer.cancel_key("r1")
    assert await producer.cancel("r1", reason="user pressed stop") == "set"
    assert await client.get(key) == b"user pressed stop"
    assert DEFAULT_TTL * 1000 - 5000 < await client.pttl(key) <= DEFAULT_TTL * 1000
    # A second cancel keeps the first reason, and a shorter TTL changes nothing.
    assert await producer.cancel("r1", reason="second", ttl=1) == "kept"
    assert await client.get(key) == b"user pressed stop"
    assert await client.pttl(key) > (DEFAULT_TTL - 5) * 1000
    # A longer one lengthens it.
    assert await producer.cancel("r1", reason="third", ttl=MAX_TTL) == "kept"
    assert await client.get(key) == b"user pressed stop"
    assert await client.pttl(key) > (MAX_TTL - 5) * 1000
    # An administrator's plain SET without TTL stays without one.
    admin_key = producer.cancel_key("r2")
    await client.set(admin_key, "by hand")
    assert await producer.cancel("r2", reason="other") == "kept"
    assert (await client.get(admin_key), await client.pttl(admin_key)) == (b"by hand", -1)


async def test_out_of_bounds_is_refused_and_changes_nothing(
    async_redis_client: Any, namespace: str
) -> None:
    client = async_redis_client
    producer = await _producer(client, namespace)
    key = producer.cancel_key("r")
    for reason, ttl in (("x" * (REASON_BYTES + 1), 60), ("", 60), ("é" * 513, 60),
                        ("ok", 0), ("ok", MAX_TTL + 1), ("ok", -5)):
        with pytest.raises(ValueError, match="cancel"):
            await producer.cancel("r", reason=reason, ttl=ttl)
    assert await producer.cancel("r", reason="é" * 512, ttl=MAX_TTL) == "set"  # 1024 bytes
    with pytest.raises(ValueError, match="at most 512 characters"):
        await producer.cancel("x" * 513)
    with pytest.raises(ValueError, match="at most 512 characters"):
        await producer.cancel(None, turn_id="x" * 513)
    # The function checks the same bounds for whoever calls it past the client.
    function = Function(client, "cancel_turn")
    channel = Namespace(namespace).cancels
    for args in (["x" * (REASON_BYTES + 1), 60], ["", 60], ["ok", 0], ["ok", MAX_TTL + 1],
                 ["ok", "1.5"], ["ok", "soon"]):
        with pytest.raises(ResponseError, match="CANCELARG"):
            await function(keys=[producer.cancel_key("other")], args=[*args, channel])
    with pytest.raises(ResponseError, match="CANCELARG not a cancellation key"):
        await function(keys=[f"{{{namespace}:0}}:turn:x"], args=["ok", 60, channel])
    assert not await client.exists(producer.cancel_key("other"), f"{{{namespace}:0}}:turn:x")
    assert await client.get(key) == ("é" * 512).encode()


def test_a_worker_takes_only_well_formed_requests_of_its_namespace() -> None:
    ns = Namespace("agent", 4)
    key = ns.shard(3).cancel("r1")
    assert parse_request(ns, f'["{key}", "stop", 60]') == (key, "stop", 60)
    for bad in (b"\xff", "{}", "[1, 2]", '["{agent:9}:cancel:r", "stop", 60]',
                '["{other:0}:cancel:r", "stop", 60]', '["{agent:0}:turn:r", "stop", 60]',
                f'["{key}", "", 60]', f'["{key}", "{"x" * 1025}", 60]', f'["{key}", "s", 0]',
                f'["{key}", "s", 86401]', f'["{key}", "s", true]', f'["{key}", 5, 60]',
                f'["{ns.shard(0).cancel("x" * 513)}", "s", 60]', '["{agent:0}:cancel:", "s", 60]',
                "x" * 100_000):
        with pytest.raises(Refused):
            parse_request(ns, bad)


def test_processor_cancel_refuses_a_reason_or_ttl_out_of_bounds(redis_url: str,
                                                                namespace: str) -> None:
    for extra in (["--reason", "x" * 1025], ["--ttl", "0"], ["--ttl", str(MAX_TTL + 1)]):
        proc = subprocess.run(
            [sys.executable, "-m", "processor.cli", "cancel", "r", "--namespace", namespace,
             "--redis-url", redis_url, *extra],
            capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 2 and "processor cancel: a cancel" in proc.stderr, proc.stderr


async def test_refused_cancel_requests_are_counted_and_a_flood_logged_once(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Junk on the request channel is refused, each one counted in
    ``processor_cancel_requests_total{outcome="refused"}``, and a flood
    logged once (with how many) rather than once per message."""
    import logging

    import redis.asyncio

    from processor.worker.cancel_requests import CancelRequests
    from processor.worker.metrics import Metrics

    metrics = Metrics()
    client = redis.asyncio.Redis.from_url(redis_url)  # (a refusal sends it nothing)
    requests = CancelRequests(client, Namespace("agent", 4), metrics)
    with caplog.at_level(logging.WARNING, logger="processor.worker"):
        outcomes = [await requests.take(junk) for junk in (b"\xff", "{}", "x" * 100_000) * 100]
    await client.aclose()
    assert outcomes == ["refused"] * 300
    assert metrics.cancel_requests.labels("refused")._value.get() == 300
    refused = [r for r in caplog.records if r.getMessage() == "cancel requests refused"]
    assert len(refused) == 1 and refused[0].count == 1  # (the first; the rest within the minute)

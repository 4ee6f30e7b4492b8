"""/healthz and /readyz on the metrics port: readiness follows Redis (down,
then back) on a live ``processor run``; liveness follows the event loop (a
loop blocked past the stall limit answers 503 and recovers)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time

from support.scrape import fetch, get, scrape, wait_status
from support.turn_reference import simple_turn
from support.worker_harness import ROOT, Harness

from processor.embedded import free_port
from processor.host.health import Health, Server, groups_check
from processor.wire.keys import Namespace
from processor.worker.metrics import Metrics


async def test_readyz_fails_while_redis_is_down_and_recovers(
    make_redis_server, namespace, tmp_path
) -> None:
    server = make_redis_server()
    port = free_port()
    async with Harness(server.url, namespace, shards=2, log_dir=tmp_path) as harness:
        sub = harness.spawn(metrics_port=port, metrics_host="127.0.0.1", metrics_interval=0.2)
        await harness.wait_started([sub])
        assert await wait_status(port, "/readyz", 200) == "ok\n"
        assert await fetch(port, "/healthz") == (200, "ok\n")

        server.stop()
        body = await wait_status(port, "/readyz", 503)
        assert "redis unreachable" in body
        assert await fetch(port, "/healthz") == (200, "ok\n")  # alive, just not ready
        await asyncio.sleep(0.5)  # a few retries
        down = await scrape(port)
        assert down.total("processor_redis_errors_total") > 0
        assert down.value("processor_redis_retries_total") > 0

        server.start()  # same port; its data is gone, so the worker recreates the groups
        # ... and says for a while that the namespace's state was lost (a
        # Redis without persistence), while it works on.
        body = await wait_status(port, "/readyz", 503, timeout=30,
                                 matching="state in Redis was lost")
        assert "published as state_lost" in body
        await harness.add(simple_turn("after-outage", 3))
        await harness.wait_merged(1)
        assert sub.proc.poll() is None
        assert harness.terminate(sub) == 0


async def test_healthz_answers_503_while_the_loop_is_stuck() -> None:
    health = Health(Metrics(), stall_seconds=1.0)
    server = Server(health, 0, "127.0.0.1").start()
    beat = asyncio.create_task(health.beat(every=0.05))
    try:
        await asyncio.sleep(0.2)
        assert await fetch(server.port, "/healthz") == (200, "ok\n")
        seen: list[tuple[int, str]] = []
        probe = threading.Thread(target=lambda: (time.sleep(1.5), seen.append(
            get(server.port, "/healthz"))))
        probe.start()
        time.sleep(2.0)  # block the event loop, as a stuck worker would
        probe.join()
        assert seen[0][0] == 503
        assert "event loop stalled" in seen[0][1]
        await asyncio.sleep(0.2)  # the heartbeat runs again
        assert await fetch(server.port, "/healthz") == (200, "ok\n")
        heartbeat = (await scrape(server.port)).value("processor_loop_heartbeat_seconds")
        assert abs(heartbeat - time.time()) < 5
    finally:
        beat.cancel()
        server.close()


async def test_readyz_needs_every_shards_group(async_redis_client, namespace) -> None:
    ns = Namespace(namespace, 3)
    health = Health(Metrics())
    server = Server(health, 0, "127.0.0.1").start()
    try:
        assert await fetch(server.port, "/readyz") == (503, "starting\n")
        health.ready_check = groups_check(async_redis_client, ns, "processor")
        health.loop = asyncio.get_running_loop()
        status, body = await fetch(server.port, "/readyz")
        assert status == 503 and "shard 0" in body  # no stream at all yet
        for shard in ns.all()[:2]:
            await async_redis_client.xgroup_create(shard.updates, "processor", mkstream=True)
        await async_redis_client.xgroup_create(ns.shard(2).updates, "other", mkstream=True)
        assert await fetch(server.port, "/readyz") == (
            503, "shard 2: consumer group 'processor' missing\n")
        await async_redis_client.xgroup_create(ns.shard(2).updates, "processor")
        assert await fetch(server.port, "/readyz") == (200, "ok\n")
    finally:
        server.close()


def test_a_busy_metrics_port_is_a_clear_startup_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "processor.cli", "run", "--redis-url", "redis://127.0.0.1:1",
             "--metrics-port", str(port), "--metrics-host", "127.0.0.1"],
            capture_output=True, text=True, timeout=30, cwd=ROOT,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"processor run: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    ]

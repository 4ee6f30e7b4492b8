"""The long-running side of the CLI: starting a worker (with an embedded
Redis when no URL is given), signal handling, and one-shot Redis commands."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from typing import Any

from redis.exceptions import NoPermissionError

from processor import config, logs, stopping
from processor.connections import RedisOptions, connect, connect_retrying, redact
from processor.health import Health, Server, groups_check
from processor.metrics import Metrics, Sampler
from processor.worker import Worker

log = logging.getLogger("processor.service")


def start_embedded() -> Any:
    """Start a private redis-server and say where (the contract's embedded default)."""
    from processor.embedded import EmbeddedRedis

    server = EmbeddedRedis().start()
    print(
        f"processor: no --redis-url or REDIS_URL given; started an embedded redis-server "
        f"{server.version} at {server.url} (temporary: its data goes when processor exits)",
        file=sys.stderr,
        flush=True,
    )
    return server


#: Tracked allocations (less frees) between generation-0 passes (Python: 700).
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
    """Freeze what start-up created (modules, classes), so full cyclic GC
    passes never walk it again, and raise the generation-0 threshold from
    700 to :data:`GC_GEN0_THRESHOLD`.

    Why the threshold: the count that triggers a pass is tracked objects
    allocated less those freed, and a batch's transient objects (the reply's
    lists and tuples, each decoded update's contents list, the per-entry
    tuples) are all alive until the batch is done: about 3,000 at 500 entries
    a batch, so with 700 every batch ran several passes over objects that
    were about to be freed anyway (about 5% of a worker's CPU, measured with
    ``gc.callbacks``). At 10,000 a batch's peak stays under it and nearly no
    pass runs; each that does walks at most 10,000 young objects (under
    1 ms measured). Generations 1 and 2 keep Python's defaults: objects that
    really live on (turn state) still get collected as often as before."""
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


async def run_worker(values: dict[str, Any]) -> int:
    """Run one worker until SIGTERM/SIGINT; 0 after a clean drain. A signal
    that came before the worker existed (even before the event loop did, see
    processor/stopping.py) stops it as soon as it does."""
    stop = stopping.attach(asyncio.get_running_loop())
    tune_gc()
    logs.set_payloads(values["log_payloads"])
    for name in config.unknown_env():  # not extra={"name": ...}: a LogRecord field
        log.warning("unknown environment variable ignored", extra={"variable": name})
    metrics = Metrics()
    health = Health(metrics, stall_seconds=values["health_stall"])
    try:
        server = serve_metrics(values, health)
    except OSError as exc:
        print(f"processor run: cannot serve metrics on {values['metrics_host']}:"
              f"{values['metrics_port']}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    background = [asyncio.create_task(health.beat())] if server else []
    embedded = None
    url = values["redis_url"]
    if not url:
        embedded = start_embedded()
        url = embedded.url
    options = RedisOptions(
        url, values["ssl_ca_certs"], values["ssl_certfile"], values["ssl_keyfile"]
    )
    try:
        log.info("connecting", extra={"url": redact(url), "namespace": values["namespace"]})
        client = await connect_retrying(options, stop)
        if client is None:  # stopped while connecting: nothing was read
            log.info("stopped cleanly")
            return 0
        worker = Worker(client, config.worker_config(values), metrics)
        stop.on_stop(worker.stop)
        if server:
            health.ready_check = groups_check(client, worker.namespace, worker.config.group)
            sampler = Sampler(client, worker.namespace, worker.config.group, metrics,
                              values["metrics_interval"])
            background.append(asyncio.create_task(sampler.run()))
        await worker.run()
        await client.aclose()
        log.info("stopped cleanly", extra={"turns_settled": metrics.settled_by_source()})
        return 0
    finally:
        for task in background:
            task.cancel()
        if server:
            server.close()
        if embedded is not None:
            embedded.close()


def serve_metrics(values: dict[str, Any], health: Health) -> Server | None:
    """Start the metrics/health server when a metrics port is set."""
    if not values["metrics_port"]:
        return None
    server = Server(health, values["metrics_port"], values["metrics_host"]).start()
    log.info("serving metrics", extra={"host": values["metrics_host"], "port": server.port,
                                       "paths": ["/metrics", "/healthz", "/readyz"]})
    return server


async def cancel(url: str, args: argparse.Namespace) -> int:
    """``processor cancel``: SET the cancellation key with a TTL (via the client,
    so the CLI and producers route the key the same way)."""
    from processor.client import Producer
    from processor.ids import response_id_for_turn
    from processor.tool_shell import redis_options

    if args.turn_id and args.response_id != response_id_for_turn(args.turn_id):
        print(
            f"processor cancel: turn_id {args.turn_id!r} has the ResponseId "
            f"{response_id_for_turn(args.turn_id)!r}, not {args.response_id!r}",
            file=sys.stderr,
        )
        return 2
    client = await connect(redis_options(url, args))
    try:
        producer = Producer(client, namespace=args.namespace, shards=args.shards)
        rid = None if args.turn_id else args.response_id
        await producer.cancel(rid, reason=args.reason, ttl=args.ttl, turn_id=args.turn_id)
        key = producer.cancel_key(rid, turn_id=args.turn_id)
        print(f"cancelled {args.response_id} ({key}, ttl {args.ttl}s)")
        return 0
    finally:
        await client.aclose()


async def init_groups(values: dict[str, Any]) -> int:
    """``processor init``: create every shard's stream and consumer group (idempotent),
    so that autoscalers reading the group (KEDA) find it before any worker ran."""
    options = RedisOptions(
        values["redis_url"], values["ssl_ca_certs"], values["ssl_certfile"], values["ssl_keyfile"]
    )
    client = await connect_retrying(options)
    try:
        worker = Worker(client, config.worker_config(values))  # the worker's own ensure_groups
        try:
            await worker.ensure_groups()
        except NoPermissionError as exc:
            print(f"processor init: redis refused to create the groups: {exc}", file=sys.stderr)
            return 1
        streams = [shard.updates for shard in worker.namespace.all()]
        print(f"consumer group {values['group']!r} ready on {len(streams)} stream(s): "
              + ", ".join(streams))
        return 0
    finally:
        await client.aclose()

"""The long-running side of ``processor serve``: connect, read, listen, and
stop cleanly on SIGTERM/SIGINT (open streams end; their clients reconnect to
another replica and resume from their last id)."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from dataclasses import replace

from aiohttp import web

from processor import logs, stopping
from processor.client.source import LogSource
from processor.redis_io.client import RedisClient
from processor.redis_io.connections import connect_retrying
from processor.redis_io.options import redact
from processor.scripts.meta import Mismatch, NamespaceError, require
from processor.serve.app import make_app
from processor.serve.cache import TurnCache
from processor.serve.config import ServeConfig, unknown_env
from processor.serve.edge import Server
from processor.serve.gate import RedisGate
from processor.serve.guard import PENDING, GuardedRunner, PendingConnections, in_request
from processor.serve.hub import Hub
from processor.serve.metrics import ServeMetrics

log = logging.getLogger("processor.serve")

#: Seconds the stop waits for requests other than streams to finish.
SHUTDOWN_TIMEOUT = 5.0


def build(config: ServeConfig, client: RedisClient) -> tuple[web.Application, Server]:
    """The application on a connected client (also what the tests run)."""
    metrics = ServeMetrics()
    hub = Hub(client, config.namespace, metrics)
    gate = RedisGate(config.redis_connections, metrics.redis_wait)
    past = LogSource(client, config.namespace, config.read_budget, metrics.over_budget.inc)
    source = TurnCache(past, hub, gate, metrics, config.turn_cache)
    server = Server(config, client, hub, source, metrics, gate=gate)
    app = make_app(server)
    app[PENDING] = PendingConnections(config.header_timeout, config.max_pending, metrics)
    app.middlewares.insert(0, in_request)
    return app, server


def pool_size(config: ServeConfig) -> int:
    """Redis connections the process may hold: the requests' slots, one
    blocking reader per shard, and a few more (a reader reconnecting)."""
    return config.redis_connections + config.namespace.shards + 4


def make_site(runner: web.AppRunner, config: ServeConfig) -> web.TCPSite:
    """Where ``make_runner``'s runner listens. Its backlog (connections
    the kernel holds until they are accepted, at most ``net.core.somaxconn``)
    is ``--max-pending``: a burst of reconnects past the default of 128 had
    its SYNs dropped and retried after 1, 3, 7 s..."""
    return web.TCPSite(runner, config.host, config.port, backlog=config.max_pending)


def make_runner(app: web.Application) -> web.AppRunner:
    """The runner of ``build``'s app: no access log (a browser's token
    is in its URL), connections not in a request bounded
    (processor/serve/guard.py). Handlers are not cancelled when their
    client goes (a stream notices at its next write, a heartbeat at the
    latest): a Redis call is never cancelled (see processor.serve.app.uncancelled)."""
    return GuardedRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)


async def serve(config: ServeConfig) -> int:
    """Serve until SIGTERM/SIGINT; 0 after a clean stop, 2 when the port is taken."""
    stop = stopping.attach(asyncio.get_running_loop())
    for name in unknown_env():
        log.warning("unknown environment variable ignored", extra={"variable": name})
    if config.token_secret is None:
        log.warning("authentication is off (--no-auth): anyone who can reach the port reads "
                    "and cancels every turn")
    log.info("connecting", extra={"url": redact(config.redis.url),
                                  "namespace": config.namespace.name})
    client = await connect_retrying(config.redis, stop, max_connections=pool_size(config))
    if client is None:
        return 0
    try:  # the namespace's shard count, from its record (processor.scripts.meta)
        meta = await require(client, config.namespace.name,
                             config.namespace.shards if config.shards_from else None,
                             config.shards_from)
    except NamespaceError as exc:
        print(f"processor serve: {exc}", file=sys.stderr)
        await client.aclose()
        return 2 if isinstance(exc, Mismatch) else 1
    config = replace(config, namespace=meta.keys)
    pool = getattr(client, "connection_pool", None)  # (a cluster's node pools keep theirs)
    if pool is not None:  # the record's shard count may exceed --shards'
        pool.max_connections = max(pool.max_connections, pool_size(config))
    app, server = build(config, client)
    runner = make_runner(app)
    await runner.setup()
    try:
        site = make_site(runner, config)
        try:
            await site.start()
        except OSError as exc:
            print(f"processor serve: cannot listen on {config.host}:{config.port}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 2
        server.hub.start()
        log.info("serving", extra={
            "host": config.host, "port": bound_port(runner),
            "namespace": config.namespace.name, "shards": config.namespace.shards,
            "auth": config.token_secret is not None, "cors_origins": list(config.cors_origins),
        })
        await stop.requested.wait()
        log.info("stopping")
        await server.hub.close()  # ends every stream: their clients resume elsewhere
    finally:
        await runner.cleanup()
        await client.aclose()
    log.info("stopped cleanly")
    return 0


def bound_port(runner: web.AppRunner) -> int:
    """The port the site listens on (the one the OS chose for ``--port 0``)."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return 0


def main(config: ServeConfig) -> int:
    logs.setup(config.log_level, fmt=config.log_format, libraries=True)
    try:
        return asyncio.run(serve(config))
    except socket.gaierror as exc:
        print(f"processor serve: cannot listen on {config.host}: {exc}", file=sys.stderr)
        return 2

"""The long-running side of the CLI: starting a worker (with an embedded
Redis when no URL is given), signal handling, and one-shot Redis commands."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError

from processor import logs, stopping
from processor.host import config
from processor.host.groups import check_groups
from processor.host.health import Health, Server, groups_check
from processor.host.progress_log import log_progress
from processor.redis_io.connections import (
    TRANSIENT,
    connect_retrying,
    until_done,
)
from processor.redis_io.options import RedisOptions, redact
from processor.redis_io.replies import as_text
from processor.scripts import library
from processor.scripts.meta import Meta, Mismatch, check, create, drain_problems, reshard
from processor.worker.metrics import Metrics
from processor.worker.sampler import Sampler
from processor.worker.worker import Worker

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

log = logging.getLogger("processor.host")


def start_embedded() -> Any:
    """Start a private redis-server and say where (docs/contract.md §8's embedded default)."""
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
    700 to ``GC_GEN0_THRESHOLD``.

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


async def open_namespace(client: RedisClient, values: dict[str, Any], given: Mapping[str, str],
                         stop: stopping.Stop | None = None) -> Meta | None:
    """The namespace's record (processor.scripts.meta), written with these values if
    there is none yet; ``values`` then take its shards (and its group, unless
    one is given: ``other_group``). A shard count given explicitly
    (``given``: flag or environment) that disagrees raises
    ``Mismatch``. None when stopped first."""
    def give_up() -> bool:
        return stop is not None and stop.requested.is_set()

    def retry(exc: BaseException | None) -> None:
        log.warning("redis unavailable, retrying", extra={"error": repr(exc)})

    try:
        meta: Meta = await until_done(create, client, values["namespace"], values["shards"],
                                      values["group"], give_up=give_up, on_retry=retry)
    except TRANSIENT:
        if give_up():
            return None
        raise
    check(meta, values["shards"] if "shards" in given else None, given.get("shards", ""))
    values["shards"] = meta.shards
    if "group" not in given:
        values["group"] = meta.group
    return meta


def other_group(meta: Meta, values: dict[str, Any], given: Mapping[str, str]) -> str | None:
    """Why a worker given another consumer group than the namespace's record
    names must not start (one line), or None; ``--allow-other-groups`` lets it."""
    if "group" not in given or values["allow_other_groups"]:
        return None
    try:
        check(meta, group=values["group"], group_from=given["group"])
    except Mismatch as exc:
        return f"{exc} (--allow-other-groups starts it anyway)"
    return None


async def run_worker(values: dict[str, Any], given: Mapping[str, str] | None = None) -> int:
    """Run one worker until SIGTERM/SIGINT; 0 after a clean drain. A signal
    that came before the worker existed (even before the event loop did, see
    processor/stopping.py) stops it as soon as it does. ``given``: the
    options given explicitly (``processor.host.config.given``); the others
    the namespace's record may override (shards, group)."""
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
        try:
            meta = await open_namespace(client, values, given or {}, stop)
        except (Mismatch, NoPermissionError) as exc:
            print(f"processor run: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, Mismatch) else 1
        if meta is None:
            log.info("stopped cleanly")
            return 0
        worker = Worker(client, config.worker_config(values), metrics)
        stop.on_stop(worker.stop)
        refused = await check_groups(client, worker.namespace, worker.config.group,
                                     values["allow_other_groups"], stop.requested.is_set)
        refused = refused or other_group(meta, values, given or {})
        if refused is not None:  # (before the worker creates its own group)
            print(f"processor run: {refused}", file=sys.stderr)
            await client.aclose()
            return 2
        if server:
            health.ready_check = groups_check(client, worker.namespace, worker.config.group,
                                              worker.readiness)
        # Also without a metrics port: the sampler is what logs a shard whose ids went bad.
        sampler = Sampler(client, worker.namespace, worker.config.group, metrics,
                          values["metrics_interval"])
        background.append(asyncio.create_task(sampler.run()))
        if values["log_interval"]:
            background.append(asyncio.create_task(
                log_progress(metrics, sampler, values["log_interval"])))
        await worker.run()
        await client.aclose()
        if worker.fatal:
            print(f"processor run: {worker.fatal}", file=sys.stderr)
            return 1
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


def cancel(args: argparse.Namespace) -> int:
    """``processor cancel``: set the cancellation key with a TTL (via the client's
    ``cancel_turn`` function, so the CLI and producers route and bound the key
    the same way)."""
    from processor.client import CancelNotTaken, LibraryNotLoaded, Producer
    from processor.host.tool_shell import fail, run_tool
    from processor.wire.cancels import check_reason, check_ttl
    from processor.wire.ids import TurnKey, response_id_for_turn
    from processor.wire.keys import Namespace

    if args.turn_id and args.response_id != response_id_for_turn(args.turn_id):
        return fail("cancel", f"turn_id {args.turn_id!r} has the ResponseId "
                    f"{response_id_for_turn(args.turn_id)!r}, not {args.response_id!r}", 2)
    try:
        check_reason(args.reason)
        check_ttl(args.ttl)
    except ValueError as exc:
        return fail("cancel", str(exc), 2)

    async def body(client: RedisClient, keys: Namespace) -> int:
        # A turn that has ended (its done marker, kept --done-ttl) is left alone.
        # A user who may not read the marker cancels without this check.
        done = keys.shard_for(args.turn_id or args.response_id).done(
            TurnKey(args.response_id).encode())
        try:
            status = await client.hget(done, "status")
        except NoPermissionError:
            status = None
        if status is not None:
            print(f"{args.response_id} had already ended ({as_text(status)}): nothing to cancel")
            return 0
        producer = Producer(client, namespace=keys.name, shards=keys.shards)
        rid = None if args.turn_id else args.response_id
        try:
            outcome = await producer.cancel(rid, reason=args.reason, ttl=args.ttl,
                                            turn_id=args.turn_id)
        except (CancelNotTaken, LibraryNotLoaded) as exc:
            return fail("cancel", str(exc), 1)
        key = producer.cancel_key(rid, turn_id=args.turn_id)
        if outcome == "kept":
            print(f"{args.response_id} was cancelled already ({key}): its reason kept, "
                  f"its TTL at least {args.ttl}s")
        else:
            print(f"cancelled {args.response_id} ({key}, ttl {args.ttl}s)")
        return 0

    return run_tool("cancel", args, body)


async def init_groups(values: dict[str, Any], given: Mapping[str, str] | None = None,
                      resharding: bool = False) -> int:
    """``processor init``: write the namespace's record if there is none
    (processor.scripts.meta), then create every shard's stream and consumer group
    (idempotent), so that autoscalers reading the group (KEDA) find it
    before any worker ran, and load the producers' function library
    (``processor.scripts.library``). With ``resharding`` (``--reshard``) an
    explicit ``--shards`` that differs from the record changes it, once
    every shard is drained and no worker is live (docs/cluster.md)."""
    given = given or {}
    if resharding and "shards" not in given:
        print("processor init: --reshard needs --shards (or PROCESSOR_SHARDS)", file=sys.stderr)
        return 2
    options = RedisOptions(
        values["redis_url"], values["ssl_ca_certs"], values["ssl_certfile"], values["ssl_keyfile"]
    )
    client = await connect_retrying(options, give_up_after=values["connect_timeout"],
                                    prog="processor init")
    try:
        try:
            meta = await create(client, values["namespace"], values["shards"], values["group"])
            if resharding and meta.shards != values["shards"]:
                status = await _reshard(client, meta, values)
                if status:
                    return status
            else:
                check(meta, values["shards"] if "shards" in given else None,
                      given.get("shards", ""), values["group"] if "group" in given else None,
                      given.get("group", ""))
        except Mismatch as exc:
            print(f"processor init: {exc}", file=sys.stderr)
            return 2
        except NoPermissionError as exc:
            print(f"processor init: redis refused the namespace's record: {exc}",
                  file=sys.stderr)
            return 1
        values = {**values, "shards": values["shards"] if resharding else meta.shards,
                  "group": meta.group}
        worker = Worker(client, config.worker_config(values))  # the worker's own ensure_groups
        try:
            await worker.ensure_groups()
        except NoPermissionError as exc:
            print(f"processor init: redis refused to create the groups: {exc}", file=sys.stderr)
            return 1
        try:
            functions = await library.load(client)
        except NoPermissionError as exc:
            print(f"processor init: redis refused to load the producers' function library "
                  f"{library.library_name()}: {exc}", file=sys.stderr)
            return 1
        streams = [shard.updates for shard in worker.namespace.all()]
        print(f"namespace {values['namespace']!r}: {values['shards']} shard(s) (record "
              f"{worker.namespace.meta}); consumer group {values['group']!r} ready on "
              f"{len(streams)} stream(s): " + ", ".join(streams))
        print(f"producers' function library {library.library_name()} loaded" if functions
              else "redis has no functions (before 7.0): producers run their script with EVALSHA")
        return 0
    finally:
        await client.aclose()


async def _reshard(client: RedisClient, meta: Meta, values: dict[str, Any]) -> int:
    """Change the record's shard count; 0 when done, else the exit status
    after saying why not (a shard not drained, a worker live, a race)."""
    problems = await drain_problems(client, meta, int(values["worker_ttl"] * 1000))
    for problem in problems:
        print(f"processor init: cannot reshard {meta.namespace!r} from {meta.shards} to "
              f"{values['shards']} shard(s): {problem}", file=sys.stderr)
    if problems:
        print("processor init: stop the producers, wait until `processor stats` shows every "
              "shard drained, stop the workers, then run this again (docs/cluster.md)",
              file=sys.stderr)
        return 1
    if not await reshard(client, meta, values["shards"]):
        print(f"processor init: the record of {meta.namespace!r} changed meanwhile: "
              "run this again", file=sys.stderr)
        return 1
    log.info("namespace resharded", extra={"namespace": meta.namespace, "from": meta.shards,
                                           "to": values["shards"]})
    print(f"namespace {meta.namespace!r} resharded from {meta.shards} to {values['shards']} "
          "shard(s)")
    return 0

"""``processor`` options: one table feeds the flags, the environment
variables (``PROCESSOR_<NAME>``, plus ``REDIS_URL``), ``--help`` and the
validation that reports every problem on its own line before start.
``processor run`` takes every option; ``init`` and the operator tools take
the few they use (``INIT_OPTIONS``, ``TOOL_OPTIONS``), from the
same table, read when the command runs (never while the parser is built).
The mechanism, shared with ``processor serve``, is processor/host/options.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Mapping
from typing import Any

from processor.engine.lifecycle import Limits
from processor.host import options
from processor.host.options import (
    LOG_FORMAT,
    LOG_LEVEL,
    NAMESPACE,
    SHARDS,
    SSL_CA_CERTS,
    SSL_CERTFILE,
    SSL_KEYFILE,
    Option,
)
from processor.host.options import flag as _flag
from processor.host.options import number as _number
from processor.wire import defaults as D
from processor.worker.config import WorkerConfig, default_consumer

OPTIONS: tuple[Option, ...] = (
    NAMESPACE,
    SHARDS,
    Option("group", str, D.GROUP, "consumer group on each updates stream of a new "
           "namespace, kept in its record like --shards (one per namespace: a worker "
           "refuses to start with another, or while another group reads its streams)"),
    Option("allow_other_groups", _flag, False, "start even when another consumer group reads "
           "the namespace's streams, or its record names another group (each group then "
           "applies every entry; docs/operations.md, --group)"),
    Option("consumer", str, None, "consumer name (default: host-pid-random, unique per process)"),
    Option("turn_timeout", _number, D.TURN_TIMEOUT,
           "seconds without an entry before a turn times out",
           0.01),
    Option("progress", _flag, True, "publish each running turn's live progress (its "
           "synthesis.chunk, reasoning.chunk, tool_call.chunk, tool_result and step events, "
           "coalesced per read batch) and its live log for processor serve; --no-progress "
           "publishes only synthesis.started and the outcome"),
    Option("live_interval_ms", int, D.LIVE_INTERVAL_MS, "least ms between two live progress "
           "publishes of one running turn: its updates in between are coalesced into the "
           "next (at most this much later; a turn's last events always go with its outcome); "
           "0 publishes every read batch", 0),
    Option("live_interval_max_ms", int, D.LIVE_INTERVAL_MAX_MS, "most ms the live interval "
           "stretches to while the worker reads behind its producers: a running turn then "
           "publishes at most once per the read's lag (the age of the newest entry read), up "
           "to this, its first publish too (unless --live-interval-ms is 0); at or below "
           "--live-interval-ms it never stretches", 0),
    Option("agui", _flag, False, "also write each turn as AG-UI 1.0 events to {ns:s}:agui"),
    Option("batch", int, D.BATCH, "entries read per XREADGROUP call", 1),
    Option("block_ms", int, D.BLOCK_MS,
           "XREADGROUP BLOCK time in ms (also the idle sweep pace)", 1),
    Option("sweep_interval", _number, D.SWEEP_INTERVAL,
           "seconds between sweeps for timeouts and cancels", 0.01),
    Option("reclaim_idle_ms", int, D.RECLAIM_IDLE_MS,
           "reclaim entries pending this long (dead worker)", 1),
    Option("no_affinity", _flag, False, "every worker reads every shard, instead of the "
           "live workers splitting the shards between them (shard affinity)"),
    Option("worker_ttl", _number, D.WORKER_TTL,
           "seconds a worker that stopped beating still counts "
           "as live, and a stalled shard owner is waited for, before the others read its "
           "shards", 0.5),
    Option("max_deliveries", int, D.MAX_DELIVERIES,
           "deliveries before an entry goes to the DLQ", 1),
    Option("max_entry_bytes", int, D.MAX_ENTRY_BYTES, "largest entry accepted (too_large)", 1),
    Option("max_turn_updates", int, D.MAX_TURN_UPDATES, "updates per turn before turn_limit", 1),
    Option("max_turn_bytes", int, D.MAX_TURN_BYTES, "bytes per turn before turn_limit", 1),
    Option("merged_maxlen", int, D.MERGED_MAXLEN, "approximate cap of each merged stream", 1),
    Option("events_maxlen", int, D.EVENTS_MAXLEN, "approximate cap of each events stream", 1),
    Option("dlq_maxlen", int, D.DLQ_MAXLEN, "approximate cap of each dlq stream", 1),
    Option("done_ttl", int, D.DONE_TTL, "seconds a finished turn is remembered (dedup)", 1),
    Option("metrics_port", int, 0, "serve /metrics, /healthz and /readyz on this port "
           "(0 = off)", 0, 65535),
    Option("metrics_host", str, "0.0.0.0", "address the metrics port listens on"),
    Option("metrics_interval", _number, 5.0, "seconds between samples of lag, pending, active "
           "turns, DLQ length and bad stream ids per shard", 0.1),
    Option("health_stall", _number, 30.0, "/healthz answers 503 once the event loop has not "
           "run for this many seconds", 1),
    Option("compact_threshold", int, D.COMPACT_THRESHOLD,
           "stored records of a turn before they are folded into one snapshot (0 = never)", 0),
    Option("mirror_turns", int, D.MIRROR_TURNS, "turns per shard whose merge the worker also keeps "
           "in memory, to publish them without reading their records back (0 = none)", 0),
    Option("hold_turns", _flag, D.HOLD_TURNS, "keep each turn's entries pending and merged in this "
           "worker's memory until the turn ends, then publish and ack them in one step; "
           "--no-hold-turns stores a record of every entry in Redis as it is read instead "
           "(docs/design.md, Held turns)"),
    Option("hold_ms", int, D.HOLD_MS, "a turn held this long is handed to the "
           "stored path (the stream keeps every entry since the oldest held one; held "
           "entries' idle time is reset every third of --reclaim-idle-ms)", 1),
    LOG_LEVEL,
    LOG_FORMAT,
    Option("log_interval", _number, 60.0, "seconds between progress lines in the log at "
           "info: turns published, entries applied, their rates, dead letters, lag "
           "(0 = none)", 0),
    Option("log_payloads", _flag, False, "debug aid: also log the merged text of each turn "
           "(user data; off by default, never in production)"),
    SSL_CA_CERTS,
    SSL_CERTFILE,
    SSL_KEYFILE,
    Option("connect_timeout", _number, 10.0, "processor init only: seconds to keep retrying "
           "an unreachable Redis before giving up with exit status 1", 0),
)

#: The options of the operator tools (stats, tail, dlq, cancel, capture).
TOOL_OPTIONS = ("namespace", "shards", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
#: The options ``processor init`` uses.
INIT_OPTIONS = ("namespace", "shards", "group", "connect_timeout", "log_level", "log_format",
                "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
#: The options ``processor run`` takes: all but init's own.
RUN_OPTIONS = tuple(opt.name for opt in OPTIONS if opt.name != "connect_timeout")


def add_options(
    parser: argparse.ArgumentParser, names: Collection[str] | None = None
) -> None:
    """Add ``--redis-url`` and the options ``names`` (default: every option of
    ``processor run``) as flags; values stay strings until ``resolve``."""
    embedded = " Without one, an embedded redis-server is started." if names is None else ""
    parser.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help="Redis URL (env REDIS_URL); rediss:// for TLS; any Cluster node works."
        + embedded,
    )
    for opt in OPTIONS:
        if opt.name in (RUN_OPTIONS if names is None else names):
            add_option(parser, opt.name)


def add_option(parser: argparse.ArgumentParser, name: str) -> None:
    """Add the option ``name`` of the table as a flag."""
    options.add_option(parser, next(opt for opt in OPTIONS if opt.name == name))


def resolve(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Flags win over environment variables, which win over D.
    Returns the values and one message per invalid option. An option the
    command does not take (no attribute of ``args``) has its default: its
    variable is not read."""
    values, problems = options.resolve(args, OPTIONS, env)
    return values, problems + options.connection_checks(values)


def given(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The options given explicitly, by a flag or an environment variable,
    each with where it came from (``--shards``, ``PROCESSOR_SHARDS``): a
    default is not explicit, and a value the namespace's record holds
    (shards, group: processor.scripts.meta) is taken from the record instead."""
    return options.given(args, OPTIONS, env)


def unknown_env(env: Mapping[str, str] | None = None) -> list[str]:
    """``PROCESSOR_*`` variables that name no option (a typo is otherwise silent)."""
    return options.unknown_env(OPTIONS, env)


def worker_config(values: Mapping[str, Any]) -> WorkerConfig:
    """The ``WorkerConfig`` of resolved option values."""
    limits = Limits(
        max_entry_bytes=values["max_entry_bytes"],
        max_turn_updates=values["max_turn_updates"],
        max_turn_bytes=values["max_turn_bytes"],
        turn_timeout=values["turn_timeout"],
    )
    return WorkerConfig(
        namespace=values["namespace"],
        shards=values["shards"],
        group=values["group"],
        consumer=values["consumer"] or default_consumer(),
        limits=limits,
        progress=values["progress"],
        live_interval_ms=values["live_interval_ms"],
        live_interval_max_ms=values["live_interval_max_ms"],
        agui=values["agui"],
        batch=values["batch"],
        block_ms=values["block_ms"],
        sweep_interval=values["sweep_interval"],
        reclaim_idle_ms=values["reclaim_idle_ms"],
        max_deliveries=values["max_deliveries"],
        affinity=not values["no_affinity"],
        worker_ttl=values["worker_ttl"],
        merged_maxlen=values["merged_maxlen"],
        events_maxlen=values["events_maxlen"],
        dlq_maxlen=values["dlq_maxlen"],
        done_ttl=values["done_ttl"],
        compact_threshold=values["compact_threshold"],
        mirror_turns=values["mirror_turns"],
        hold_turns=values["hold_turns"],
        hold_ms=values["hold_ms"],
    )

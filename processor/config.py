"""``processor`` options: one table feeds the flags, the environment
variables (``PROCESSOR_<NAME>``, plus ``REDIS_URL``), ``--help`` and the
validation that reports every problem on its own line before start.
``processor run`` takes every option; ``init`` and the operator tools take
the few they use (:data:`INIT_OPTIONS`, :data:`TOOL_OPTIONS`), from the
same table, read when the command runs (never while the parser is built).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from processor.connections import redact
from processor.lifecycle import Limits
from processor.worker import WorkerConfig, default_consumer


@dataclass(frozen=True)
class Option:
    name: str  # flag without dashes, underscores for dashes
    kind: Callable[[str], Any]
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "PROCESSOR_" + self.name.upper()


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


#: What a kind is called in an error line.
_KIND_NAMES = {_flag: "true or false", _number: "a number", int: "an integer", str: "text"}


OPTIONS: tuple[Option, ...] = (
    Option("namespace", str, "agent", "key namespace <ns>; two namespaces never share a key"),
    Option("shards", int, 1, "number of shards S of a new namespace; a namespace keeps "
           "the count its record ({ns:0}:meta) got when it was created, and a different "
           "value is refused (docs/cluster.md: changing it)", 1),
    Option("group", str, "processor", "consumer group on each updates stream of a new "
           "namespace, kept in its record like --shards (one per namespace: a worker "
           "refuses to start with another, or while another group reads its streams)"),
    Option("allow_other_groups", _flag, False, "start even when another consumer group reads "
           "the namespace's streams, or its record names another group (each group then "
           "applies every entry; README, --group)"),
    Option("consumer", str, None, "consumer name (default: host-pid-random, unique per process)"),
    Option("turn_timeout", _number, 300.0, "seconds without an entry before a turn times out",
           0.01),
    Option("progress", _flag, False, "publish progress events (synthesis.chunk, step)"),
    Option("agui", _flag, False, "also write each turn as AG-UI 1.0 events to {ns:s}:agui"),
    Option("batch", int, 500, "entries read per XREADGROUP call", 1),
    Option("block_ms", int, 100, "XREADGROUP BLOCK time in ms (also the idle sweep pace)", 1),
    Option("sweep_interval", _number, 0.1, "seconds between sweeps for timeouts and cancels", 0.01),
    Option("reclaim_idle_ms", int, 30_000, "reclaim entries pending this long (dead worker)", 1),
    Option("no_affinity", _flag, False, "every worker reads every shard, instead of the "
           "live workers splitting the shards between them (shard affinity)"),
    Option("worker_ttl", _number, 5.0, "seconds a worker that stopped beating still counts "
           "as live, and a stalled shard owner is waited for, before the others read its "
           "shards", 0.5),
    Option("max_deliveries", int, 5, "deliveries before an entry goes to the DLQ", 1),
    Option("max_entry_bytes", int, 1 << 20, "largest entry accepted (too_large)", 1),
    Option("max_turn_updates", int, 100_000, "updates per turn before turn_limit", 1),
    Option("max_turn_bytes", int, 64 << 20, "bytes per turn before turn_limit", 1),
    Option("merged_maxlen", int, 100_000, "approximate cap of each merged stream", 1),
    Option("events_maxlen", int, 1_000_000, "approximate cap of each events stream", 1),
    Option("dlq_maxlen", int, 100_000, "approximate cap of each dlq stream", 1),
    Option("done_ttl", int, 86_400, "seconds a finished turn is remembered (dedup)", 1),
    Option("metrics_port", int, 0, "serve /metrics, /healthz and /readyz on this port "
           "(0 = off)", 0, 65535),
    Option("metrics_host", str, "0.0.0.0", "address the metrics port listens on"),
    Option("metrics_interval", _number, 5.0, "seconds between samples of lag, pending, active "
           "turns, DLQ length and bad stream ids per shard", 0.1),
    Option("health_stall", _number, 30.0, "/healthz answers 503 once the event loop has not "
           "run for this many seconds", 1),
    Option("compact_threshold", int, 256,
           "stored records of a turn before they are folded into one snapshot (0 = never)", 0),
    Option("mirror_turns", int, 10_000, "turns per shard whose merge the worker also keeps "
           "in memory, to publish them without reading their records back (0 = none)", 0),
    Option("hold_turns", _flag, True, "keep each turn's entries pending and merged in this "
           "worker's memory until the turn ends, then publish and ack them in one step; "
           "--no-hold-turns stores a record of every entry in Redis as it is read instead "
           "(docs/design.md, Held turns; no effect with --progress)"),
    Option("hold_ms", int, 5000, "a turn held this long is handed to the "
           "stored path (the stream keeps every entry since the oldest held one; held "
           "entries' idle time is reset every third of --reclaim-idle-ms)", 1),
    Option("log_level", str, "info", "debug, info, warning or error"),
    Option("log_interval", _number, 60.0, "seconds between progress lines in the log at "
           "info: turns published, entries applied, their rates, dead letters, lag "
           "(0 = none)", 0),
    Option("log_payloads", _flag, False, "debug aid: also log the merged text of each turn "
           "(user data; off by default, never in production)"),
    Option("ssl_ca_certs", str, None, "CA bundle for rediss:// URLs"),
    Option("ssl_certfile", str, None, "client certificate for rediss:// URLs"),
    Option("ssl_keyfile", str, None, "client key for rediss:// URLs"),
    Option("connect_timeout", _number, 60.0, "processor init only: seconds to keep retrying "
           "an unreachable Redis before giving up with exit status 1", 0),
)

#: The options of the operator tools (stats, tail, dlq, cancel, capture).
TOOL_OPTIONS = ("namespace", "shards", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
#: The options ``processor init`` uses.
INIT_OPTIONS = ("namespace", "shards", "group", "connect_timeout", "log_level",
                "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
#: The options ``processor run`` takes: all but init's own.
RUN_OPTIONS = tuple(opt.name for opt in OPTIONS if opt.name != "connect_timeout")


def add_options(
    parser: argparse.ArgumentParser, names: Collection[str] | None = None
) -> None:
    """Add ``--redis-url`` and the options ``names`` (default: every option of
    ``processor run``) as flags; values stay strings until :func:`resolve`."""
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
    opt = next(opt for opt in OPTIONS if opt.name == name)
    if opt.kind is _flag:
        parser.add_argument(
            opt.flag,
            action="store_const",
            const="true",
            default=None,
            help=f"{opt.help} (env {opt.env}{', on by default' if opt.default else ''})",
        )
        if opt.default:  # an option on by default can be turned off by a flag too
            parser.add_argument(
                "--no-" + opt.flag[2:], dest=opt.name, action="store_const",
                const="false", help=f"turn {opt.flag} off (env {opt.env}=0)",
            )
    else:
        default = "" if opt.default is None else f", default {opt.default}"
        parser.add_argument(
            opt.flag,
            default=None,
            metavar=opt.name.upper(),
            help=f"{opt.help} (env {opt.env}{default})",
        )


def resolve(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Flags win over environment variables, which win over defaults.
    Returns the values and one message per invalid option. An option the
    command does not take (no attribute of ``args``) has its default: its
    variable is not read."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {"redis_url": args.redis_url or env.get("REDIS_URL") or None}
    problems: list[str] = []
    for opt in OPTIONS:
        raw, source = _given(opt, args, env)
        if raw is None:
            values[opt.name] = opt.default
            continue
        problem = _check(opt, raw)
        if problem:
            problems.append(f"{source}: {problem}")
            continue
        values[opt.name] = opt.kind(raw)
    problems += _cross_checks(values)
    return values, problems


def _given(opt: Option, args: argparse.Namespace,
           env: Mapping[str, str]) -> tuple[str | None, str]:
    """The raw value of ``opt`` and where it came from (its flag, or its
    environment variable); None when neither gives one (the default). An
    option the command does not take (no attribute of ``args``) has none:
    its variable is not read."""
    raw = getattr(args, opt.name, None)
    if raw is None and opt.env in env and hasattr(args, opt.name):
        return env[opt.env], opt.env
    return raw, opt.flag


def given(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The options given explicitly, by a flag or an environment variable,
    each with where it came from (``--shards``, ``PROCESSOR_SHARDS``): a
    default is not explicit, and a value the namespace's record holds
    (shards, group: processor.meta) is taken from the record instead."""
    env = os.environ if env is None else env
    found = {}
    for opt in OPTIONS:
        raw, source = _given(opt, args, env)
        if raw is not None:
            found[opt.name] = source
    return found


def _check(opt: Option, raw: str) -> str | None:
    """Why ``raw`` is not a valid value of ``opt``, or None."""
    try:
        value = opt.kind(raw)
    except ValueError:
        return f"expected {_KIND_NAMES.get(opt.kind, opt.kind.__name__)}, got {raw!r}"
    if opt.minimum is not None and value < opt.minimum:
        return f"must be at least {opt.minimum:g}, got {raw!r}"
    if opt.maximum is not None and value > opt.maximum:
        return f"must be at most {opt.maximum:g}, got {raw!r}"
    return None


def _cross_checks(values: Mapping[str, Any]) -> list[str]:
    """Problems that involve an option's meaning rather than its type."""
    problems = []
    if str(values["log_level"]).lower() not in ("debug", "info", "warning", "error"):
        problems.append(
            f"log level must be debug, info, warning or error, got {values['log_level']!r}"
        )
    url = values["redis_url"]
    if url:
        problems += _url_problems(url)
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        path = values[name]
        if path and not os.path.isfile(path):
            problems.append(f"--{name.replace('_', '-')}: no such file {path!r}")
    if values["ssl_keyfile"] and not values["ssl_certfile"]:
        problems.append("--ssl-keyfile needs --ssl-certfile")
    return problems


def _url_problems(url: str) -> list[str]:
    """What is wrong with a Redis URL (named with its password masked)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return [f"redis URL {redact(url)} must start with redis://, rediss:// or unix://"]
    try:
        _ = urlsplit(url).port  # raises when the port is not one
    except ValueError as exc:  # not a number, or out of range
        return [f"redis URL {redact(url)}: {exc}"]
    return []


def unknown_env(env: Mapping[str, str] | None = None) -> list[str]:
    """``PROCESSOR_*`` variables that name no option (a typo is otherwise silent)."""
    env = os.environ if env is None else env
    known = {opt.env for opt in OPTIONS}
    return sorted(name for name in env if name.startswith("PROCESSOR_") and name not in known)


def worker_config(values: Mapping[str, Any]) -> WorkerConfig:
    """The :class:`WorkerConfig` of resolved option values."""
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

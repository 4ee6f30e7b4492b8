"""``processor serve`` options: one table (processor/host/options.py's mechanism)
feeds the flags, the ``PROCESSOR_*`` variables, ``--help`` and the checks
that report each problem on its own line before start."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass

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
    flag,
    number,
)
from processor.redis_io.options import RedisOptions
from processor.serve.tokens import MIN_SECRET_LENGTH
from processor.wire.defaults import MAX_TURN_BYTES
from processor.wire.keys import Namespace

OPTIONS: tuple[Option, ...] = (
    NAMESPACE,
    SHARDS,
    Option("host", str, "0.0.0.0", "address to listen on"),
    Option("port", int, 8080, "port to listen on (0: any free port, logged at start)", 0, 65535),
    Option("token_secret", str, None, "secret that signs the turn tokens (at least "
           f"{MIN_SECRET_LENGTH} characters; the same on every replica and in the backend that "
           "mints tokens; prefer the variable: a flag shows in the process list)"),
    Option("no_auth", flag, False, "serve every turn to anyone who can reach the port, "
           "without tokens (development only; said at warning level at start)"),
    Option("cors_origins", str, "", "comma-separated origins browsers may call from "
           "(e.g. https://app.example.com), or * for any; none by default"),
    Option("heartbeat", number, 15.0, "seconds of silence after which a stream gets a "
           "': ping' comment (keeps proxies from closing idle streams)", 0.05),
    Option("client_queue", int, 1000, "events queued for one stream before its client is "
           "dropped as too slow (it is told its resume id)", 1),
    Option("write_timeout", number, 10.0, "seconds a write to a client may block before the "
           "client is dropped as too slow", 0.1),
    Option("redis_connections", int, 64, "requests whose Redis calls run at once; the others "
           "wait their turn (a burst of joins waits instead of failing; the connection pool "
           "holds this many plus one per shard and 4)", 1, 10_000),
    Option("header_timeout", number, 10.0, "seconds a connection may take to send a whole "
           "request's headers, from its accept or its previous request's end (slow-header "
           "attacks are cut here)", 0.1),
    Option("max_pending", int, 4096, "connections not in a request (headers on the way, or "
           "idle between requests) kept at once, past it the oldest is closed; also the listen "
           "backlog (keep it above the reconnect burst a replica may get)", 1),
    Option("turn_cache", number, 1.0, "seconds a turn's past read from Redis is shared: "
           "repeated joins, resumes and GETs of one turn cost Redis about one read of it per "
           "this many seconds (0: each request reads, still shared while one is waiting)", 0),
    Option("read_budget", int, MAX_TURN_BYTES, "bytes one read of a turn's past may make "
           "Redis send (its live log, or the events a resume of a finished turn missed; the "
           "workers' default --max-turn-bytes); past it the client gets what stays exact, the "
           "merged response at the end", 4096),
    LOG_LEVEL,
    LOG_FORMAT,
    SSL_CA_CERTS,
    SSL_CERTFILE,
    SSL_KEYFILE,
)

_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+$")


@dataclass(frozen=True)
class ServeConfig:
    redis: RedisOptions
    namespace: Namespace
    host: str
    port: int
    token_secret: str | None  # None: --no-auth
    cors_origins: tuple[str, ...]  # ("*",): any origin
    heartbeat: float
    client_queue: int
    write_timeout: float
    log_level: str
    log_format: str = "auto"  # --log-format (processor.logs.formatter)
    # Where --shards came from ("" when not given): the namespace's record
    # says the count (processor.scripts.meta), a given one is checked against it.
    shards_from: str = ""
    redis_connections: int = 64
    header_timeout: float = 10.0
    max_pending: int = 4096
    turn_cache: float = 1.0
    read_budget: int = MAX_TURN_BYTES


def add_options(parser: argparse.ArgumentParser) -> None:
    options.add_options(parser, OPTIONS, "Redis URL (env REDIS_URL); rediss:// for TLS; any "
                        "Cluster node works")


def resolve(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> tuple[ServeConfig | None, list[str]]:
    """The configuration, or None and one line per problem."""
    values, problems = options.resolve(args, OPTIONS, env)  # a value with a problem is absent
    given = options.given(args, OPTIONS, env)
    problems += options.connection_checks(values)  # (these options are text: always present)
    if not values["redis_url"]:
        problems.append("give --redis-url or set REDIS_URL (serve never starts an embedded "
                        "Redis: it reads what the workers write)")
    secret = values["token_secret"]
    no_auth = values.get("no_auth", False)
    if not no_auth:
        if not secret:
            problems.append("give --token-secret or set PROCESSOR_TOKEN_SECRET, or --no-auth to "
                            "serve every turn without tokens")
        elif len(secret) < MIN_SECRET_LENGTH:
            problems.append(f"--token-secret must be at least {MIN_SECRET_LENGTH} characters, "
                            f"got {len(secret)}")
    origins = tuple(o.strip() for o in str(values["cors_origins"]).split(",") if o.strip())
    if "*" in origins and len(origins) > 1:
        problems.append("--cors-origins: * allows every origin and cannot be listed with others")
    bad = [o for o in origins if o != "*" and not _ORIGIN.match(o.rstrip("/"))]
    if bad:
        problems.append(f"--cors-origins: not an origin (scheme://host[:port]): {bad[0]!r}")
    if problems:
        return None, problems
    return ServeConfig(
        redis=RedisOptions(values["redis_url"], values["ssl_ca_certs"], values["ssl_certfile"],
                           values["ssl_keyfile"]),
        namespace=Namespace(values["namespace"], values["shards"]),
        host=values["host"],
        port=values["port"],
        token_secret=None if no_auth else secret,
        cors_origins=tuple(o.rstrip("/") for o in origins),
        heartbeat=values["heartbeat"],
        client_queue=values["client_queue"],
        write_timeout=values["write_timeout"],
        log_level=values["log_level"],
        log_format=values["log_format"],
        shards_from=given.get("shards", ""),
        redis_connections=values["redis_connections"],
        header_timeout=values["header_timeout"],
        max_pending=values["max_pending"],
        turn_cache=values["turn_cache"],
        read_budget=values["read_budget"],
    ), []


def unknown_env(env: Mapping[str, str] | None = None) -> list[str]:
    return options.unknown_env(OPTIONS, env)

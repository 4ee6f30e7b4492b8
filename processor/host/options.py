"""Options of a long-running command from one table: each ``Option``
is a flag, an environment variable (``PROCESSOR_<NAME>``, plus ``REDIS_URL``
for ``--redis-url``) and a line of ``--help``; ``resolve`` reports every
invalid value on its own line before anything starts.

``processor run`` (processor/host/config.py) and ``processor serve``
(processor/serve/config.py) each have a table; the options both take (the
namespace, the shards, the log level and the TLS files) are defined here
once. Nothing here knows a worker or a server.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from processor.logs import FORMATS
from processor.redis_io.options import redact
from processor.wire.keys import DEFAULT_NAMESPACE


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


def flag(text: str) -> bool:
    """The kind of an on/off option."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def number(text: str) -> float:
    """The kind of a finite number."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


#: What a kind is called in an error line.
KIND_NAMES = {flag: "true or false", number: "a number", int: "an integer", str: "text"}

# The options every long-running command shares.
NAMESPACE = Option("namespace", str, DEFAULT_NAMESPACE,
                   "key namespace <ns>; two namespaces never share a key")
SHARDS = Option("shards", int, 1, "number of shards S of a new namespace; a namespace keeps "
                "the count its record ({ns:0}:meta) got when it was created, and a different "
                "value is refused (docs/cluster.md: changing it)", 1)
LOG_LEVEL = Option("log_level", str, "info", "debug, info, warning or error")
LOG_FORMAT = Option("log_format", str, "auto", "json (one object a line), text (one line for "
                    "a person) or auto: text when stderr is a terminal, else json")
SSL_CA_CERTS = Option("ssl_ca_certs", str, None, "CA bundle for rediss:// URLs")
SSL_CERTFILE = Option("ssl_certfile", str, None, "client certificate for rediss:// URLs")
SSL_KEYFILE = Option("ssl_keyfile", str, None, "client key for rediss:// URLs")


def add_options(parser: argparse.ArgumentParser, options: Iterable[Option],
                redis_url_help: str) -> None:
    """Add ``--redis-url`` and every option as a flag (values stay strings
    until ``resolve``)."""
    parser.add_argument("--redis-url", default=None, metavar="URL", help=redis_url_help)
    for opt in options:
        add_option(parser, opt)


def add_option(parser: argparse.ArgumentParser, opt: Option) -> None:
    """Add one option as a flag (and ``--no-...`` for one on by default)."""
    if opt.kind is flag:
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
    args: argparse.Namespace, options: Iterable[Option], env: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Flags win over environment variables, which win over defaults.
    Returns the values and one message per value of the wrong kind or range
    (checks of what values mean are the caller's). An option the command
    does not take (no attribute of ``args``) has its default: its variable
    is not read."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {"redis_url": args.redis_url or env.get("REDIS_URL") or None}
    problems: list[str] = []
    for opt in options:
        raw, source = _raw(opt, args, env)
        if raw is None:
            values[opt.name] = opt.default
            continue
        problem = check(opt, raw)
        if problem:
            problems.append(f"{source}: {problem}")
            continue
        values[opt.name] = opt.kind(raw)
    return values, problems


def _raw(opt: Option, args: argparse.Namespace,
         env: Mapping[str, str]) -> tuple[str | None, str]:
    """The raw value of ``opt`` and where it came from (its flag, or its
    environment variable); None when neither gives one (the default). An
    option the command does not take (no attribute of ``args``) has none:
    its variable is not read."""
    raw = getattr(args, opt.name, None)
    if raw is None and opt.env in env and hasattr(args, opt.name):
        return env[opt.env], opt.env
    return raw, opt.flag


def given(args: argparse.Namespace, options: Iterable[Option],
          env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Of ``options``, those given by a flag or an environment variable, each
    with where it came from (``--shards``, ``PROCESSOR_SHARDS``)."""
    env = os.environ if env is None else env
    found = {}
    for opt in options:
        raw, source = _raw(opt, args, env)
        if raw is not None:
            found[opt.name] = source
    return found


def check(opt: Option, raw: str) -> str | None:
    """Why ``raw`` is not a valid value of ``opt``, or None."""
    try:
        value = opt.kind(raw)
    except ValueError:
        return f"expected {KIND_NAMES.get(opt.kind, opt.kind.__name__)}, got {raw!r}"
    if opt.minimum is not None and value < opt.minimum:
        return f"must be at least {opt.minimum:g}, got {raw!r}"
    if opt.maximum is not None and value > opt.maximum:
        return f"must be at most {opt.maximum:g}, got {raw!r}"
    return None


def connection_checks(values: Mapping[str, Any]) -> list[str]:
    """Problems with the shared options' meaning: the log level, the Redis
    URL's scheme and the TLS files."""
    problems = []
    if str(values["log_level"]).lower() not in ("debug", "info", "warning", "error"):
        problems.append(
            f"log level must be debug, info, warning or error, got {values['log_level']!r}"
        )
    if values.get("log_format", "auto") not in FORMATS:
        problems.append(f"--log-format must be {', '.join(FORMATS[:-1])} or {FORMATS[-1]}, "
                        f"got {values['log_format']!r}")
    url = values["redis_url"]
    if url:
        problems += url_problems(url)
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        path = values[name]
        if path and not os.path.isfile(path):
            problems.append(f"--{name.replace('_', '-')}: no such file {path!r}")
    if values["ssl_keyfile"] and not values["ssl_certfile"]:
        problems.append("--ssl-keyfile needs --ssl-certfile")
    return problems


def url_problems(url: str) -> list[str]:
    """What is wrong with a Redis URL (named with its password masked)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return [f"redis URL {redact(url)} must start with redis://, rediss:// or unix://"]
    try:
        _ = urlsplit(url).port  # raises when the port is not one
    except ValueError as exc:  # not a number, or out of range
        return [f"redis URL {redact(url)}: {exc}"]
    return []


def unknown_env(options: Iterable[Option], env: Mapping[str, str] | None = None) -> list[str]:
    """``PROCESSOR_*`` variables that name no option (a typo is otherwise silent)."""
    env = os.environ if env is None else env
    known = {opt.env for opt in options}
    return sorted(name for name in env if name.startswith("PROCESSOR_") and name not in known)

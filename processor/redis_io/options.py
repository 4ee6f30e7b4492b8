"""How to reach Redis, and a URL safe to print: what the command line and
the configuration need before any connection, without importing redis-py
(``processor --help``, ``schema`` or a bad option start in a fraction of
the time; processor.redis_io.connections connects)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

__all__ = ["RedisOptions", "redact"]


@dataclass(frozen=True)
class RedisOptions:
    """How to reach Redis. ``socket_timeout`` must exceed the XREADGROUP BLOCK."""

    url: str
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    socket_timeout: float = 10.0


def redact(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors)."""
    parts = urlsplit(url)
    if "password=" in parts.query:  # redis-py also takes ?password=...
        query = "&".join("password=***" if p.startswith("password=") else p
                         for p in parts.query.split("&"))
        parts = parts._replace(query=query)
    if parts.password is None:
        return urlunsplit(parts)
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]  # as written, even with a port that is no number
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))

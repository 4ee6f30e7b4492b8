"""What goes wrong starting an embedded redis-server."""

from __future__ import annotations


class EmbeddedRedisError(RuntimeError):
    """The embedded redis-server could not be started or stopped."""


class RedisServerNotFoundError(EmbeddedRedisError):
    """No redis-server binary could be found."""

"""Shared fixtures: private real Redis servers (see ``redis_servers.py``)."""

from redis_servers import (
    async_redis_client,
    make_redis_cluster,
    make_redis_server,
    namespace,
    redis_client,
    redis_cluster,
    redis_server,
    redis_url,
    tls_files,
)

__all__ = [
    "async_redis_client",
    "make_redis_cluster",
    "make_redis_server",
    "namespace",
    "redis_client",
    "redis_cluster",
    "redis_server",
    "redis_url",
    "tls_files",
]

"""Shared fixtures: private real Redis servers (see ``support/redis_servers.py``),
one with the shipped ACL users (``support/acl_users.py``), and the suite's
Hypothesis settings."""

from hypothesis import settings
from support.acl_users import acl_server
from support.redis_servers import (
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
    "acl_server",
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

# No per-example deadline: the suite's 4 processes share 2 cores with the
# workers and servers they start, and a pure property's example can take 10x
# its usual time there (Hypothesis's 200 ms deadline failed a correct test).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

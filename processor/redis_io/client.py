"""The Redis client every part of the service takes: redis-py's asyncio
client, or its Cluster client when the URL names a cluster (``connect``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.typing import KeyT, StreamIdT

RedisClient: TypeAlias = "Redis | RedisCluster"
#: A Lua script registered on that client (``client.register_script``).
Script: TypeAlias = AsyncScript


def streams_arg(positions: Mapping[str, str] | Mapping[str, StreamIdT]) -> dict[KeyT, StreamIdT]:
    """``XREAD``'s streams (key -> the id to read after) as redis-py types
    the argument (a ``dict`` is invariant in its key type)."""
    return cast(dict[KeyT, StreamIdT], dict(positions))


def ids_arg(ids: Sequence[str]) -> list[StreamIdT]:
    """Entry ids (``XCLAIM``'s) as redis-py types the argument."""
    return list(ids)

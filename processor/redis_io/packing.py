"""Commands packed by hiredis (C), as redis-py's synchronous client packs
them, instead of by redis-py's asyncio packer (Python).

The asyncio packer joins each argument onto the command's buffer, copying
the buffer once per argument, and costs the worker several times what
hiredis does for every command (an ``XREADGROUP`` about 20 µs against 3:
at a small batch per read, as many live turns make, a part of every
update's cost). ``hiredis.pack_command`` writes
the same bytes for what our calls send (str, bytes, int, float; checked by
``tests/redis_io/test_packing.py``); anything else (a bytearray, or a type no
command takes) goes to redis-py's packer, which packs it or raises its
``DataError``, as a client without this would. ``connect`` gives its
clients, single node or cluster, these connections.
"""

from __future__ import annotations

from typing import Any, TypeVar

import hiredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection

_python_pack = AbstractConnection.pack_command


def _pack_command(self: AbstractConnection, *args: Any) -> list[bytes]:
    """``AbstractConnection.pack_command``, by hiredis."""
    first = args[0]
    # (A command name of several words, 'CONFIG GET': redis-py sends them apart.)
    if (" " in first) if isinstance(first, str) else (b" " in first):
        return _python_pack(self, *args)
    try:
        return [hiredis.pack_command(args)]
    except TypeError:
        return _python_pack(self, *args)


_PACKED: dict[type, type] = {}
_C = TypeVar("_C", bound=AbstractConnection)


def packed_by_hiredis(cls: type[_C]) -> type[_C]:
    """``cls`` (a redis-py asyncio connection class: plain, TLS or Unix
    socket) with its commands packed by hiredis; one class per ``cls``."""
    packed = _PACKED.get(cls)
    if packed is None:
        packed = _PACKED[cls] = type(f"Hiredis{cls.__name__}", (cls,),
                                     {"pack_command": _pack_command})
    return packed


def pack_cluster_by_hiredis(client: RedisCluster) -> None:
    """A cluster client's connections, to the nodes it knows and to those it
    finds later, packed by hiredis (redis-py's cluster client takes no
    connection class of ours: its nodes are made from its connection
    settings)."""
    manager = client.nodes_manager
    settings = manager.connection_kwargs
    settings["connection_class"] = packed_by_hiredis(settings.get("connection_class", Connection))
    for node in (*manager.startup_nodes.values(), *manager.nodes_cache.values()):
        node.connection_class = packed_by_hiredis(node.connection_class)

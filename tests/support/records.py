"""Writing a namespace's record ({ns:0}:meta, processor/scripts/meta.py) in a test,
as ``processor init`` or the first worker would: producers, subscribers and
the operator tools read the shard count from it, and refuse to work on a
namespace that has none."""

from __future__ import annotations

import uuid
from typing import Any

from processor.scripts import meta, source
from processor.wire.keys import DEFAULT_GROUP, Namespace


async def init_namespace(client: Any, namespace: str, shards: int = 1,
                         group: str = DEFAULT_GROUP) -> meta.Meta:
    """The namespace's record, written with these values if it has none (asyncio client)."""
    return await meta.create(client, namespace, shards, group)


def init_namespace_sync(client: Any, namespace: str, shards: int = 1,
                        group: str = DEFAULT_GROUP) -> None:
    """``init_namespace`` with a synchronous client."""
    script = client.register_script(source("create_namespace"))
    script(keys=[Namespace(namespace).meta], args=[shards, group, uuid.uuid4().hex])

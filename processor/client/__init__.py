"""The client side of the wire contract: producers send updates, subscribers read outputs.

``Producer`` writes input entries (docs/contract.md §3) to the right shard,
idempotently and with retries (``inbox=True``: through the shard's inbox, which
workers admit into the stream: the path of the least-privilege ``producer`` ACL
user); it also sets and reads cancellation keys
(section 6) so a generator can stop when its turn is cancelled.
``Subscriber`` follows the ``merged`` and ``events`` streams of every
shard (section 5), resumable from the positions it reports, and waits for the
merged response of one turn. A send to a turn that has ended raises
``TurnEnded``; one on a Redis 7 where no worker or ``processor init``
has loaded the producers' functions yet, ``LibraryNotLoaded``. A cancel
asked of the workers (a user that may not set cancel keys) that none carried
out in time raises ``CancelNotTaken``.

Both take an asyncio Redis client: ``redis.asyncio.Redis`` or
``redis.asyncio.cluster.RedisCluster`` (see ``processor.redis_io.connections.connect``),
and read the namespace's shard count from its record in Redis
(``processor.scripts.meta``; ``NotInitialised`` before any worker or
``processor init`` wrote it)::

    producer = Producer(client)
    await producer.stream("resp_1", agent.run_stream("hi"))
    item = await Subscriber(client).wait_for("resp_1", timeout=60)
    response = item.agent_response()
"""

# A package of one module per concern (entries, producer, errors, watch, items,
# subscriber, retry); this module keeps every name `processor.client` had. Names outside __all__
# are re-exported with `as` so that `import *` offers exactly what it did before.
from processor.client.entries import CORRELATION_IDS as CORRELATION_IDS
from processor.client.entries import Encoding as Encoding
from processor.client.entries import Sent
from processor.client.entries import encode_update as encode_update
from processor.client.errors import CancelNotTaken, TurnEnded
from processor.client.items import EntryItem, EventItem, Item, MergedItem
from processor.client.producer import AUTO_IDEMPOTENCY_TTL as AUTO_IDEMPOTENCY_TTL
from processor.client.producer import Producer
from processor.client.retry import RetryPolicy
from processor.client.subscriber import STREAMS as STREAMS
from processor.client.subscriber import Subscriber
from processor.client.watch import CancelWatch
from processor.scripts.library import LibraryNotLoaded
from processor.scripts.meta import Mismatch, NamespaceError, NotInitialised

__all__ = [
    "CancelNotTaken",
    "CancelWatch",
    "EntryItem",
    "EventItem",
    "Item",
    "LibraryNotLoaded",
    "MergedItem",
    "Mismatch",
    "NamespaceError",
    "NotInitialised",
    "Producer",
    "RetryPolicy",
    "Sent",
    "Subscriber",
    "TurnEnded",
]

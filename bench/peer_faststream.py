"""The peer: the same job written the way a FastStream user would write it.

A FastStream ``RedisRouter`` with one batch stream subscriber
(``StreamSub(..., group=..., consumer=..., batch=True, max_records=500)``):
FastStream reads with XREADGROUP and XACKs each batch after the handler
returns (its default ack policy). The handler keeps each turn's updates in a
Redis hash (``HSET <turn> <entry id> <update JSON>``, one pipeline per
batch); on a turn's ``end`` it reads the hash back (one pipeline for every
turn the batch ended), merges with Agent Framework's own
``AgentResponse.from_updates`` (what a user of Agent Framework has at hand),
and publishes the merged response to the output stream and deletes the hash
(one more pipeline). Three round trips per batch plus FastStream's read and
ack: as batched as a careful user would make it.

Run as a process, like a worker::

    python bench/peer_faststream.py REDIS_URL STREAM MERGED_STREAM [--group G]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from agent_framework import AgentResponse, AgentResponseUpdate
from faststream import FastStream
from faststream.redis import RedisBroker, RedisRouter, StreamSub
from faststream.redis.annotations import Redis, RedisBatchStreamMessage


def make_app(url: str, stream: str, merged: str, group: str, batch: int) -> FastStream:
    broker = RedisBroker(url, log_level=30)
    router = RedisRouter()
    consumer = f"peer-{os.getpid()}"
    sub = StreamSub(stream, group=group, consumer=consumer, batch=True, max_records=batch,
                    polling_interval=100)

    @router.subscriber(stream=sub)
    async def on_updates(entries: list[dict[str, Any]], msg: RedisBatchStreamMessage,
                         redis: Redis) -> None:
        ids = msg.raw_message["message_ids"]
        ended: list[str] = []
        async with redis.pipeline(transaction=False) as pipe:
            for entry_id, fields in zip(ids, entries, strict=True):
                rid = fields["response_id"]
                if fields.get("kind") == "end":
                    ended.append(rid)
                else:
                    pipe.hset(f"peer:turn:{rid}", entry_id, fields["update"])
            await pipe.execute()
        if not ended:
            return
        async with redis.pipeline(transaction=False) as pipe:
            for rid in ended:
                pipe.hgetall(f"peer:turn:{rid}")
            states = await pipe.execute()
        async with redis.pipeline(transaction=False) as pipe:
            for rid, state in zip(ended, states, strict=True):
                updates = [AgentResponseUpdate.from_dict(json.loads(state[k]))
                           for k in sorted(state, key=_id_order)]
                response = AgentResponse.from_updates(updates)
                body = {"response_id": rid, "status": "completed",
                        "response": response.to_dict()}
                await broker.publish(body, stream=merged, pipeline=pipe)
                pipe.delete(f"peer:turn:{rid}")
            await pipe.execute()

    broker.include_router(router)
    return FastStream(broker)


def _id_order(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("stream")
    parser.add_argument("merged")
    parser.add_argument("--group", default="processor")
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    app = make_app(args.url, args.stream, args.merged, args.group, args.batch)
    app.after_startup(lambda: print("ready", flush=True))
    asyncio.run(app.run())


if __name__ == "__main__":
    main()

"""Demo producer for docker-compose's ``demo`` profile: streams agent turns
into the shard streams the workers read, then prints how each turn merged.

Each turn is ``processor demo``'s two-agent handoff with a tool call, sent
the way an Agent Framework producer would (``processor.client.Producer``).
Configured like the worker: ``REDIS_URL`` and ``PROCESSOR_NAMESPACE`` (flags
win); the shard count is the namespace's record's (``--shards`` or
``PROCESSOR_SHARDS`` only check it). ``--inbox`` (or ``PRODUCER_INBOX=1``)
sends through the shards' inboxes, as the least-privilege ``producer`` ACL
user must (docs/security.md); without it, entries are XADDed
(``producer-trusted``). Exit status 0 once every turn merged as
``completed``, 1 otherwise.

    python deploy/demo_producer.py --turns 5 --interval 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

from processor.cli.demo import HANDOFF
from processor.client import Producer, Subscriber
from processor.redis_io.connections import RedisOptions, connect, redact


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--namespace", default=os.environ.get("PROCESSOR_NAMESPACE", "agent"))
    shards = os.environ.get("PROCESSOR_SHARDS")
    parser.add_argument("--shards", type=int, default=int(shards) if shards else None,
                        help="check the namespace's shard count (default: its record's)")
    parser.add_argument("--turns", type=int, default=10, help="turns to send (0 = forever)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between turns")
    parser.add_argument("--timeout", type=float, default=60.0, help="wait per merged turn")
    parser.add_argument("--inbox", action="store_true",
                        default=os.environ.get("PRODUCER_INBOX", "") not in ("", "0"),
                        help="send through the shards' inboxes (Producer(inbox=True)): what "
                        "the least-privilege producer ACL user needs (env PRODUCER_INBOX=1)")
    args = parser.parse_args(argv)
    if not args.redis_url:
        parser.error("give --redis-url or set REDIS_URL")
    return args


async def send_turn(producer: Producer, response_id: str) -> None:
    for update in HANDOFF:
        await producer.send(response_id, update, ids={"thread_id": f"thread-{response_id}"})
    await producer.end(response_id)


def response_text(response: dict) -> str:
    """The text of a merged response (without agent-framework, which the image lacks)."""
    return " ".join(
        content["text"]
        for message in response.get("messages", [])
        for content in message.get("contents", [])
        if content.get("type") == "text"
    )


async def main(args: argparse.Namespace) -> int:
    client = await connect(RedisOptions(args.redis_url))
    producer = Producer(client, namespace=args.namespace, shards=args.shards, inbox=args.inbox)
    subscriber = Subscriber(client, namespace=args.namespace, shards=args.shards)
    print(f"producing to {redact(args.redis_url)} namespace {args.namespace!r}", flush=True)
    failed = sent = 0
    try:
        while args.turns == 0 or sent < args.turns:
            response_id = f"demo-{uuid.uuid4().hex[:12]}"
            await send_turn(producer, response_id)
            sent += 1
            merged = await subscriber.wait_for(response_id, timeout=args.timeout)
            text = response_text(merged.response)
            print(f"{response_id}: {merged.status}: {text[:80]}", flush=True)
            failed += merged.status != "completed"
            await asyncio.sleep(args.interval)
    except TimeoutError as exc:
        print(f"demo producer: no merged response: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.aclose()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))

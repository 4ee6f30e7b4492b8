"""``processor demo``: two workers and a simulated producer on an embedded Redis.

The producer streams three turns the way Agent Framework agents would: a
handoff between two agents with a tool call (their updates interleaved), a
turn the user cancels half-way, and a turn whose model fails. The demo then
prints each merged response and the events a UI would have seen.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from processor.client import Producer
from processor.engine.lifecycle import Limits
from processor.redis_io.connections import RedisOptions, connect
from processor.service.run import start_embedded
from processor.wire.keys import Namespace
from processor.worker.worker import Worker, WorkerConfig

NAMESPACE = "demo"


def _update(text: str | None = None, *, kind: str = "text", **fields: Any) -> dict[str, Any]:
    content: dict[str, Any] = {"type": kind}
    if text is not None:
        content["text"] = text
    content.update(fields.pop("content", {}))
    return {"type": "agent_response_update", "contents": [content], "role": "assistant", **fields}


def _alice(text: str | None = None, **kw: Any) -> dict[str, Any]:
    return _update(text, response_id="run-alice", author_name="alice", agent_id="triage", **kw)


def _bob(text: str, **kw: Any) -> dict[str, Any]:
    return _update(
        text, response_id="run-bob", author_name="bob", agent_id="billing", message_id="bob-1", **kw
    )


HANDOFF: list[dict[str, Any]] = [
    _alice("The user asks about an invoice; ", kind="text_reasoning"),
    _alice("billing should handle it.", kind="text_reasoning"),
    _alice(
        kind="function_call",
        message_id="al-1",
        content={"call_id": "c1", "name": "handoff_to_billing", "arguments": '{"reason": '},
    ),
    _alice(
        kind="function_call",
        message_id="al-1",
        content={"call_id": "c1", "arguments": '"invoice"}'},
    ),
    {
        **_alice(
            kind="function_result",
            message_id="al-2",
            content={"call_id": "c1", "result": "transferred"},
        ),
        "role": "tool",
        "author_name": None,
    },
    _bob("Hi, I'm Bob from billing. "),
    _alice("Handing you to Bob now.", message_id="al-3"),
    _bob("Your invoice #42 was paid on May 3."),
    _update(
        kind="usage",
        content={"usage_details": {"input_token_count": 120, "output_token_count": 38}},
        finish_reason="stop",
    ),
]


async def _produce(producer: Producer) -> None:
    for update in HANDOFF:
        await producer.send("demo-handoff", update, ids={"thread_id": "thread-1"})
        await asyncio.sleep(0.01)
    await producer.end("demo-handoff")
    for word in ("Let ", "me ", "write ", "a "):
        await producer.send("demo-cancel", _update(word, message_id="m1"))
    await asyncio.sleep(0.3)
    await producer.cancel("demo-cancel", reason="user pressed stop")
    await producer.send("demo-error", _update("Thinking about ", message_id="m1"))
    await producer.error("demo-error", "model quota exceeded", code="429")


async def _wait_merged(client: Any, count: int, timeout: float = 10.0) -> list[Any]:
    stream = Namespace(NAMESPACE).shard(0).merged
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries: list[Any] = await client.xrange(stream)
        if len(entries) >= count:
            return entries
        await asyncio.sleep(0.05)
    raise TimeoutError(f"only {len(entries)} of {count} turns merged in {timeout:g}s")


def _print_turn(fields: dict[bytes, bytes], events: list[dict[str, Any]]) -> None:
    response = json.loads(fields[b"response"])
    rid = fields[b"response_id"].decode()
    print(f"\n== {rid}: {fields[b'status'].decode()}")
    for message in response["messages"]:
        who = message.get("author_name") or message["role"]
        parts = []
        for c in message["contents"]:
            if c["type"] in ("text", "text_reasoning"):
                parts.append(("(thinking) " if c["type"] == "text_reasoning" else "") + c["text"])
            elif c["type"] == "function_call":
                parts.append(f"call {c['name']}({c['arguments']})")
            elif c["type"] == "function_result":
                parts.append(f"result {c['result']!r}")
        print(f"   [{message['message_id']}] {who:>6}: {' | '.join(parts)}")
    if response.get("usage_details"):
        print(f"   usage: {response['usage_details']}")
    mine = [e for e in events if e["response_id"] == rid]
    print("   events: " + ", ".join(f"{e['seq']}:{e['type']}" for e in mine))
    final = mine[-1]
    if final.get("error"):
        print(f"   error: {final['error']['code']}: {final['error']['message']}")


async def run_demo() -> int:
    server = start_embedded()
    try:
        client = await connect(RedisOptions(server.url))
        workers = [Worker(client, WorkerConfig(namespace=NAMESPACE, progress=True,
                                               limits=Limits(turn_timeout=30)))
                   for _ in range(2)]
        tasks = [asyncio.create_task(w.run()) for w in workers]
        await asyncio.gather(*(w.ready.wait() for w in workers))
        print("2 workers running; producing 3 turns (handoff, cancelled, failing)...")
        await _produce(Producer(client, namespace=NAMESPACE))
        merged = await _wait_merged(client, 3)
        raw = await client.xrange(Namespace(NAMESPACE).shard(0).events)
        events = [json.loads(f[b"event"]) for _, f in raw]
        for _, fields in merged:
            _print_turn(fields, events)
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)
        await client.aclose()
        return 0
    finally:
        server.close()


def main() -> int:
    try:
        return asyncio.run(run_demo())
    except TimeoutError as exc:
        print(f"processor demo: {exc}", file=sys.stderr)
        return 1

"""``Subscriber.follow``: one turn read from Redis with the server's rules,
against a real worker: joined mid-turn (a snapshot, then the live events),
resumed after a cut (the events after its seq, from the turn's live log),
of a finished and of a cancelled turn; it ends after exactly one terminal
event, with the exact merged response just before it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

from support.serve_harness import chunk_text, merged_text, text_update, wait_logged
from support.worker_harness import Harness

from processor.client import Producer, Subscriber
from processor.client.turns import LiveEvent, MergedOutput, Snapshot


def _check(items: list[Any], merged: dict[str, Any], first_seq: int = 0) -> list[dict[str, Any]]:
    """Seqs gap-free from ``first_seq``, each once; the merged output just
    before the one terminal event, which is last."""
    events = [item for item in items if isinstance(item, LiveEvent)]
    assert [e.seq for e in events] == list(range(first_seq, first_seq + len(events)))
    assert [e.terminal for e in events].count(True) == 1 and events[-1].terminal
    assert isinstance(items[-2], MergedOutput)
    assert [isinstance(i, MergedOutput) for i in items].count(True) == 1
    assert json.loads(items[-2].response) == merged
    return [json.loads(e.data) for e in events]


async def test_follow_joins_mid_turn_with_a_snapshot_and_ends_with_the_merged_response(
    redis_url, namespace
) -> None:
    async with Harness(redis_url, namespace) as harness:
        await harness.start_worker()
        producer = Producer(harness.client, namespace)
        subscriber = Subscriber(harness.client, namespace)
        for i in range(3):
            await producer.send("f1", text_update(f"early {i} "))
        await wait_logged(harness, "f1", 3)
        items: list[Any] = []
        async for item in subscriber.follow("f1"):
            items.append(item)
            if len(items) == 1:  # the snapshot: the rest is live
                await producer.send("f1", text_update("later"))
                await producer.end("f1")
        merged = (await subscriber.wait_for("f1", 30)).response
        snapshot = items[0]
        assert isinstance(snapshot, Snapshot)
        assert merged_text(json.loads(snapshot.response)) == "early 0 early 1 early 2 "
        data = _check(items[1:], merged, first_seq=snapshot.seq + 1)
        assert data[-1]["status"] == "completed"
        assert merged_text(json.loads(snapshot.response)) + chunk_text(data) == merged_text(merged)
        assert merged_text(merged) == "early 0 early 1 early 2 later"
        # A finished turn: its merged output and terminal; nothing after the terminal seq.
        done = [item async for item in subscriber.follow("f1")]
        assert done == items[-2:]
        assert [item async for item in subscriber.follow("f1", after=items[-1].seq)] == []


async def test_follow_resumes_after_a_cut_without_gap_or_repeat(redis_url, namespace) -> None:
    async with Harness(redis_url, namespace) as harness:
        await harness.start_worker()
        producer = Producer(harness.client, namespace)
        subscriber = Subscriber(harness.client, namespace)
        head: list[Any] = []
        following = subscriber.follow("f2")  # before the turn starts: from seq 0, live
        first = asyncio.ensure_future(anext(following))
        await asyncio.sleep(0.5)  # (it has its position: what comes next is live)
        for i in range(3):
            await producer.send("f2", text_update(f"a{i} "))
        head.append(await first)
        async for item in following:
            head.append(item)
            if len(head) == 4:
                break  # the cut: the generator is closed here
        await following.aclose()
        for i in range(3):
            await producer.send("f2", text_update(f"b{i} "))
        await wait_logged(harness, "f2", 6)
        resumed = subscriber.follow("f2", after=head[-1].seq)  # from the live log, then live
        rest: list[Any] = [await anext(resumed)]
        await producer.end("f2")
        rest += [item async for item in resumed]
        merged = (await subscriber.wait_for("f2", 30)).response
        data = _check(head + rest, merged)
        assert data[0]["type"] == "synthesis.started"
        assert chunk_text(data) == merged_text(merged) == "a0 a1 a2 b0 b1 b2 "


async def test_follow_of_a_cancelled_turn_ends_cancelled_with_its_partial_merge(
    redis_url, namespace
) -> None:
    async with Harness(redis_url, namespace) as harness:
        await harness.start_worker()
        producer = Producer(harness.client, namespace)
        subscriber = Subscriber(harness.client, namespace)
        await producer.send("f3", text_update("half "))
        await wait_logged(harness, "f3", 1)
        items: list[Any] = []
        async for item in subscriber.follow("f3"):
            items.append(item)
            if len(items) == 1:
                await producer.send("f3", text_update("an answer"))
                await producer.cancel("f3", "stop")  # (before or after that update applies)
        assert isinstance(items[0], Snapshot)
        merged = (await subscriber.wait_for("f3", 30)).response
        data = _check(items[1:], merged, first_seq=items[0].seq + 1)
        assert data[-1]["status"] == "cancelled"
        assert merged_text(merged) in ("half ", "half an answer")


def test_the_client_loads_no_http_library_and_nothing_of_serve() -> None:
    code = ("import sys, processor.client; print('\\n'.join(m for m in sys.modules "
            "if m.startswith(('aiohttp', 'processor.serve'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True).stdout.split()
    assert loaded == []


def test_every_item_follow_yields_reads_alike() -> None:
    """``LiveEvent.data`` was bytes while ``MergedOutput.data`` and
    ``Snapshot.data`` were methods: now each has ``type``, ``data`` (the
    event's JSON, as the server sends it) and ``json()``; the two holding a
    response also ``text`` and ``response_json()``."""
    from processor.client.turns import TurnRef

    response = {"type": "agent_response", "response_id": "r1", "messages": [
        {"type": "message", "role": "assistant", "message_id": "m1",
         "contents": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]}
    raw = json.dumps(response).encode()
    turn = TurnRef("r1")
    event = LiveEvent.decode(b'{"type": "synthesis.chunk", "seq": 3, "response_id": "r1"}')
    snapshot = Snapshot(turn, 2, raw)
    merged = MergedOutput(turn, "completed", raw, b'{"counts": {"updates": 2}}')
    for item, kind in [(event, "synthesis.chunk"), (snapshot, "snapshot"), (merged, "merged")]:
        assert item.type == kind
        assert isinstance(item.data, bytes)
        assert item.json() == json.loads(item.data) and item.json()["type"] == kind
        assert item.json()["response_id"] == "r1"
    for holder in (snapshot, merged):
        assert holder.response_json() == response
        assert holder.text == "Hello there"
        assert holder.json()["response"] == response
    assert merged.json()["meta"] == {"counts": {"updates": 2}}
    assert snapshot.json()["seq"] == 2

"""``Subscriber.follow``: one turn read from Redis with the server's rules,
against a real worker (``--progress``): joined mid-turn, resumed after a
cut, of a finished turn; it ends after exactly one terminal event, with the
exact merged response just before it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from serve_harness import SnapshotSource, merged_text, text_update
from worker_harness import Harness

from processor.client import Producer, Subscriber
from processor.client.source import StreamScanSource
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


def _chunks(data: list[dict[str, Any]]) -> str:
    return "".join(d["delta"] for d in data if d["type"] == "synthesis.chunk")


async def test_follow_joins_mid_turn_and_ends_with_the_merged_response(
    redis_url, namespace
) -> None:
    async with Harness(redis_url, namespace, progress=True) as harness:
        await harness.start_worker()
        producer = Producer(harness.client, namespace)
        subscriber = Subscriber(harness.client, namespace)
        for i in range(3):
            await producer.send("f1", text_update(f"early {i} "))
        await harness.wait_applied()
        items: list[Any] = []
        async for item in subscriber.follow("f1"):
            items.append(item)
            if len(items) == 7:  # started + 3 x (step, chunk): the past; the rest is live
                await producer.send("f1", text_update("later"))
                await producer.end("f1")
        merged = (await subscriber.wait_for("f1", 30)).response
        data = _check(items, merged)
        assert data[-1]["status"] == "completed"
        assert _chunks(data) == merged_text(merged) == "early 0 early 1 early 2 later"
        # A finished turn: its merged output and terminal; nothing after the terminal seq.
        done = [item async for item in subscriber.follow("f1")]
        assert done == items[-2:]
        assert [item async for item in subscriber.follow("f1", after=items[-1].seq)] == []


async def test_follow_resumes_after_a_cut_without_gap_or_repeat(redis_url, namespace) -> None:
    async with Harness(redis_url, namespace, progress=True) as harness:
        await harness.start_worker()
        producer = Producer(harness.client, namespace)
        subscriber = Subscriber(harness.client, namespace)
        whole: list[Any] = []
        head: list[Any] = []
        for i in range(3):
            await producer.send("f2", text_update(f"a{i} "))
        await harness.wait_applied()
        async for item in subscriber.follow("f2"):
            head.append(item)
            if len(head) == 4:
                break  # the cut: the generator is closed here
        for i in range(3):
            await producer.send("f2", text_update(f"b{i} "))
        await harness.wait_applied()
        rest: list[Any] = []
        async for item in subscriber.follow("f2", after=head[-1].seq):
            rest.append(item)
            if len(rest) == 6:
                await producer.end("f2")
        async for item in subscriber.follow("f2"):  # (the turn has ended: its end only)
            whole.append(item)
        merged = (await subscriber.wait_for("f2", 30)).response
        data = _check(head + rest, merged)
        assert _chunks(data) == merged_text(merged) == "a0 a1 a2 b0 b1 b2 "
        assert whole == rest[-2:]


async def test_follow_of_a_cancelled_turn_and_with_a_snapshot_source(
    redis_url, namespace
) -> None:
    """A source with snapshots gives one first (then only later events), and a
    cancelled turn ends ``cancelled`` with its partial merge."""
    async with Harness(redis_url, namespace, progress=True) as harness:
        await harness.start_worker()
        producer = Producer(harness.client, namespace)
        subscriber = Subscriber(harness.client, namespace)
        await producer.send("f3", text_update("half "))
        await harness.wait_applied()
        keys = await subscriber.ready()
        source = SnapshotSource(StreamScanSource(harness.client, keys, 5000))
        items: list[Any] = []
        async for item in subscriber.follow("f3", source=source):
            items.append(item)
            if len(items) == 1:
                await producer.send("f3", text_update("an answer"))
                await harness.wait_applied()
                await producer.cancel("f3", "stop")
        assert isinstance(items[0], Snapshot) and items[0].seq == 2
        assert json.loads(items[0].response)["messages"][0]["contents"][0]["text"] == "half "
        merged = (await subscriber.wait_for("f3", 30)).response
        data = _check(items[1:], merged, first_seq=3)
        assert data[-1]["status"] == "cancelled"
        assert merged_text(merged) == "half an answer"


def test_the_client_loads_no_http_library_and_nothing_of_serve() -> None:
    code = ("import sys, processor.client; print('\\n'.join(m for m in sys.modules "
            "if m.startswith(('aiohttp', 'processor.serve'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True).stdout.split()
    assert loaded == []

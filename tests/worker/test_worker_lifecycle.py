"""Turn lifecycles through live workers, each compared with ``processor merge``
of the same entries: timeouts, per-turn limits, attempts, turns known only by
``turn_id``, cancellation (before the first entry, mid-turn, after the end)
and progress events."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from support.expectations import check_invariants
from support.strategies import random_turn
from support.turn_reference import compare_with_offline, interleave, offline_dead, offline_results
from support.worker_harness import Harness

from processor.engine.lifecycle import Limits
from processor.engine.live_reader import replay_texts
from processor.wire.ids import response_id_for_turn
from processor.wire.models import MAX_USAGE_COUNT


def _update(text: str, message_id: str = "m1") -> dict:
    return {"type": "agent_response_update", "role": "assistant", "message_id": message_id,
            "contents": [{"type": "text", "text": text}]}


async def test_turn_timeout(redis_url: str, namespace: str) -> None:
    limits = Limits(turn_timeout=1.0)
    rng = random.Random(31)
    # Every turn loses its end entry: all of them time out.
    turns = [random_turn(rng, f"slow-{i}")[:-1] for i in range(20)]
    stream = interleave(turns, rng)
    offline = offline_results(stream, limits)
    async with Harness(redis_url, namespace, shards=2, limits=limits) as harness:
        await harness.start_workers(2)
        await harness.add(stream)
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline, "timeout")
    for turn in outputs.turns.values():
        result = turn.result()
        assert result["status"] == "error"
        assert result["events"][-1]["error"]["code"] == "turn_timeout"
        check_invariants(result, str(turn.key))


async def test_turn_limits(redis_url: str, namespace: str) -> None:
    limits = Limits(max_turn_updates=5, max_turn_bytes=2000)
    by_count = [{"response_id": "many", "update": _update(f"<{i}>")} for i in range(8)]
    by_count.append({"response_id": "many", "kind": "end"})
    by_bytes = [{"response_id": "big", "update": _update("x" * 400)} for _ in range(6)]
    by_bytes.append({"response_id": "big", "kind": "end"})
    fine = [{"response_id": "fine", "update": _update("ok")}, {"response_id": "fine",
                                                                "kind": "end"}]
    stream = interleave([by_count, by_bytes, fine], random.Random(32))
    offline = offline_results(stream, limits)
    async with Harness(redis_url, namespace, limits=limits, batch=3) as harness:
        await harness.start_workers(2)
        ids = await harness.add(stream)
        await harness.wait_merged(3)
        await harness.wait_drained()
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline, "limits")
    for name in ("many", "big"):
        result = next(t for k, t in outputs.turns.items() if k.response_id == name).result()
        assert result["status"] == "error"
        assert result["events"][-1]["error"]["code"] == "turn_limit"
    # Each entry past the limit is dead-lettered once, as processor merge does:
    # the one that crossed it as turn_limit, the rest as turn_closed.
    live = sorted((d["source_id"], d["reason"]) for d in outputs.dlq)
    assert live == sorted((ids[i], reason) for i, reason, _ in offline_dead(stream, limits))
    reasons = Counter((d["response_id"], d["reason"]) for d in outputs.dlq)
    assert reasons[("many", "turn_limit")] == reasons[("big", "turn_limit")] == 1


@pytest.mark.parametrize("hold", [True, False], ids=["held", "stored"])
async def test_a_usage_sum_past_the_bound_ends_the_turn_as_offline(
    redis_url: str, namespace: str, hold: bool
) -> None:
    def usage(n: int, text: str) -> dict:
        update = _update(text)
        update["contents"].append({"type": "usage", "usage_details": {"input_token_count": n}})
        return update

    over = [{"response_id": "usage", "update": usage(MAX_USAGE_COUNT, "a")},
            {"response_id": "usage", "update": usage(1, "b")},  # the sum would pass the bound
            {"response_id": "usage", "update": _update("c")},
            {"response_id": "usage", "kind": "end"}]
    fine = [{"response_id": "fine", "update": usage(MAX_USAGE_COUNT, "ok")},
            {"response_id": "fine", "kind": "end"}]
    stream = interleave([over, fine], random.Random(34))
    offline = offline_results(stream)
    async with Harness(redis_url, namespace, hold_turns=hold) as harness:
        await harness.start_workers(1)
        ids = await harness.add(stream)
        await harness.wait_merged(2)
        await harness.wait_drained()
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline, "usage")
    result = next(t for k, t in outputs.turns.items() if k.response_id == "usage").result()
    assert result["status"] == "error"
    assert result["events"][-1]["error"]["code"] == "turn_limit"
    assert result["response"]["usage_details"] == {"input_token_count": MAX_USAGE_COUNT}
    live = sorted((d["source_id"], d["reason"], d["detail"]) for d in outputs.dlq)
    assert live == sorted((ids[i], reason, detail) for i, reason, detail in offline_dead(stream))
    assert [d["reason"] for d in outputs.dlq].count("turn_limit") == 1


async def test_attempts_and_turn_ids(redis_url: str, namespace: str) -> None:
    rng = random.Random(33)
    turns = []
    for i in range(10):
        for attempt in ("", "a1", "a2"):
            turn = random_turn(rng, f"att-{i}")
            if attempt:
                turn = [{**e, "attempt_id": attempt} for e in turn]
            turns.append(turn)
    for i in range(10):
        # Known only by turn_id: the worker assigns the ResponseId, the shard
        # comes from the turn_id.
        turn = random_turn(rng, response_id_for_turn(f"tid-{i}"))
        turns.append([{**{k: v for k, v in e.items() if k != "response_id"},
                       "turn_id": f"tid-{i}"} for e in turn])
    stream = interleave(turns, rng)
    offline = offline_results(stream)
    assert len(offline) == 40
    async with Harness(redis_url, namespace, shards=3) as harness:
        await harness.start_workers(3)
        await harness.add(stream)
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline, "attempts")
    for key, turn in outputs.turns.items():
        merged = turn.merged[0]
        if key.attempt_id:
            assert merged["attempt_id"] == key.attempt_id
            assert merged["synthesis_id"] == f"{key.response_id}:{key.attempt_id}:synthesis"
        else:
            assert "attempt_id" not in merged
        check_invariants(turn.result(), str(key))


async def test_cancel_before_during_and_after(redis_url: str, namespace: str) -> None:
    async with Harness(redis_url, namespace, shards=2) as harness:
        await harness.start_workers(2)
        # Cancelled before its first entry: the cancel still wins.
        await harness.cancel("early")
        early = [{"response_id": "early", "update": _update("a")},
                 {"response_id": "early", "kind": "end"}]
        # Cancelled mid-turn, and never sent anything again.
        mid = [{"response_id": "mid", "update": _update("b")}]
        # Cancelled after its end: nothing changes.
        done = [{"response_id": "done", "update": _update("c")},
                {"response_id": "done", "kind": "end"}]
        await harness.add(early + mid + done)
        await harness.wait_merged(2)
        await harness.wait_applied()
        await harness.cancel("mid")
        await harness.cancel("done")
        await harness.wait_merged(3)
        # Entries after the cancel are dropped, never merged nor dead-lettered.
        await harness.add([{"response_id": "mid", "update": _update("late")},
                           {"response_id": "mid", "kind": "end"}])
        await harness.wait_drained()
        outputs = await harness.outputs()
    status = {k.response_id: t.result()["status"] for k, t in outputs.turns.items()}
    assert status == {"early": "cancelled", "mid": "cancelled", "done": "completed"}
    assert outputs.merged_count == 3 and outputs.dlq == []
    for key, turn in outputs.turns.items():
        check_invariants(turn.result(), str(key))
    mid_response = json.loads(next(t for k, t in outputs.turns.items()
                                   if k.response_id == "mid").response)
    assert [m["contents"][0]["text"] for m in mid_response["messages"]] == ["b"]
    early_meta = next(t for k, t in outputs.turns.items() if k.response_id == "early")
    assert json.loads(early_meta.response)["messages"] == []


async def test_cancel_many_turns_mid_flow(redis_url: str, namespace: str) -> None:
    """Cancels racing the entries of their turns on 3 workers: each turn ends
    exactly once, no event after its terminal, nothing dead-lettered."""
    rng = random.Random(34)
    turns = [random_turn(rng, f"race-{i:03d}") for i in range(150)]
    stream = interleave(turns, rng)
    victims = {f"race-{i:03d}" for i in rng.sample(range(150), 50)}
    async with Harness(redis_url, namespace, shards=2, batch=20) as harness:
        await harness.start_workers(3)
        for start in range(0, len(stream), 150):
            await harness.add(stream[start : start + 150])
            for rid in sorted(victims)[start // 150 :: 20]:
                await harness.cancel(rid)
        for rid in victims:
            await harness.cancel(rid)
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        outputs = await harness.outputs()
    assert outputs.merged_count == len(turns)
    assert outputs.dlq == []
    for key, turn in outputs.turns.items():
        result = turn.result()
        check_invariants(result, str(key))
        if key.response_id not in victims:
            assert result["status"] == "completed"


def _strip(event: dict, drop: tuple[str, ...] = ()) -> str:
    return json.dumps({k: v for k, v in event.items() if k not in ("seq", "ts", *drop)},
                      sort_keys=True)


@pytest.mark.parametrize("workers", [1, 3])
async def test_progress_events(redis_url: str, namespace: str, workers: int) -> None:
    """Live progress (the default): each event published once, seq
    gap-free, the terminal event last, and every event carrying the turn's
    correlation ids even when only some entries name them. One worker per
    shard speaks for each turn to its end: the text chunks replay to the
    merged texts. Several workers on a shard store its turns together; a
    turn's deltas then stop when another worker stores some of it (its
    merged event is authoritative), and its events' ids are those applied
    first."""
    rng = random.Random(35)
    turns = [random_turn(rng, f"prog-{i:03d}") for i in range(60)]
    for turn in turns[:20]:  # ids on the first entry only: later events must carry them
        turn[0] = {**turn[0], "session_id": "s-" + turn[0]["response_id"], "run_id": "run-1"}
    stream = interleave(turns, rng)
    offline = offline_results(stream)
    async with Harness(redis_url, namespace, shards=2, batch=25) as harness:
        await harness.start_workers(workers)
        await harness.add(stream)
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline, "progress")
    for key in offline:
        got = outputs.turns[key]
        check_invariants(got.result(), str(key))
        if workers == 1:
            merged = json.loads(got.merged[0]["response"])
            shown = {m: t for m, t in replay_texts(got.events).items() if t}
            assert shown == {m["message_id"]: t for m in merged["messages"] if (t := "".join(
                c.get("text") or "" for c in m["contents"] if c["type"] == "text"))}, key
    for turn in turns[:20]:
        rid = turn[0]["response_id"]
        key = next(k for k in offline if k.response_id == rid)
        # With several workers, events published before the first entry was
        # applied cannot know the ids yet; the terminal event always does.
        events = outputs.turns[key].events if workers == 1 else outputs.turns[key].events[-1:]
        for event in events:
            assert event["session_id"] == "s-" + rid and event["run_id"] == "run-1", event

"""Poison and garbage entries through live workers: each lands in the DLQ with
the right ``reason``, ``detail``, ``source_id`` and ``deliveries``, the
workers keep running, and the turns around them still merge as ``processor
merge`` merges them. Entries of a finished turn go to the DLQ as turn_closed."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from support.strategies import random_turn
from support.turn_reference import compare_with_offline, interleave, offline_results
from support.worker_harness import Harness

import processor.scripts.stored_calls
from processor.engine.live_reader import replay_texts
from processor.engine.offline import merge_lines
from processor.wire.ids import shard_of


def _update(text: str, **extra: Any) -> str:
    return json.dumps({"type": "agent_response_update", "role": "assistant",
                       "contents": [{"type": "text", "text": text}], **extra})


# (entry, reason, a piece of the detail): entries a JSON line can express, so
# processor merge sees them too and must agree.
GARBAGE: list[tuple[dict[str, Any], str, str]] = [
    ({"response_id": "g-badjson", "update": "{not json"}, "bad_encoding", "'update'"),
    ({"update": _update("orphan")}, "missing_turn_key", "response_id"),
    ({"response_id": "g-kind", "kind": "explode"}, "invalid_entry", "kind"),
    ({"response_id": "g-big", "update": _update("x" * (1 << 20))}, "too_large", "limit is 1048576"),
    ({"response_id": "g-types", "update": json.dumps({"contents": "nope"})},
     "invalid_update", "$.update.contents"),
    ({"response_id": "g-types2", "update": json.dumps({"contents": [{"type": "text", "text": 5}]})},
     "invalid_update", "$.update.contents[0].text"),
    ({"response_id": "g-array", "update": "[1, 2]"}, "invalid_update", "$.update"),
    ({"response_id": "g-usage", "update": json.dumps({"contents": [
        {"type": "usage", "usage_details": {"input_token_count": 1 << 53}}]})},
     "invalid_update", "$.update.contents[0].usage_details.input_token_count"),
    ({"response_id": "g-enc", "enc": "xml", "update": _update("x")}, "bad_encoding", "'enc'"),
    ({"response_id": "g-msgpack", "enc": "msgpack", "update": "\x93garbage"},
     "bad_encoding", "msgpack"),
    ({"response_id": "g-noupdate"}, "invalid_update", "'update' is required"),
    ({"response_id": "g-long", "attempt_id": "a" * 600, "update": _update("x")},
     "invalid_entry", "attempt_id"),
]


async def test_garbage_entries_are_dead_lettered(redis_url: str, namespace: str) -> None:
    rng = random.Random(11)
    turns = [random_turn(rng, f"around-{i}") for i in range(30)]
    # A turn that reads the default limits: 1 MiB per entry (too_large above).
    stream = interleave(turns, rng)
    slots = sorted(rng.sample(range(len(stream)), len(GARBAGE)), reverse=True)
    for slot, (entry, _, _) in zip(slots, GARBAGE, strict=True):
        stream.insert(slot, entry)
    offline = offline_results(stream)
    offline_dead = merge_lines([json.dumps(e) for e in stream]).dead
    async with Harness(redis_url, namespace, shards=2) as harness:
        await harness.start_workers(2)
        ids = await harness.add(stream)
        # Raw garbage a JSON line cannot carry: invalid UTF-8 in a value and
        # in a field name, and an entry sent to the wrong shard.
        home = harness.shard_of({"response_id": "g-utf8"})
        bad_utf8 = await harness.add_raw(home, {b"response_id": b"g-\xff\xfe", b"update": b"{}"})
        named = harness.shard_of({"response_id": "g-fieldname"})
        await harness.add_raw(named, {b"response_id": b"g-fieldname", b"\xff\xfe": b"junk",
                                      b"update": _update("kept").encode()})
        await harness.add_raw(named, {b"response_id": b"g-fieldname", b"kind": b"end"})
        other = harness.ns.shard(1 - shard_of("around-3", 2))
        wrong = await harness.add_raw(other, {b"response_id": b"around-3",
                                              b"update": _update("lost?").encode()})
        await harness.wait_merged(len(offline) + 1)
        await harness.wait_drained()
        harness.assert_workers_alive()
        outputs = await harness.outputs()

    # Entry ids are per stream: two shards may use the same one.
    by_source = {(int(d["_shard"]), d["source_id"]): d for d in outputs.dlq}
    assert len(by_source) == len(outputs.dlq), "an entry was dead-lettered twice"

    def where(i: int) -> tuple[int, str]:
        return harness.shard_of(stream[i]).index, ids[i]

    expected_ids = set()
    for entry, reason, detail in GARBAGE:
        i = stream.index(entry)
        dead = by_source.get(where(i))
        assert dead is not None, f"{entry} not in the DLQ"
        assert dead["reason"] == reason, (entry, dead)
        assert detail in dead["detail"], (entry, dead["detail"])
        assert dead["deliveries"] == "1"
        # The original fields come along, whole (even a too_large one).
        for name, value in entry.items():
            assert dead[name] == value, name
        # processor merge says the same of the same line.
        same = [d for d in offline_dead if d.source_id == f"0-{i + 1}"]
        assert [(d.reason, d.detail) for d in same] == [(reason, dead["detail"])]
        expected_ids.add(where(i))
    assert "truncated" not in by_source[where(stream.index(GARBAGE[3][0]))]
    bad_utf8, wrong = (home.index, bad_utf8), (other.index, wrong)
    assert by_source[bad_utf8]["reason"] == "bad_encoding"
    assert "response_id" in by_source[bad_utf8]["detail"]
    assert by_source[wrong]["reason"] == "wrong_shard"
    expected_ids |= {bad_utf8, wrong}
    assert set(by_source) == expected_ids

    # The turns around the garbage merged exactly as processor merge merges them,
    # and the entry with a junk field name merged as if the field were not there.
    junk = outputs.turns.pop(next(k for k in outputs.turns if k.response_id == "g-fieldname"))
    compare_with_offline(outputs, offline, "around garbage")
    assert json.loads(junk.response)["messages"][0]["contents"][0]["text"] == "kept"


async def test_entries_of_a_finished_turn_are_turn_closed(redis_url: str, namespace: str) -> None:
    first = [{"response_id": "done-1", "update": _update("one")}, {"response_id": "done-1",
                                                                   "kind": "end"}]
    # Entries after the end in the same flow: the worker may find them before
    # or after it finalised the turn; either way they are turn_closed.
    second = [{"response_id": "done-2", "update": _update("two")},
              {"response_id": "done-2", "kind": "end"},
              {"response_id": "done-2", "update": _update("late in flow"), "step_id": "s9"}]
    late = [{"response_id": "done-1", "update": _update("late")},
            {"response_id": "done-1", "kind": "end"}]
    async with Harness(redis_url, namespace) as harness:
        # One worker: applies done-2's entries in order.
        (running,) = await harness.start_workers(1)
        await harness.add(first)
        await harness.wait_merged(1)
        ids = await harness.add(second + late)
        await harness.wait_merged(2)
        await harness.wait_drained()
        outputs = await harness.outputs()
        counted = running.worker.metrics.registry.get_sample_value(
            "processor_dlq_entries_total", {"reason": "turn_closed"})
    offline = offline_results(first + second + late)
    compare_with_offline(outputs, offline, "turn_closed")
    closed = {d["source_id"]: d for d in outputs.dlq}
    assert set(closed) == {ids[2], ids[3], ids[4]}
    for dead in closed.values():
        assert dead["reason"] == "turn_closed", dead
        assert dead["deliveries"] == "1"
        assert dead["detail"]
    assert closed[ids[3]]["update"] == late[0]["update"]
    # The original fields, as the producer wrote them.
    assert closed[ids[2]]["update"] == second[2]["update"]
    assert closed[ids[4]]["kind"] == "end"
    assert closed[ids[2]]["step_id"] == "s9"
    assert counted == 3  # in the metrics too, whichever path dead-lettered each


async def test_poison_entry_reaches_max_deliveries(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry whose processing always fails (here: decoding raises, as a bug
    would) stays pending alone, is redelivered by reclaim and dead-lettered
    after max_deliveries; its batch-mates and the workers carry on."""
    real = processor.scripts.stored_calls.decode_stream_entry

    def decode_or_fail(fields: Any, **kw: Any) -> Any:
        if b"poison" in fields:
            raise RuntimeError("this entry always fails")
        return real(fields, **kw)

    monkeypatch.setattr(processor.scripts.stored_calls, "decode_stream_entry", decode_or_fail)
    rng = random.Random(12)
    turns = [random_turn(rng, f"near-{i}") for i in range(10)]
    stream = interleave(turns, rng)
    poison = {"response_id": "near-3", "update": _update("poison"), "poison": "1"}
    stream.insert(len(stream) // 2, poison)
    offline = offline_results([e for e in stream if e is not poison])
    max_deliveries = 3
    async with Harness(redis_url, namespace, reclaim_idle_ms=200,
                       max_deliveries=max_deliveries, batch=50) as harness:
        await harness.start_workers(2)
        ids = await harness.add(stream)
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        harness.assert_workers_alive()
        outputs = await harness.outputs()
    assert len(outputs.dlq) == 1, outputs.dlq
    dead = outputs.dlq[0]
    assert dead["source_id"] == ids[stream.index(poison)]
    assert dead["reason"] == "max_deliveries"
    assert dead["deliveries"] == str(max_deliveries + 1)
    assert f"delivered {max_deliveries + 1} times" in dead["detail"]
    assert dead["poison"] == "1" and dead["response_id"] == "near-3"
    compare_with_offline(outputs, offline, "around poison")


def test_garbage_table_is_json_lines() -> None:
    """The table above is what processor merge can read (guards the comparison)."""
    for entry, _, _ in GARBAGE:
        assert msgspec.json.decode(json.dumps(entry)) == entry


async def test_entry_with_thousands_of_fields(redis_url: str, namespace: str) -> None:
    """An entry with more fields than a Lua call can pass on is still
    dead-lettered whole (its names and values kept as one msgpack array,
    marked packed), never cut nor lost; the entries around it merge."""
    many = {f"f{i}": "x" for i in range(9000)}
    async with Harness(redis_url, namespace) as harness:
        await harness.start_workers(1)
        before = await harness.add([{"response_id": "ok-1", "update": _update("a")},
                                    {"response_id": "ok-1", "kind": "end"}])
        bad = await harness.add_raw(harness.shards[0], many)  # no response_id
        also = await harness.add_raw(harness.shards[0], {"response_id": "wide", **many})
        after = await harness.add([{"response_id": "ok-2", "update": _update("b")},
                                   {"response_id": "ok-2", "kind": "end"}])
        await harness.wait_merged(2)
        await harness.wait_drained()
        harness.assert_workers_alive()
        outputs = await harness.outputs()
        raw = {i.decode(): f for i, f in await harness.client.xrange(harness.shards[0].dlq)}
    assert len(before) == len(after) == 2
    by_source = {d["source_id"]: d for d in outputs.dlq}
    assert set(by_source) == {bad, also}
    assert by_source[bad]["reason"] == "missing_turn_key"
    assert by_source[also]["reason"] == "invalid_update"
    for source, fields in ((bad, many), (also, {"response_id": "wide", **many})):
        dead = by_source[source]
        assert dead["packed"] == "1" and dead["deliveries"] == "1"
        assert "truncated" not in dead
        flat = msgspec.msgpack.decode(raw[dead["_id"]][b"packed_fields"])
        assert flat == [x for kv in fields.items() for x in kv]


async def test_a_failing_script_step_never_loses_the_entry(redis_url: str, namespace: str) -> None:
    """Should applying an entry fail inside the script (a bug; scripts are not
    rolled back), the acked entry goes to the DLQ as internal_error instead of
    vanishing, and the rest of its batch is applied."""
    from processor.scripts import Scripts
    from processor.scripts.calls import msgpack_str
    from processor.scripts.stored_calls import build_apply
    from processor.worker.worker import WorkerConfig

    async with Harness(redis_url, namespace) as harness:
        shard = harness.shards[0]
        config = WorkerConfig(namespace=namespace, consumer="bug")
        await harness.client.xgroup_create(shard.updates, config.group, id="0", mkstream=True)
        ids = await harness.add([{"response_id": "bug", "update": _update("a")},
                                 {"response_id": "bug", "update": _update("b")},
                                 {"response_id": "bug", "kind": "end"}])
        [[_, entries]] = await harness.client.xreadgroup(
            config.group, "bug", {shard.updates: ">"}, count=10)
        call = build_apply(shard, entries, {}, config, 0)
        # Corrupt the turn-level ids of the first entry: unpacking them fails.
        first = call.entries.index(ids[0])
        call.entries[first + 6] = msgpack_str(b"\xc1")
        await Scripts(harness.client).apply_entries(keys=call.keys, args=call.argv())
        assert await harness.client.xlen(shard.updates) == 0
        assert (await harness.client.xpending(shard.updates, config.group))["pending"] == 0
        outputs = await harness.outputs()
    [dead] = outputs.dlq
    assert dead["source_id"] == ids[0] and dead["reason"] == "internal_error"
    assert "applying the entry failed" in dead["detail"]
    assert dead["response_id"] == "bug" and dead["deliveries"] == "1"


@pytest.mark.parametrize("hold", [False, True], ids=["stored", "held"])
async def test_a_dead_lettered_first_entry_counts_in_its_turns_meta(
    redis_url: str, namespace: str, hold: bool
) -> None:
    """A turn whose first update is bad JSON: the turn starts at its next
    entry, and its meta counts the dead letter (``counts.dlq``), live on both
    paths and in ``processor merge``: it was 0 everywhere."""
    stream = [{"response_id": "first-bad", "update": "{not json"},
              {"response_id": "first-bad", "update": _update("fine")},
              {"response_id": "first-bad", "kind": "end"}]
    [offline] = merge_lines([json.dumps(e) for e in stream]).results()
    assert offline.meta.counts.dlq == 1
    config = {} if hold else {"hold_turns": False}
    async with Harness(redis_url, namespace, **config) as harness:
        await harness.start_workers(1)
        await harness.add(stream)
        await harness.wait_merged(1)
        outputs = await harness.outputs()
    [turn] = outputs.turns.values()
    assert json.loads(turn.merged[0]["meta"])["counts"]["dlq"] == 1
    assert [d["reason"] for d in outputs.dlq] == ["bad_encoding"]


@pytest.mark.parametrize("hold", [False, True], ids=["stored", "held"])
async def test_live_progress_goes_on_after_a_dead_lettered_entry(
    redis_url: str, namespace: str, hold: bool
) -> None:
    """A turn with one bad entry in its middle: its later valid updates are
    merged and told live too (their chunks, replayed, are the merged text).
    The bad entry used to silence the turn for good: it moved the turn's
    version past the worker's mirror, which was dropped, and a stored turn
    without a mirror publishes no deltas (``'after-bad'`` merged, live chunks [])."""
    rid = "mid-bad"
    steps = [[{"response_id": rid, "update": _update("before ")}],
             [{"response_id": rid, "update": "{not json"}],
             [{"response_id": rid, "update": _update("after-bad")}],
             [{"response_id": rid, "update": _update(" and more")}]]
    # (--hold-ms 100: a held update is checkpointed, so acked, soon after it is
    # read, and wait_applied() waits for that, not for 5 s.)
    config: dict[str, Any] = {"hold_ms": 100} if hold else {"hold_turns": False}
    async with Harness(redis_url, namespace, **config) as harness:
        await harness.start_workers(1)
        for step in steps:  # one batch each
            await harness.add(step)
            await harness.wait_applied()

        async def told_whole() -> bool:  # (within --live-interval-ms of the last batch)
            turns = (await harness.outputs()).turns.values()
            return any("".join(replay_texts(t.events, "synthesis.chunk").values())
                       == "before after-bad and more" for t in turns)

        await harness.wait_for(told_whole, 10, "the live chunks tell the merged text")
        live_before_end = (await harness.outputs()).turns
        await harness.add([{"response_id": rid, "kind": "end"}])
        await harness.wait_merged(1)
        outputs = await harness.outputs()
    [turn] = outputs.turns.values()
    [message] = json.loads(turn.merged[0]["response"])["messages"]
    merged_text = "".join(c["text"] for c in message["contents"] if c["type"] == "text")
    assert merged_text == "before after-bad and more"
    assert [d["reason"] for d in outputs.dlq] == ["bad_encoding"]
    # (finalised from the worker's copy, which counts the dead letter as the hash does)
    assert json.loads(turn.merged[0]["meta"])["counts"]["dlq"] == 1
    assert replay_texts(turn.events, "synthesis.chunk") == {message["message_id"]: merged_text}
    # and live, before the turn ended (not only with its outcome)
    [running] = live_before_end.values()
    told = "".join(replay_texts(running.events, "synthesis.chunk").values())
    assert told == merged_text
    seqs = [int(e["seq"]) for e in turn.events]
    assert seqs == list(range(len(seqs)))


async def test_a_flood_of_bad_entries_keeps_the_dlq_near_dlq_maxlen(
        redis_url: str, namespace: str) -> None:
    """A producer flooding the DLQ (docs/security.md: each dead letter is
    the entry as written) pushes the oldest dead letters out: the DLQ stays
    near ``--dlq-maxlen``, Redis's approximate trim (whole nodes of up to
    100 entries) aside, and the newest dead letter is kept."""
    async with Harness(redis_url, namespace, dlq_maxlen=50) as harness:
        await harness.start_worker()
        ids = await harness.add([{"response_id": f"bad-{i}", "update": "not json"}
                                 for i in range(600)])
        await harness.wait_drained()
        dlq = harness.shards[0].dlq
        length = await harness.client.xlen(dlq)
        [(_, newest)] = await harness.client.xrevrange(dlq, count=1)
    assert 50 <= length <= 50 + 100, length
    assert newest[b"source_id"].decode() == ids[-1]

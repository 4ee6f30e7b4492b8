"""The worker's mirror of a turn (processor/worker/stored/mirror.py): used to finalise
only while this worker stored every record of the turn, in entry-id order;
dropped on any doubt; and what it publishes is what replaying the stored
records publishes (``processor merge``), byte for byte."""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import pytest
import redis.exceptions
from hypothesis import given, settings
from hypothesis import strategies as st
from support.stepped import settled_count
from support.strategies import random_turn
from support.turn_reference import (
    compare_with_offline,
    end_entry,
    entry_fields,
    interleave,
    offline_results,
    simple_turn,
    text_delta,
)
from support.worker_harness import Harness

from processor.engine.lifecycle import Limits
from processor.engine.records import encode_stored
from processor.engine.replay import render, replay
from processor.ingest.decode import decode_entry
from processor.scripts import Scripts
from processor.scripts.stored_calls import Applied, Version, build_apply, parse_versions
from processor.wire.ids import TurnKey
from processor.wire.models import Record
from processor.worker.stored.mirror import Ahead, Mirror, Mirrors
from processor.worker.worker import Worker, WorkerConfig

KEY = TurnKey("r1")


def _record(text: str) -> Record:
    _key, record = decode_entry({"response_id": "r1", "update": (
        '{"type":"agent_response_update","role":"assistant","message_id":"m",'
        f'"contents":[{{"type":"text","text":"{text}"}}]}}')})
    return record


def _applied(*ids: str) -> list[Applied]:
    return [Applied(KEY, i, _record(i), 10) for i in ids]


def test_a_mirror_follows_a_turn_stored_from_its_start() -> None:
    mirrors = Mirrors(Limits())
    mirrors.update(_applied("1-0", "2-0"), {KEY: Version(0, 2, 2, "7")})
    mirrors.update(_applied("3-0"), {KEY: Version(2, 3, 1, "7")})
    mirror = mirrors.take(KEY)
    assert mirror is not None and mirror.version == 3
    assert mirror.matches({"ver": "3", "started": "7"})
    assert not mirror.matches({"ver": "4", "started": "7"})
    assert not mirror.matches({"ver": "3", "started": "8"})  # a new turn of the same key
    assert mirror.replay.life.counts.updates == 3
    assert mirrors.take(KEY) is None and mirrors.bytes == 0


def test_a_mirror_is_dropped_on_any_doubt() -> None:
    cases = {
        "records stored before it followed": [(_applied("1-0"), Version(1, 2, 1, "7"))],
        "another worker stored one in between": [
            (_applied("1-0"), Version(0, 1, 1, "7")), (_applied("3-0"), Version(2, 3, 1, "7"))],
        "an entry was not stored (fenced)": [(_applied("1-0", "2-0"), Version(0, 1, 1, "7"))],
        "an entry was dropped, not stored": [(_applied("1-0"), Version(0, 2, 1, "7"))],
        "an older entry (reclaimed) came later": [
            (_applied("5-0"), Version(0, 1, 1, "7")), (_applied("3-0"), Version(1, 2, 1, "7"))],
        "the turn was started again": [
            (_applied("1-0"), Version(0, 1, 1, "7")), (_applied("2-0"), Version(1, 2, 1, "9"))],
        # A read ('>', not checked) and then a reclaim of an entry a dead
        # worker held since before it: the read's last id still counts.
        "a reclaimed entry older than a read": [
            (_applied("10-0", "20-0"), Version(0, 2, 2, "7"), True),
            (_applied("15-0"), Version(2, 3, 1, "7"))],
    }
    for case, calls in cases.items():
        mirrors = Mirrors(Limits())
        for applied, version, *newest in calls:
            mirrors.update(applied, {KEY: version}, *newest)
        assert mirrors.take(KEY) is None, case
        assert mirrors.bytes == 0, case


def test_update_names_the_turns_its_call_left_as_mirrored() -> None:
    """The turns whose mirror is exactly the state the call reported (the
    finalise may publish those without reading them back), and no other."""
    mirrors = Mirrors(Limits())
    other = TurnKey("r2")
    fresh = mirrors.update(
        [*_applied("1-0", "2-0"), Applied(other, "3-0", _record("x"), 10)],
        {KEY: Version(0, 2, 2, "7"), other: Version(4, 5, 1, "7")})
    assert fresh == {KEY}  # r2 had records before this worker followed it
    assert mirrors.update([], {KEY: Version(2, 3, 0, "7")}) == set()  # a dead letter moved it
    assert mirrors.update(_applied("4-0"), {KEY: Version(0, 1, 1, "8")}) == {KEY}
    assert Mirrors(Limits(), max_turns=0).update(_applied("1-0"),
                                                 {KEY: Version(0, 1, 1, "7")}) == set()


def test_mirrors_are_bounded() -> None:
    mirrors = Mirrors(Limits(), max_turns=3, max_bytes=35)
    for i in range(5):
        key = TurnKey(f"r{i}")
        mirrors.update([Applied(key, "1-0", _record("x"), 10)], {key: Version(0, 1, 1, "7")})
    assert list(mirrors.turns) == [TurnKey("r2"), TurnKey("r3"), TurnKey("r4")]
    key = TurnKey("r9")
    mirrors.update([Applied(key, f"{i}-0", _record("x"), 10) for i in range(1, 3)],
                   {key: Version(0, 2, 2, "7")})
    assert list(mirrors.turns) == [TurnKey("r4"), key] and mirrors.bytes == 30


def test_a_mirror_renders_what_the_replay_renders() -> None:
    """The same records, fed as the batches come or replayed from Redis."""
    rng = random.Random(5)
    for n in range(30):
        decoded = [decode_entry(entry_fields(e)) for e in random_turn(rng, f"r-{n}")]
        key = decoded[0][0]
        applied = [Applied(key, f"{i + 1}-0", rec, 5) for i, (_k, rec) in enumerate(decoded)]
        stored = {a.entry_id: encode_stored(a.size, a.record) for a in applied}
        for reason in ("closing", "cancel", "timeout"):
            want = render(key, replay(key, stored, Limits()), {"started": "7"}, reason, 9)
            got = render(key, _mirror(key, applied).replay, {"started": "7"}, reason, 9)
            assert got == want, (n, reason)


def _mirror(key: TurnKey, applied: list[Applied]) -> Mirror:
    mirrors = Mirrors(Limits())
    mirrors.update(applied, {key: Version(0, len(applied), len(applied), "7")})
    mirror = mirrors.take(key)
    assert mirror is not None
    return mirror


def _settled(harness: Harness) -> dict[str, float]:
    out = {}
    for running in harness.workers:
        for metric in running.worker.metrics.settled.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    source = sample.labels["source"]
                    out[source] = out.get(source, 0) + sample.value
    return out


async def _run(url: str, namespace: str, seed: int, workers: int, **config: Any) -> tuple:
    """300 random turns, interleaved, through ``workers`` workers: the outputs,
    ``processor merge``'s results and where each finalise's merge came from."""
    rng = random.Random(seed)
    arrival = interleave([random_turn(rng, f"resp-{i:04d}") for i in range(300)], rng)
    offline = offline_results(arrival)
    async with Harness(url, namespace, **config) as harness:
        await harness.start_workers(workers)
        await harness.add(arrival)
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
        return outputs, offline, _settled(harness)


@pytest.mark.parametrize("mirror_turns", [10_000, 0])
async def test_one_worker_finalises_from_its_mirrors(
    redis_url: str, namespace: str, mirror_turns: int
) -> None:
    # (The stored path's mirrors: a worker holding turns publishes from its
    # held copy, test_worker_hold.py.)
    outputs, offline, settled = await _run(redis_url, namespace, 11, 1, batch=50,
                                           mirror_turns=mirror_turns, hold_turns=False)
    compare_with_offline(outputs, offline, "one worker")
    # Every turn from the worker's mirror: none was stored by anyone else
    # (with --mirror-turns 0, none: every one read back).
    assert settled == {"mirror" if mirror_turns else "replay": len(offline)}, settled


async def test_a_turn_another_consumer_stored_into_is_read_back(
    redis_url: str, namespace: str
) -> None:
    """A consumer the worker does not know of applies the middle of a turn:
    the worker's mirror misses those records, so it must replay from Redis."""
    entries = simple_turn("shared", 6)
    offline = offline_results(entries)
    async with Harness(redis_url, namespace) as harness:
        shard = harness.shards[0]
        await harness.start_workers(1)
        await harness.add(entries[:2])
        await harness.wait_applied()
        # The intruder reads and applies the next two entries itself.
        config = WorkerConfig(namespace=namespace, consumer="intruder")
        await harness.client.xgroup_createconsumer(shard.updates, config.group, "intruder")
        paused = harness.workers[0].worker
        paused.stop()  # the worker must not read them first
        await harness.stop_worker(harness.workers[0])
        await harness.add(entries[2:4])
        [[_, read]] = await harness.client.xreadgroup(
            config.group, "intruder", {shard.updates: ">"}, count=10)
        call = build_apply(shard, read, {}, config, 0)
        reply = await Scripts(harness.client).apply_entries(keys=call.keys, args=call.argv())
        assert parse_versions(reply[4])[TurnKey("shared")].before == 2
        harness.workers.clear()
        await harness.start_workers(1)
        await harness.add(entries[4:])
        await harness.wait_merged(1)
        await harness.wait_drained()
        outputs = await harness.outputs()
        settled = _settled(harness)
    compare_with_offline(outputs, offline, "intruder")
    assert settled == {"replay": 1}, settled


async def test_a_dead_letter_of_a_mirrored_turn_is_counted(
    redis_url: str, namespace: str
) -> None:
    """An entry of the turn dead-lettered among its stored ones moves the
    turn's version past the worker's mirror, which never saw it: the published
    counts include it although no other worker touched the turn."""
    turn = simple_turn("counted", 4)
    bad = {"response_id": "counted", "update": '{"type": "agent_response_update", "contents": 5}'}
    entries = [*turn[:2], bad, *turn[2:]]
    async with Harness(redis_url, namespace) as harness:
        await harness.start_workers(1)
        await harness.add(entries)
        await harness.wait_merged(1)
        await harness.wait_drained()
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline_results(entries), "dead letter")
    got = outputs.turns[TurnKey("counted")]
    assert json.loads(got.merged[0]["meta"])["counts"]["dlq"] == 1
    assert got.events[-1]["counts"]["dlq"] == 1
    assert [d["reason"] for d in outputs.dlq] == ["invalid_update"]


async def test_two_workers_agree_with_the_replay(redis_url: str) -> None:
    """Two workers share a shard: turns split between them are read back,
    the others finalised from mirrors; all equal ``processor merge``."""
    outputs, offline, settled = await _run(redis_url, f"t{uuid.uuid4().hex[:8]}", 12, 2,
                                           batch=20)
    compare_with_offline(outputs, offline, "two workers")
    assert sum(settled.values()) >= len(offline)
    assert settled.get("replay", 0) > 0, settled


def _state(mirrors: Mirrors) -> list[tuple[Any, ...]]:
    return [(key, m.version, m.started, m.last_id, m.replay.life.counts, m.replay.life.bytes,
             m.replay.ending) for key, m in mirrors.turns.items()]


_KEYS = [TurnKey(f"t{i}") for i in range(3)]


@st.composite
def _batches(draw: st.DrawFn) -> list[tuple[list[Applied], dict[TurnKey, Version], bool]]:
    """Batches read with XREADGROUP > (ids rising) and the versions their
    apply_entries call reports for every turn in them: mostly what one
    worker storing everything would see, sometimes off in one way or
    another (another consumer, a fenced or dropped entry, a new start), and
    sometimes a call that failed (True)."""
    server: dict[TurnKey, int] = {}
    started = dict.fromkeys(_KEYS, "7")
    seq, batches = 1, []
    for _ in range(draw(st.integers(1, 6))):
        keys = draw(st.lists(st.sampled_from(_KEYS), min_size=0, max_size=6))
        applied = []
        for key in keys:
            text = draw(st.sampled_from(["a", "bc", ""]))
            applied.append(Applied(key, f"{seq}-0", _record(text), len(text) + 5))
            seq += 1
        extra = draw(st.lists(st.sampled_from(_KEYS), max_size=1))
        versions = {}
        for key in dict.fromkeys([*keys, *extra]):
            count = keys.count(key)
            before = server.get(key, 0)
            skew = draw(st.sampled_from(["", "", "", "other", "fenced", "moved", "restart"]))
            if skew == "other":
                before += 1
            if skew == "restart":  # finished and started again, its counts where they were
                started[key] = "9" if started[key] == "7" else "7"
            stored = count - 1 if skew == "fenced" and count else count
            after = before + stored + (skew == "moved")
            versions[key] = Version(before, after, stored, started[key])
            server[key] = after
        batches.append((applied, versions, draw(st.booleans()) and draw(st.booleans())))
    return batches


@given(_batches())
@settings(max_examples=150, deadline=None)
def test_feeding_ahead_keeps_exactly_what_update_keeps(
    batches: list[tuple[list[Applied], dict[TurnKey, Version], bool]],
) -> None:
    """The worker feeds a batch's mirrors while its apply_entries call runs
    (Mirrors.feed_ahead) and settles them on the reply: the mirrors kept and
    the turns named are update()'s, whatever the versions say; a failed
    call drops every mirror the batch fed (a retry feeds them again)."""
    now, ahead_side = Mirrors(Limits(), max_turns=2), Mirrors(Limits(), max_turns=2)
    for applied, versions, failed in batches:
        ahead = Ahead()
        ahead_side.feed_ahead(applied, ahead)
        if failed:
            ahead_side.forget(ahead)
            for key in ahead.turns:
                now.drop(key)
            assert not ahead.turns.keys() & ahead_side.turns.keys()
        else:
            assert ahead_side.confirm(ahead, versions) == now.update(applied, versions, True)
        assert _state(ahead_side) == _state(now)
        assert ahead_side.bytes == now.bytes == sum(
            m.replay.life.bytes for m in now.turns.values())


async def _storing_worker(harness: Harness) -> Worker:
    """A worker with no loop of its own, handed each batch by the test."""
    worker = Worker(harness.client, harness.worker_config())
    for state in worker.shards:  # it knows every entry pending to it
        state.orphans = False
    await harness.client.xgroup_create(harness.shards[0].updates, harness.group, id="0",
                                       mkstream=True)
    return worker


async def _read_new(harness: Harness, worker: Worker, part: list[dict[str, Any]]) -> Any:
    """Add ``part``, read it with XREADGROUP > as the worker, and build its call."""
    shard = harness.shards[0]
    await harness.add(part)
    [[_, read]] = await harness.client.xreadgroup(
        harness.group, worker.config.consumer, {shard.updates: ">"})
    call = build_apply(shard, read, {}, worker.options, 0)
    call.newest = True
    return read, call


@pytest.mark.parametrize("ran", [True, False])
async def test_a_batch_whose_call_failed_is_not_fed_twice(
    redis_url: str, namespace: str, ran: bool
) -> None:
    """The mirrors are fed while apply_entries runs; the call failed (its
    reply lost after the script ran, or never sent), the batch is applied
    again: the mirrors it fed are dropped first, so the turn is replayed
    from Redis, its text once. (Unsent, the retry's versions would confirm
    a mirror fed twice.)"""
    entries = simple_turn("lost", 4)
    async with Harness(redis_url, namespace) as harness:
        shard = harness.shards[0]
        worker = await _storing_worker(harness)
        real = worker.scripts.apply_entries
        for part, lose in ((entries[:2], False), (entries[2:], True)):
            read, call = await _read_new(harness, worker, part)
            if lose:
                async def ran_then_lost(**kwargs: Any) -> Any:
                    if ran:
                        await real(**kwargs)
                    raise redis.exceptions.ConnectionError("cut")

                worker.scripts.apply_entries = ran_then_lost
                with pytest.raises(redis.exceptions.ConnectionError):
                    await worker.stored.store(shard, read, {}, call)
                assert TurnKey("lost") not in worker.shard(0).mirrors.turns
                worker.scripts.apply_entries = real
            await worker.stored.store(shard, read, {}, call)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline_results(entries), f"cut, ran: {ran}")
    assert settled_count(worker, "replay") == 1


async def test_a_mirror_that_fails_to_feed_is_dropped_and_the_turn_replayed(
    redis_url: str, namespace: str
) -> None:
    """Feeding the mirrors while apply_entries runs raises (a bug): the batch
    is still stored, the turn's mirror dropped, and the turn published from
    its records."""
    entries = simple_turn("broken", 4)
    async with Harness(redis_url, namespace) as harness:
        shard = harness.shards[0]
        worker = await _storing_worker(harness)
        mirrors = worker.shard(0).mirrors
        for part, broken in ((entries[:2], False), (entries[2:], True)):
            read, call = await _read_new(harness, worker, part)
            if broken:
                def fails(applied: list[Applied], ahead: Ahead) -> None:
                    raise RuntimeError("a bug")

                mirrors.feed_ahead = fails  # type: ignore[method-assign]
            await worker.stored.store(shard, read, {}, call)
        await worker.sweeper.sweep(shard)
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline_results(entries), "feeding failed")
    assert settled_count(worker, "replay") == 1 and mirrors.bytes == 0


async def test_a_live_turn_whose_mirror_is_dropped_is_counted_and_logged(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the mirrors' bound (one mirror here; in production the 32 MB byte
    budget, which a few hundred long turns reach), a stored turn's next
    batches cannot say its live progress: not silently any more, but counted
    (processor_live_without_mirror_total) and logged; its merged entry is
    still whole."""
    async with Harness(redis_url, namespace, mirror_turns=1, hold_turns=False) as harness:
        running = await harness.start_worker()
        for i in range(3):  # each batch moves both turns: one mirror is dropped each time
            await harness.add([text_delta("a", f"a{i} "), text_delta("b", f"b{i} ")])
            await harness.wait_applied()
        without = running.worker.metrics.live_without_mirror._value.get()
        assert without >= 1
        assert any("publish no live progress" in r.getMessage() for r in caplog.records)
        await harness.add([end_entry("a"), end_entry("b")])
        await harness.wait_merged(2)
        outputs = await harness.outputs()
    texts = {key.response_id: json.loads(turn.merged[0]["response"])["messages"][0]["contents"]
             for key, turn in outputs.turns.items()}
    assert {rid: "".join(c["text"] for c in contents) for rid, contents in texts.items()} == \
        {"a": "a0 a1 a2 ", "b": "b0 b1 b2 "}

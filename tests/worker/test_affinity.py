"""Shard affinity: the pure rules (who reads which shard) and, on a real
Redis, that live workers split the shards, take over the shards of a worker
that leaves or dies, and read a shard whose live owner stalled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from typing import Any

import pytest
import redis.asyncio
from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import SlotNotCoveredError
from support.strategies import random_turn
from support.turn_reference import compare_with_offline, interleave, offline_results
from support.worker_harness import Harness

from processor.scripts import source
from processor.wire.keys import Namespace
from processor.worker.affinity import owned_shards, readers_per_shard, shard_readers, stalled
from processor.worker.membership import Membership
from processor.worker.metrics import Metrics
from processor.worker.worker import Worker

names = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=12, unique=True)
shard_counts = st.integers(min_value=1, max_value=32)


@given(names, shard_counts)
def test_every_shard_has_its_readers_among_the_live(live: list[str], shards: int) -> None:
    k = readers_per_shard(len(live), shards)
    for s in range(shards):
        readers = shard_readers(live, s, shards)
        assert len(readers) == min(k, len(live))
        assert set(readers) <= set(live)
    # The same shards, from each worker's side.
    owned = {w: owned_shards(w, live, shards) for w in live}
    for s in range(shards):
        assert {w for w in live if s in owned[w]} == set(shard_readers(live, s, shards))


@given(names, shard_counts)
def test_with_enough_shards_each_shard_has_one_reader(live: list[str], shards: int) -> None:
    if len(live) > shards:
        shards = len(live)
    owned = [owned_shards(w, live, shards) for w in live]
    assert sorted(s for mine in owned for s in mine) == list(range(shards))


@given(names, shard_counts, st.randoms())
def test_the_order_of_the_live_set_does_not_matter(
    live: list[str], shards: int, rng: random.Random
) -> None:
    shuffled = list(live)
    rng.shuffle(shuffled)
    for w in live:
        assert owned_shards(w, live, shards) == owned_shards(w, shuffled, shards)


@given(names.filter(lambda n: len(n) >= 2), st.integers(min_value=12, max_value=40), st.data())
def test_a_worker_leaving_moves_only_its_own_shards(
    live: list[str], shards: int, data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(live))
    rest = [w for w in live if w != gone]
    for w in rest:
        # (one reader per shard before and after: shards >= workers)
        assert owned_shards(w, live, shards) <= owned_shards(w, rest, shards)


def test_fewer_shards_than_workers_keeps_every_shard_shared() -> None:
    live = [f"w{i}" for i in range(4)]
    assert [len(shard_readers(live, 0, 1))] == [4]  # one shard: everyone reads it
    assert all(len(shard_readers(live, s, 2)) == 2 for s in range(2))
    assert owned_shards("new", [], 3) == {0, 1, 2}  # alone: every shard


def test_stalled_needs_a_backlog_and_every_owner_idle() -> None:
    assert not stalled({"a": 10_000}, ["a"], undelivered=False, ttl_ms=5000)
    assert stalled({"a": 10_000}, ["a"], undelivered=True, ttl_ms=5000)
    assert not stalled({"a": 100}, ["a"], undelivered=True, ttl_ms=5000)
    assert stalled({}, ["a"], undelivered=True, ttl_ms=5000)  # never read it
    assert not stalled({"a": 10_000, "b": 5}, ["a", "b"], undelivered=True, ttl_ms=5000)


# ------------------------------------------------------------ on Redis

SHARDS = 4


def _arrival(prefix: str, turns: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return interleave([random_turn(rng, f"{prefix}-{i:04d}") for i in range(turns)], rng)


async def test_workers_split_the_shards_and_publish_from_their_own_copy(redis_url: str) -> None:
    arrival = _arrival("aff", 400, 7)
    offline = offline_results(arrival)
    # The default TTL: with 1 s, a beat late by a second on a loaded machine
    # made a worker look dead for a moment and its shards were read by the
    # other (a flake, not what this test is about).
    async with Harness(redis_url, f"t{uuid.uuid4().hex[:8]}", SHARDS, worker_ttl=5.0) as h:
        a, b = await h.start_workers(2)
        await h.wait_for(lambda: a.worker.membership.live == b.worker.membership.live ==
                     sorted([a.consumer, b.consumer]), 5, "both workers to see each other")
        owned_a, owned_b = a.worker.membership.owned, b.worker.membership.owned
        assert owned_a | owned_b == set(range(SHARDS)) and not owned_a & owned_b
        # A's reads of b's shards that were already blocking when a saw b
        # (block_ms, 100 ms) still take what arrives: wait them out.
        await asyncio.sleep(0.5)
        await h.add(arrival)
        await h.wait_merged(len(offline))
        await h.wait_drained()
        outputs = await h.outputs()
        # Each shard's entries went to its one reader: every turn came
        # from a worker's own merge (held, or a stored turn's mirror), none
        # was replayed from Redis.
        for w in (a, b):
            settled = w.worker.metrics.settled
            assert settled.labels("replay")._value.get() == 0
        own = sum(w.worker.metrics.settled.labels(source)._value.get()
                  for w in (a, b) for source in ("held", "mirror"))
        assert own == len(offline)
        for shard in h.shards:
            read = {w.consumer: w.worker.metrics.consumed.labels(str(shard.index), "read")
                    ._value.get() for w in (a, b)}
            owner = next(w.consumer for w in (a, b) if shard.index in w.worker.membership.owned)
            assert [c for c, n in read.items() if n] == [owner], (shard, read)
        await h.stop_all()
        assert await h.client.exists(h.ns.workers(h.group)) == 0  # both left
    compare_with_offline(outputs, offline, "2 workers, 4 shards")


async def test_the_shards_of_a_worker_that_stops_go_to_the_others(redis_url: str) -> None:
    async with Harness(redis_url, f"t{uuid.uuid4().hex[:8]}", SHARDS, worker_ttl=1.0) as h:
        a, b = await h.start_workers(2)
        await h.wait_for(lambda: len(a.worker.membership.live) == 2, 5, "a to see b")
        await h.stop_worker(b)  # leaves the live set on its way out
        await h.wait_for(lambda: a.worker.membership.owned == set(range(SHARDS)), 3,
                     "a to take every shard")
        arrival = _arrival("left", 100, 8)
        await h.add(arrival)
        await h.wait_merged(len(offline_results(arrival)))


async def test_the_shards_of_a_worker_that_dies_go_to_the_others(redis_url: str) -> None:
    async with Harness(redis_url, f"t{uuid.uuid4().hex[:8]}", SHARDS, worker_ttl=1.0) as h:
        a, b = await h.start_workers(2)
        await h.wait_for(lambda: len(a.worker.membership.live) == 2, 5, "a to see b")
        async def silent() -> None:
            pass

        b.worker.membership.leave = silent  # type: ignore[method-assign]
        b.task.cancel()  # dies without a word: no leave, no more beats
        h.workers.remove(b)
        started = time.monotonic()
        # Taken on a's first beat after b's last is a TTL old (about 1.2 s);
        # the deadline leaves room for a machine the rest of the suite loads.
        await h.wait_for(lambda: a.worker.membership.owned == set(range(SHARDS)), 15,
                         "a to take every shard")
        assert time.monotonic() - started > 0.5  # only once b's beats are older than the TTL
        arrival = _arrival("died", 100, 9)
        await h.add(arrival)
        await h.wait_merged(len(offline_results(arrival)))
        await b.client.aclose()


async def test_a_beat_loop_whose_cancel_a_library_dropped_still_ends() -> None:
    """On Python 3.11 a cancel that lands as redis-py's send completes is
    dropped (its ``asyncio.wait_for``, CPython gh-86296): the beat returned,
    the loop beat on, and a worker cancelled mid-beat looked alive forever."""
    entered = asyncio.Event()

    async def swallowing_beat(**_kw: Any) -> list[bytes]:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):  # as wait_for does, its future done
            await asyncio.sleep(10)
        return [b"w1"]

    membership = Membership(None, swallowing_beat, Namespace("t", SHARDS), "processor", "w1",
                            ttl=0.05, enabled=True, metrics=Metrics())
    task = asyncio.create_task(membership.run(asyncio.Event()))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=2)
    assert done and task.cancelled()


@pytest.mark.parametrize("topology", ["single", "cluster"])
async def test_a_shard_whose_live_owner_stalls_is_read_by_another(
    request: pytest.FixtureRequest, topology: str
) -> None:
    """A consumer that beats but never reads (a hung shard loop) owns a
    shard or more: after the TTL the real worker reads them anyway (on a
    Redis Cluster too, where the beat set and each shard sit on their own
    nodes)."""
    cluster = topology == "cluster"
    url = (request.getfixturevalue("redis_cluster") if cluster
           else request.getfixturevalue("redis_url"))
    url = url.url if cluster else url
    async with Harness(url, f"t{uuid.uuid4().hex[:8]}", SHARDS, worker_ttl=1.0,
                       cluster=cluster) as h:
        key = h.ns.workers(h.group)
        beat = h.client.register_script(source("beat_worker"))
        # A name that owns a shard beside the worker to come (named w1).
        ghost = next(g for g in (f"ghost{i}" for i in range(100))
                     if owned_shards(g, [g, "w1"], SHARDS))
        await beat(keys=[key], args=[ghost, 1000, "beat"])
        a = await h.start_worker()
        assert a.worker.membership.owned != set(range(SHARDS))  # the ghost owns some

        async def keep_beating() -> None:
            while True:
                await beat(keys=[key], args=[ghost, 1000, "beat"])
                await asyncio.sleep(0.1)

        beating = asyncio.create_task(keep_beating())
        try:
            arrival = _arrival("stall", 200, 10)
            await h.add(arrival)
            await h.wait_merged(len(offline_results(arrival)), timeout=30)
            assert ghost in a.worker.membership.live
            for s in set(range(SHARDS)) - a.worker.membership.owned:  # the ghost's shards
                assert a.worker.metrics.consumed.labels(str(s), "read")._value.get() > 0
        finally:
            beating.cancel()


def _has(running: Any, rid: str) -> bool:
    """Whether a worker holds the turn ``rid`` or has stored an entry."""
    held = any(key.response_id == rid for state in running.worker.shards
               for key in state.held_turns)
    return held or running.worker.metrics.stored._value.get() >= 1


async def test_a_cancel_on_a_dead_workers_shard_keeps_what_it_held(
    redis_url: str,
) -> None:
    """A worker holding a turn dies without a word; the turn is cancelled.
    Shards a worker does not read still get a sweep for cancels every beat,
    but the turn's update lives only in the dead holder's pending list and
    memory: publishing the cancel then (as before) published it empty and
    dropped the update when it was reclaimed. The cancel waits until the
    holder is taken for dead (its beats stopped for --worker-ttl), its
    pending entries are taken over at once (not after --reclaim-idle-ms) and
    applied, and is published with the update."""
    async with Harness(redis_url, f"t{uuid.uuid4().hex[:8]}", SHARDS, worker_ttl=2.0) as h:
        a, b = await h.start_workers(2)
        await h.wait_for(lambda: len(a.worker.membership.live) == 2, 5, "a to see b")
        theirs = sorted(b.worker.membership.owned)
        assert theirs, "b reads no shard: pick other names"
        await asyncio.sleep(0.5)  # a's reads already blocking when it saw b end
        rid = next(f"c{i}" for i in range(1000)
                   if h.shard_of({"response_id": f"c{i}"}).index == theirs[0])
        await h.add([{"response_id": rid, "update": '{"contents": [{"type": "text", '
                      '"text": "hi"}], "role": "assistant", "message_id": "m"}'}])
        await h.wait_for(lambda: _has(b, rid), 5, "b to hold or apply it")

        async def silent() -> None:
            pass

        b.worker.membership.leave = silent  # type: ignore[method-assign]
        b.task.cancel()  # dies without a word: its shards stay its own for 2 s
        h.workers.remove(b)
        await h.cancel(rid)
        await h.wait_merged(1, timeout=20)  # reclaim_idle_ms is 30 s: not waited for
        outputs = await h.outputs()
        assert outputs.merged_count == 1
        (turn,) = outputs.turns.values()
        assert turn.merged[0]["status"] == "cancelled"
        assert json.loads(turn.merged[0]["meta"])["counts"]["updates"] == 1
        assert "hi" in turn.merged[0]["response"]
        await b.client.aclose()


async def test_a_beat_failing_as_a_cluster_moves_a_slot_is_only_a_warning(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What redis-py's cluster client raises while a slot moves or a master
    fails over (an uncovered slot; its own AttributeError on a connection it
    closed under us) is an outage, as for every other Redis call: a warning
    and the next beat, not a failed step logged as a bug."""
    async with Harness(redis_url, f"t{uuid.uuid4().hex[:8]}", SHARDS, worker_ttl=0.5) as h:
        a = await h.start_worker()
        membership = a.worker.membership
        real, failures = membership._script, []
        unconnected = redis.asyncio.Connection()  # its writer is None

        async def hiccup(**_kwargs: object) -> None:
            failures.append(1)
            if len(failures) % 2:
                raise SlotNotCoveredError("slot 42 is not covered")
            await unconnected._send_packed_command([b"PING"])  # AttributeError in redis-py

        membership._script = hiccup  # type: ignore[assignment]
        with caplog.at_level(logging.WARNING, logger="processor.worker"):
            await h.wait_for(lambda: len(failures) >= 2, 3, "two beats to fail")
        membership._script = real
        assert a.worker.metrics.step_failures._value.get() == 0
        beats = [r for r in caplog.records if "heartbeat" in r.getMessage()]
        assert beats and {r.levelno for r in beats} == {logging.WARNING}
        h.assert_workers_alive()


async def test_a_failing_beat_is_counted_and_the_worker_goes_on(redis_url: str) -> None:
    async with Harness(redis_url, f"t{uuid.uuid4().hex[:8]}", SHARDS, worker_ttl=0.5) as h:
        a = await h.start_worker()
        membership = a.worker.membership
        real, failures = membership._script, []

        async def broken(**_kwargs: object) -> None:
            failures.append(1)
            raise RuntimeError("an odd reply")

        membership._script = broken  # type: ignore[assignment]
        await h.wait_for(lambda: failures, 3, "a beat to fail")
        membership._script = real
        assert a.worker.metrics.step_failures._value.get() >= 1
        arrival = _arrival("after", 50, 11)
        await h.add(arrival)
        await h.wait_merged(len(offline_results(arrival)))
        h.assert_workers_alive()


async def test_a_worker_cancelled_ends_even_if_a_part_dropped_the_cancel(
        redis_url: str) -> None:
    """Every loop of a worker sends Redis commands through redis-py, whose
    ``asyncio.wait_for`` may drop a cancel (Python 3.11, CPython gh-86296).
    A part that lost its cancel and looped on (here the cancel-request
    listener) outlived its cancelled ``Worker.run``, which ended as soon as
    another part did (``asyncio.gather``): a task still using the client,
    as the beat loop once kept a dead worker a member. The worker cancels
    its parts again until each has ended, and only then ends."""
    async with Harness(redis_url, f"t{uuid.uuid4().hex[:8]}", SHARDS) as h:
        worker = Worker(h.client, h.worker_config(consumer="w1"))
        dropped, ended = 0, asyncio.Event()

        async def listening(stopping: asyncio.Event) -> None:
            nonlocal dropped
            try:
                while True:
                    try:
                        await asyncio.sleep(0.02)
                    except asyncio.CancelledError:
                        if dropped:
                            raise
                        dropped += 1  # the cancel wait_for dropped
            finally:
                ended.set()

        worker.cancel_requests.run = listening  # type: ignore[method-assign]
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.ready.wait(), 10)
        await asyncio.sleep(0.1)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        assert done and task.cancelled()
        assert dropped == 1 and ended.is_set(), "a part outlived its worker"

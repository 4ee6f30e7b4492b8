"""Redis itself goes away under running workers: the private redis-server (AOF
on, ``appendfsync always``) is SIGKILLed, shut down cleanly, and SIGKILLed
again in the middle of a run, each time started again on the same port.

The workers (two in-process, one ``processor run`` subprocess) keep retrying
with backoff and resume; producers (``processor.client.Producer``) keep
sending through the outages with their retries and idempotency keys; a
``Subscriber`` follows the outputs across them. The run ends as if nothing
happened: every turn merged exactly once with one terminal event, equal to
``processor merge``, every entry sent once, nothing dead-lettered, no state
left behind, and the subscriber saw every output exactly once.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio
from support.lost_replies import has_text, lose_replies
from support.strategies import random_turn
from support.turn_reference import (
    compare_with_offline,
    end_entry,
    entry_fields,
    offline_results,
    text_delta,
)
from support.worker_harness import Harness

from processor.client import EventItem, MergedItem, Producer, RetryPolicy, Subscriber
from processor.embedded import EmbeddedRedis
from processor.redis_io.connections import TRANSIENT

FLAGS: dict[str, Any] = {
    # The default (30 s): resuming must not wait for idle entries to be
    # reclaimed (a read whose reply the outage lost is taken back at once).
    "reclaim_idle_ms": 30_000,
    "batch": 50,
    "compact_threshold": 16,  # compactions in flight when Redis dies, too
}
# Clients give up only after about 10 s of outage (each outage is about 1 s).
PATIENT = RetryPolicy(attempts=40, initial=0.05, max_wait=0.5)
# Every write waits for its fsync (appendfsync always): concurrent producers
# share them (Redis fsyncs once per event loop round).
PRODUCERS = 8


async def _send_all(producer: Producer, entries: list[dict[str, Any]], sent: Counter) -> None:
    """Send entries in order, one at a time, as a streaming agent would."""
    numbers: Counter[str] = Counter()
    for entry in entries:
        rid = entry["response_id"]
        numbers[rid] += 1
        key = f"{rid}:{numbers[rid]}"  # unique per entry: a retried send adds it once
        if entry.get("kind") == "end":
            await producer.end(rid, idempotency_key=key)
        else:
            ids = {k: entry[k] for k in ("session_id", "step_id") if k in entry}
            await producer.send(rid, entry["update"], ids=ids, idempotency_key=key)
        sent[rid] += 1


async def _outages(server: EmbeddedRedis, harness: Harness, total: int) -> list[str]:
    """SIGKILL, clean stop, SIGKILL: each once the run has made some progress."""
    done: list[str] = []
    for graceful, after in ((False, total // 5), (True, total // 2), (False, 3 * total // 4)):
        while await _merged_or_zero(harness) < after:
            await asyncio.sleep(0.05)
        if graceful:
            await server.astop()  # SIGTERM: Redis shuts down cleanly
        else:
            await server.akill()  # SIGKILL: only the fsynced AOF is left
        assert not server.running
        await asyncio.sleep(0.7)  # every client's calls fail meanwhile
        await server.astart()
        done.append("stop" if graceful else "kill")
    return done


async def _merged_or_zero(harness: Harness) -> int:
    try:
        return await harness.merged_count()
    except TRANSIENT:
        return 0


async def test_workers_resume_after_redis_restarts(
    make_redis_server: Callable[..., EmbeddedRedis], namespace: str, tmp_path
) -> None:
    server = make_redis_server(appendonly=True)
    rng = random.Random(41)
    turns = [random_turn(rng, f"rr-{i:03d}", max_messages=40) for i in range(80)]
    offline = offline_results([e for turn in turns for e in turn])
    shards = 2
    clients = [redis.asyncio.Redis.from_url(server.url) for _ in range(2)]
    producer = Producer(clients[0], namespace, shards, retry=PATIENT)
    subscriber = Subscriber(clients[1], namespace, shards, ("merged", "events"), block_ms=200,
                            retry=PATIENT)
    seen: list[Any] = []
    sent: Counter[str] = Counter()

    async def follow() -> None:
        async for item in subscriber:
            seen.append(item)

    async with Harness(server.url, namespace, shards, log_dir=tmp_path, **FLAGS) as harness:
        await harness.start_workers(2)
        sub = harness.spawn(log_level="info", **FLAGS)
        await harness.wait_started([sub])
        follower = asyncio.create_task(follow())
        outages = asyncio.create_task(_outages(server, harness, len(turns)))
        # Each producer streams its own turns, interleaved with one another.
        await asyncio.gather(*(
            _send_all(producer, [e for turn in turns[p::PRODUCERS] for e in turn], sent)
            for p in range(PRODUCERS)))
        assert await outages == ["kill", "stop", "kill"]
        # The test's own reader may hold connections from before the last
        # outage: start it afresh (the workers' clients recover on their own).
        await harness.client.aclose()
        harness.client = harness.connect()
        await harness.wait_merged(len(offline), timeout=120)
        await harness.wait_drained(timeout=60)
        harness.assert_workers_alive()
        outputs = await harness.outputs()
        leftover = await harness.state_keys()
        log = sub.log()
        await asyncio.sleep(0.5)  # the subscriber catches up
        subscriber.stop()
        await follower
    for client in clients:
        await client.aclose()

    assert sent == Counter({t[0]["response_id"]: len(t) for t in turns})
    compare_with_offline(outputs, offline, "after Redis restarts")
    assert outputs.merged_count == len(offline)
    assert sorted(outputs.terminal_counts().values()) == [1] * len(offline)
    assert outputs.dlq == [], outputs.dlq[:3]
    assert leftover == [], leftover
    assert "redis unavailable, retrying" in log  # the subprocess lived through it
    # The subscriber saw every output once, across the outages.
    merged = Counter(i.response_id for i in seen if isinstance(i, MergedItem))
    assert merged == Counter({key.response_id: 1 for key in offline})
    assert sum(isinstance(i, EventItem) for i in seen) == outputs.events_count
    assert len({(i.stream, i.id) for i in seen}) == len(seen)


@pytest.mark.parametrize("hold", [True, False], ids=["held", "stored"])
@pytest.mark.parametrize("where", ["step", "connection"])
async def test_a_lost_read_reply_is_taken_back_at_once(redis_url: str, namespace: str,
                                                       hold: bool, where: str) -> None:
    """Redis delivers a batch and the connection drops before the reply
    arrives: the entries sit in the worker's own pending list. The worker
    takes them back on its next read instead of waiting --reclaim-idle-ms
    (here 10 minutes) for a reclaim, which would hold the shard meanwhile.

    The reply is lost to the worker's step (``step``), or on the connection,
    below redis-py's own retries (``connection``): were redis-py to send the read again by
    itself, the second ``XREADGROUP >`` would deliver the entries after the
    lost ones, and the worker would not know of these until a reclaim
    (tests/redis_io/test_cluster.py has the cluster client's case)."""
    warm = [text_delta("warm", "x"), end_entry("warm")]
    entries = random_turn(random.Random(5), "lost-reply", max_messages=30)
    offline = offline_results(warm + entries)
    async with Harness(redis_url, namespace, reclaim_idle_ms=600_000,
                       hold_turns=hold) as harness:
        running = await harness.start_worker()
        # (A first turn: the worker is past its start, whose take-back would
        # find anything pending to it; its reclaims are minutes apart.)
        await harness.add(warm)
        await harness.wait_merged(1)
        # (Both reads come here: redis-py's xreadgroup, and read_raw's
        # XREADGROUP of a worker holding turns.)
        lost = lose_replies(
            running.client,
            lambda command, reply: (command[0] == "XREADGROUP" and command[-1] == ">"
                                    and bool(reply) and not lost),
            *(("execute_command", 0) if where == "step"
              else ("_send_command_parse_response", 1)))  # (after the connection)
        await harness.add(entries)
        await harness.wait_merged(2, timeout=20)
        await harness.wait_drained(timeout=20)
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    assert lost, "no reply was lost: the test did not test anything"
    compare_with_offline(outputs, offline, "after a lost reply")
    assert outputs.dlq == []


async def _lose_the_read_of_c(redis_url: str, namespace: str, text: str, *,
                              destroy_group: bool = False, **config: Any) -> None:
    """A held turn, one text delta per letter of ``text`` then its end, all
    in the stream at once (one ``MULTI``) and read two entries a batch, after
    a warm-up turn (the worker is past its start, whose take-back would find
    anything pending to it; its reclaims are minutes apart). The reply of the
    read holding ``c`` is lost (after an ``XGROUP DESTROY`` with
    ``destroy_group``): the turn must still merge as ``processor merge`` has it."""
    warm = [text_delta("warm", "x"), end_entry("warm")]
    entries = [*(text_delta("letters", c) for c in text), end_entry("letters")]
    offline = offline_results(warm + entries)
    async with Harness(redis_url, namespace, reclaim_idle_ms=600_000, hold_turns=True,
                       batch=2, **config) as harness:
        running = await harness.start_worker()
        await harness.add(warm)
        await harness.wait_merged(1)
        updates = harness.shards[0].updates

        async def the_read_of_c(args: tuple[Any, ...], reply: Any) -> bool:
            if args[0] != "XREADGROUP" or args[-1] != ">" or lost or not has_text(reply, "c"):
                return False
            if destroy_group:
                await harness.client.xgroup_destroy(updates, harness.group)
            return True

        lost = lose_replies(running.client, the_read_of_c)
        # Every entry in the stream before the worker's next read (one MULTI).
        async with harness.client.pipeline(transaction=True) as pipe:
            for entry in entries:
                pipe.xadd(updates, entry_fields(entry))
            await pipe.execute()
        await harness.wait_merged(2, timeout=20)
        await harness.wait_drained(timeout=20)
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    assert lost, "no reply was lost: nothing was tested"
    compare_with_offline(outputs, offline, "after a lost read reply")
    assert outputs.dlq == []


@pytest.mark.parametrize(("hold_ms", "text"),
                         [(600_000, "abcd"), (1, "abcdefgh"), (600_000, "abc")],
                         ids=["ended", "checkpointed", "end-lost"])
async def test_a_lost_read_is_taken_back_before_the_next_read(redis_url: str, namespace: str,
                                                              hold_ms: int, text: str) -> None:
    """The worker's retry does not send a read whose reply was lost again:
    that second ``XREADGROUP >`` would deliver the entries after the lost ones
    first. The reply of the batch ``cd`` is lost. Read again at once, the held
    turn was checkpointed with ``ef`` (``checkpointed``, ``--hold-ms 1``) and
    the taken-back ``cd`` replayed after them: ``abefcdgh``. Were the next
    read to hold the turn's end (``ended``), finalising it would wait for the
    take-back too (the held path spills a turn while entries it does not
    know of may be pending). Were the lost batch the last, with the turn's
    end (``end-lost``: ``c`` and the end), the take-back stores the end and
    the watermark must pass it, although no read delivered it (the floor,
    includes/watermark.lua, moves past what the take-back applied)."""
    await _lose_the_read_of_c(redis_url, namespace, text, hold_ms=hold_ms)


async def test_a_take_back_that_finds_the_group_gone_puts_it_back(redis_url: str,
                                                                 namespace: str) -> None:
    """A read's reply is lost and, before the take-back, the consumer group
    is destroyed (``XGROUP DESTROY``): the take-back's NOGROUP is handled as
    a read's is (continuity.py puts the group back at the newest entry the
    worker read, and the lost entries are delivered again), not a failed
    step repeated until another worker happens to put the group back."""
    await _lose_the_read_of_c(redis_url, namespace, "abcdefgh", destroy_group=True)


async def test_a_restarted_consumer_takes_back_its_pending_entries(
    redis_url: str, namespace: str
) -> None:
    """A worker restarted under the same consumer name (a fixed --consumer)
    applies what its previous life was delivered at once, not after
    --reclaim-idle-ms."""
    entries = random_turn(random.Random(6), "same-name", max_messages=30)
    offline = offline_results(entries)
    async with Harness(redis_url, namespace, reclaim_idle_ms=600_000) as harness:
        shard = harness.shards[0]
        await harness.client.xgroup_create(shard.updates, harness.group, id="0", mkstream=True)
        await harness.add(entries)
        # The previous life: read everything, then died.
        assert await harness.client.xreadgroup(harness.group, "fixed", {shard.updates: ">"})
        await harness.start_worker(consumer="fixed")
        await harness.wait_merged(1, timeout=20)
        await harness.wait_drained(timeout=20)
        outputs = await harness.outputs()
    compare_with_offline(outputs, offline, "taken back at start")
    assert outputs.dlq == []

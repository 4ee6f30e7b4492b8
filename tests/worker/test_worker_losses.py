"""Losses the worker's log never mentioned (issue 25 item 6), each against a
real redis-server:

- entries deleted from the stream while pending (a trim under a dead
  consumer): dead-lettered ``entry_lost``, counted, logged with their ids,
  and the turns that may have had them end as ``entries_lost``;
- ``XGROUP DESTROY`` under a holding worker: the group is put back where it
  was, the held entries pending again, nothing merged twice or dropped;
- every dead letter in the log, at warning, rate-limited, without its payload;
- the rules behind them (which turns a lost entry marks, what
  ``entries_lost`` ends, how a group is put back).

Redis restarted without persistence (``state_lost``) is
tests/worker/test_worker_state_lost.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from support.loss_runs import end, merged_of, metric, records, text_of, text_update, updates
from support.turn_reference import compare_with_offline, offline_results
from support.worker_harness import Harness

from processor.wire.ids import TurnKey
from processor.worker.metrics import DeadLetterLog
from processor.worker.worker import Worker

# --------------------------------------------------------------------------- 1. lost entries


async def test_entries_deleted_while_pending_are_dead_lettered_and_their_turns_marked(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Five turns started, then 50 entries (each of those turns' second update,
    and 45 updates of five turns that never started) delivered to a consumer
    that dies, and trimmed by someone; then the five ends. The reclaim finds
    the 50 deleted: 50 entry_lost dead letters, the metric, one warning with
    the ids, and the five turns end as entries_lost, not completed without
    their second update."""
    caplog.set_level(logging.INFO, logger="processor")
    turns = [f"t{i}" for i in range(5)]
    ghosts = [f"g{i}" for i in range(5)]
    async with Harness(redis_url, namespace, 1, hold_turns=False,
                       reclaim_idle_ms=300) as harness:
        first = await harness.start_worker()
        await harness.add([e for rid in turns for e in updates(rid, [f"{rid}-a "])])
        await harness.wait_applied()
        await harness.stop_worker(first)
        shard = harness.ns.shard(0)
        lost = await harness.add([e for rid in turns for e in updates(rid, [f"{rid}-b "])]
                                 + [e for rid in ghosts for e in updates(rid, ["x"] * 9)])
        taken = await harness.client.xreadgroup("processor", "dead", {shard.updates: ">"},
                                                count=100)
        assert len(taken[0][1]) == 50
        assert await harness.client.xdel(shard.updates, *lost) == 50  # trimmed under it
        await harness.add([end(rid) for rid in turns])
        second = await harness.start_worker()
        await harness.wait_merged(5, timeout=30)
        outputs = await harness.outputs()
    letters = [d for d in outputs.dlq if d["reason"] == "entry_lost"]
    assert sorted(d["source_id"] for d in letters) == sorted(lost)
    assert all(set(d) == {"reason", "detail", "source_id", "deliveries", "_id", "_shard"}
               for d in letters), letters[0]
    assert metric(second.worker, "processor_lost_entries_total", {"shard": "0"}) == 50
    assert metric(second.worker, "processor_dlq_entries_total", {"reason": "entry_lost"}) == 50
    (line,) = records(caplog, "entries deleted from the stream while pending")
    assert line.levelno == logging.WARNING
    assert line.count == 50 and set(line.entry_ids) <= set(lost) and line.entry_ids
    assert line.turns_marked == 5
    for rid in turns:
        merged = merged_of(outputs, rid)
        assert merged["status"] == "error", merged
        assert merged["meta"]["error"]["code"] == "entries_lost"
        assert text_of(merged["response"]) == f"{rid}-a "


async def test_own_entries_deleted_while_pending_are_dead_lettered_at_start(
    redis_url: str, namespace: str
) -> None:
    """A worker restarted under the same consumer name takes back its
    pending entries first; those deleted meanwhile are lost, and said so."""
    async with Harness(redis_url, namespace, 1) as harness:
        await harness.start_worker(consumer="fixed")
        await harness.stop_worker(harness.workers[0])
        shard = harness.ns.shard(0)
        lost = await harness.add(updates("gone", ["a", "b", "c"]))
        await harness.client.xreadgroup("processor", "fixed", {shard.updates: ">"}, count=10)
        await harness.client.xdel(shard.updates, *lost)
        running = await harness.start_worker(consumer="fixed")
        await harness.wait_for(lambda: metric(running.worker, "processor_lost_entries_total",
                                              {"shard": "0"}) == 3, 10, "3 lost entries")
        outputs = await harness.outputs()
    assert sorted(d["source_id"] for d in outputs.dlq if d["reason"] == "entry_lost") == sorted(
        lost)


# --------------------------------------------------------------------------- 3. group destroyed


async def test_a_destroyed_group_is_put_back_without_replaying_or_losing_anything(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Five turns held (their entries pending, so the stream keeps every
    entry after them), twenty turns published after them; then XGROUP
    DESTROY, then the held turns' rest and five new turns. Every turn is
    merged once, as processor merge merges it; nothing is replayed as
    turn_closed, nothing held is dropped; one error line and the metric."""
    caplog.set_level(logging.INFO, logger="processor")
    held = [f"h{i}" for i in range(5)]
    done = [f"d{i}" for i in range(20)]
    fresh = [f"n{i}" for i in range(5)]
    first_part = [e for rid in held for e in updates(rid, [f"{rid}-{n} " for n in range(5)])]
    published = [e for rid in done for e in [*updates(rid, ["x ", "y "]), end(rid)]]
    rest = ([e for rid in held for e in [*updates(rid, [f"{rid}-{n} " for n in range(5, 8)]),
                                         end(rid)]]
            + [e for rid in fresh for e in [*updates(rid, ["z"]), end(rid)]])
    async with Harness(redis_url, namespace, 1, worker_ttl=0.5) as harness:
        running = await harness.start_worker()
        await harness.add(first_part)
        await harness.wait_for(lambda: len(running.worker.shard(0).held_turns) == 5, 10, "held")
        await harness.add(published)
        await harness.wait_merged(20)
        shard = harness.ns.shard(0)
        assert await harness.client.xlen(shard.updates) >= len(first_part) + len(published)
        await harness.client.xgroup_destroy(shard.updates, "processor")

        async def held_pending_again() -> bool:
            try:
                summary = await harness.client.xpending(shard.updates, "processor")
            except Exception:
                return False  # no group yet
            return summary["pending"] == len(first_part)

        # Put back at once by the worker's next read, its held entries pending again.
        await harness.wait_for(held_pending_again, 10, "the held entries pending again")
        await harness.add(rest)
        await harness.wait_merged(30)
        await harness.wait_drained()
        outputs = await harness.outputs()
    assert outputs.dlq == [], outputs.dlq[:3]
    compare_with_offline(outputs, offline_results(first_part + published + rest),
                         "group destroyed")
    (line,) = records(caplog, "consumer group vanished")
    assert line.levelno == logging.ERROR and line.restored == len(first_part)
    assert metric(running.worker, "processor_groups_recreated_total", {"shard": "0"}) == 1


# --------------------------------------------------------------------------- 4. dead letters


async def test_dead_letters_are_logged_at_warning_once_per_reason_without_payload(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="processor")
    secret = "SECRET-PAYLOAD"
    bad = [{"response_id": f"bad{i}", "update": "{not json " + secret} for i in range(30)]
    keyless = [{"update": json.dumps(text_update(secret))} for _ in range(2)]
    async with Harness(redis_url, namespace, 1, batch=5) as harness:
        await harness.start_worker()
        ids = await harness.add(bad + keyless, chunk=5)
        await harness.wait_for(lambda: harness.client.xlen(harness.ns.shard(0).dlq),
                               10, "dead letters")
        await harness.wait_applied()
    lines = records(caplog, "entries dead-lettered")
    by_reason = {line.reason: line for line in lines}
    assert sorted(line.reason for line in lines) == ["bad_encoding", "missing_turn_key"]
    invalid = by_reason["bad_encoding"]
    assert invalid.levelno == logging.WARNING and invalid.shard == 0
    assert invalid.entry_ids and set(invalid.entry_ids) <= set(ids[:30])
    assert set(invalid.turns) <= {f"bad{i}" for i in range(30)} and invalid.turns
    assert set(by_reason["missing_turn_key"].entry_ids) <= set(ids[30:])
    for line in lines:
        assert secret not in json.dumps(line.__dict__, default=str)


def test_the_dead_letter_log_says_how_many_it_left_out() -> None:
    now = [0.0]
    log = DeadLetterLog(every=10.0, max_ids=2, clock=lambda: now[0])
    seen: list[dict[str, Any]] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.__dict__)

    handler = Catch()
    logging.getLogger("processor.dlq").addHandler(handler)
    try:
        log.note("too_large", 1, 3, ["1-0", "2-0", "3-0"])
        log.note("too_large", 1, 4)
        now[0] = 9.9
        log.note("too_large", 0, 1, ["4-0"])
        log.note("bad_encoding", 0, 1, ["5-0"])  # another reason: its own line
        now[0] = 10.0
        log.note("too_large", 2, 2, ["6-0", "7-0"])
    finally:
        logging.getLogger("processor.dlq").removeHandler(handler)
    assert [(r["reason"], r["count"], r["entry_ids"], r["not_logged"]) for r in seen] == [
        ("too_large", 3, ["1-0", "2-0"], 0),
        ("bad_encoding", 1, ["5-0"], 0),
        ("too_large", 2, ["6-0", "7-0"], 5),
    ]


# --------------------------------------------------------------------------- the rules (pure)


def test_the_turns_marked_for_a_lost_entry_are_those_open_when_it_was_written() -> None:
    from processor.scripts.lost_calls import lost_turns_of
    from processor.wire.ids import TurnKey

    def padded(entry_id: str) -> str:  # as includes/pad_id.lua writes `ended`
        ms, seq = entry_id.split("-")
        return f"{int(ms):020d}-{int(seq):020d}"

    active = {
        TurnKey("open"): (100, ""),  # started before, not ended: may have had it
        TurnKey("same-ms"): (200, ""),  # started in the lost entry's millisecond
        TurnKey("ended-before"): (100, padded("150-0")),  # its end came first
        TurnKey("ended-after"): (100, padded("250-0")),  # still open when it was written
        TurnKey("later"): (201, ""),  # started after: not marked (documented limit)
    }
    assert sorted(k.response_id for k in lost_turns_of(["200-3"], active)) == [
        "ended-after", "open", "same-ms"]
    assert lost_turns_of(["50-0"], active) == []
    assert sorted(k.response_id for k in lost_turns_of(["50-0", "160-0"], active)) == [
        "ended-after", "open"]


def test_entries_lost_ends_a_completed_or_timed_out_turn_only() -> None:
    from processor.engine.events import Outcome
    from processor.engine.lifecycle import TurnLife
    from processor.wire.ids import TurnKey

    cases = {
        "completed": (Outcome.completed(), "entries_lost"),
        "timeout": (Outcome.failed("turn_timeout", "no entry"), "entries_lost"),
        "cancelled": (Outcome.cancelled(), None),
        "producer": (Outcome.failed("producer_error", "model down"), "producer_error"),
        "limit": (Outcome.failed("turn_limit", "too big"), "turn_limit"),
    }
    for name, (outcome, code) in cases.items():
        life = TurnLife(TurnKey(name))
        life.outcome = outcome
        life.entries_lost("5-0")
        assert life.outcome is not None
        assert (life.outcome.error.code if life.outcome.error else None) == code, name
        life.state_lost()  # whatever it came to: state_lost
        assert life.outcome.error is not None and life.outcome.error.code == "state_lost"


async def test_a_group_is_put_back_never_below_what_a_worker_read(
    async_redis_client: Any, namespace: str
) -> None:
    """recreate_group.lua: missing -> created at the id given; put back lower
    by someone else -> raised to it; higher already -> kept; and the ids
    given pending to the caller again in each case (those still in the stream)."""
    from processor.scripts import Scripts
    from processor.wire.keys import Namespace

    stream = Namespace(namespace).shard(0).updates
    ids = [await async_redis_client.xadd(stream, {"n": str(i)}, id=f"{i}-0")
           for i in range(1, 6)]
    script = Scripts(async_redis_client).recreate_group

    async def put_back(last: str, *mine: str) -> list[Any]:
        status, delivered, claimed = await script(keys=[stream],
                                                  args=["g", last, "me", *mine])
        info = {g["name"]: g for g in await async_redis_client.xinfo_groups(stream)}
        return [status.decode(), delivered.decode(), claimed,
                info[b"g"]["last-delivered-id"].decode()]

    assert await put_back("3-0", "2-0", "3-0", "9-0") == ["created", "3-0", 2, "3-0"]
    await async_redis_client.xgroup_destroy(stream, "g")
    await async_redis_client.xgroup_create(stream, "g", id="1-0")  # someone else, lower
    assert await put_back("4-0", "4-0") == ["raised", "4-0", 1, "4-0"]
    assert await put_back("2-0") == ["kept", "4-0", 0, "4-0"]
    pending = await async_redis_client.xpending_range(stream, "g", min="-", max="+", count=10)
    assert sorted(p["message_id"] for p in pending) == [ids[3]]  # (2-0, 3-0 went with the group)
    assert {p["consumer"] for p in pending} == {b"me"}


async def test_a_departed_workers_entry_another_worker_applied_first_is_not_lost(
    redis_url: str, namespace: str
) -> None:
    """Two workers take over a dead consumer's pending entry at once: one
    lists it (XPENDING), the other claims, applies, acks it and trims it
    away, then the first's XCLAIM gets nothing for it. It was merged, not
    lost: no entry_lost dead letter, and the turn is not marked (it ends
    completed with both updates, not entries_lost)."""
    async with Harness(redis_url, namespace, 1, hold_turns=False, worker_ttl=0.3,
                       reclaim_idle_ms=60_000) as harness:
        first = await harness.start_worker()
        await harness.add(updates("t", ["a "]))
        await harness.wait_applied()
        await harness.stop_worker(first)
        shard = harness.ns.shard(0)
        await harness.add(updates("t", ["b "]))
        taken = await harness.client.xreadgroup("processor", "dead", {shard.updates: ">"},
                                                count=10)
        assert len(taken[0][1]) == 1
        await asyncio.sleep(0.4)  # "dead" idle past the worker TTL: departed
        # The slow worker, driven by hand: between its XPENDING and its XCLAIM
        # another worker takes the entry over and applies it.
        client = harness.connect(socket_timeout=10)
        slow = Worker(client, harness.worker_config())
        real_xclaim = client.xclaim

        async def xclaim_after_the_other(*args: Any, **kwargs: Any) -> Any:
            await harness.start_worker()
            await harness.wait_applied()
            return await real_xclaim(*args, **kwargs)

        client.xclaim = xclaim_after_the_other
        await slow.recovery.claim_departed(shard)
        await client.aclose()
        assert await harness.client.hget(shard.turn(TurnKey("t").encode()), "lost") is None
        await harness.add([end("t")])
        await harness.wait_merged(1, timeout=30)
        outputs = await harness.outputs()
    assert [d for d in outputs.dlq if d["reason"] == "entry_lost"] == []
    merged = merged_of(outputs, "t")
    assert merged["status"] == "completed", merged["meta"]
    assert text_of(merged["response"]) == "a b "

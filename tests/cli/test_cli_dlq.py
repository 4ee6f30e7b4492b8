"""`processor dlq list|show|replay` on real poison entries from live workers:
after fixing and replaying, the turn merges as if the fixed entry had been
sent, and the DLQ entry is gone; replay is refused (and changes nothing)
when the entry would only come back to the DLQ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ResponseError
from support.big_entries import big_update, uris_of
from support.cli_tools import arun, call, json_lines, plain_rows
from support.records import init_namespace_sync
from support.turn_reference import offline_results
from support.worker_harness import Harness

from processor.engine.lifecycle import Limits
from processor.scripts import source
from processor.scripts.dlq import DlqError, replay, split
from processor.wire.ids import TurnKey, shard_of
from processor.wire.keys import Namespace

SHARDS = 2


def _update(text: str) -> str:
    return json.dumps({"type": "agent_response_update", "role": "assistant",
                       "message_id": "m", "contents": [{"type": "text", "text": text}]})


async def _dlq(harness: Harness) -> list[dict[str, str]]:
    return (await harness.outputs()).dlq


async def test_fix_and_replay_a_poison_entry(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    cli = (redis_url, namespace, SHARDS)
    async with Harness(redis_url, namespace, SHARDS) as harness:
        await harness.start_worker()
        ids = await harness.add([
            {"response_id": "fixme", "update": _update("Hello ")},
            {"response_id": "fixme", "update": '{"contents": [{"type": "text", "text": 5}]}'},
            {"response_id": "other", "update": "{not json"},
        ])
        await harness.wait_applied()
        letters = await _dlq(harness)
        assert len(letters) == 2

        code, out, err = await arun(*cli, "dlq", "list", "--json", "--width", "20")
        assert code == 0, err
        listed = {d["source_id"]: d for d in json_lines(out)}
        assert set(listed) == {ids[1], ids[2]}
        poison = listed[ids[1]]
        assert poison["reason"] == "invalid_update"
        assert "$.update.contents[0].text" in poison["detail"]
        assert poison["turn"] == "fixme" and poison["deliveries"] == "1"
        assert poison["shard"] == shard_of("fixme", SHARDS)
        assert len(poison["fields"]["update"]) <= 20  # a bounded prefix
        assert listed[ids[2]]["reason"] == "bad_encoding"

        code, table, err = await arun(*cli, "dlq", "list")
        assert code == 0, err
        rows = {row[1]: row for row in plain_rows(table)}
        assert rows[poison["id"]][2:6] == ["invalid_update", ids[1], "fixme", "1"]
        code, out, err = await arun(*cli, "dlq", "list", "--reason", "bad_encoding", "--json")
        assert [d["source_id"] for d in json_lines(out)] == [ids[2]]

        # show: every field in full; --original: what a fix starts from.
        code, out, err = await arun(*cli, "dlq", "show", poison["id"], "--json")
        assert code == 0, err
        full = json.loads(out)
        assert full["fields"]["update"] == '{"contents": [{"type": "text", "text": 5}]}'
        assert full["source_id"] == ids[1]
        code, out, err = await arun(*cli, "dlq", "show", poison["id"], "--original")
        original = json.loads(out)
        assert original == {"response_id": "fixme",
                            "update": '{"contents": [{"type": "text", "text": 5}]}'}
        code, out, err = await arun(*cli, "dlq", "show", poison["id"])
        assert "invalid_update" in out and '"text": 5' in out

        # Replayed as it is, it would fail again: refused, nothing changes.
        code, out, err = await arun(*cli, "dlq", "replay", poison["id"])
        assert code == 1
        assert "would be dead-lettered again: invalid_update" in err
        assert len(await _dlq(harness)) == 2

        fixed = {"response_id": "fixme", "update": json.loads(_update("big "))}
        (tmp_path / "fix.json").write_text(json.dumps(fixed))
        code, out, err = await arun(*cli, "dlq", "replay", poison["id"], "--from-file",
                                    str(tmp_path / "fix.json"))
        assert code == 0, err
        assert out.startswith(f"replayed {poison['id']} of shard {poison['shard']} as ")
        assert [d["source_id"] for d in await _dlq(harness)] == [ids[2]]

        await harness.add([{"response_id": "fixme", "update": _update("world")},
                           {"response_id": "fixme", "kind": "end"}])
        await harness.wait_merged(1)
        await harness.wait_drained()
        outputs = await harness.outputs()

    want = offline_results([
        {"response_id": "fixme", "update": _update("Hello ")},
        {"response_id": "fixme", "update": _update("big ")},
        {"response_id": "fixme", "update": _update("world")},
        {"response_id": "fixme", "kind": "end"},
    ])[TurnKey("fixme", "")]
    got = outputs.turns[TurnKey("fixme", "")]
    assert len(got.merged) == 1 and got.merged[0]["status"] == "completed"
    assert got.response == want.response
    assert json.loads(got.response)["messages"][0]["contents"][0]["text"] == "Hello big world"


async def test_replay_puts_the_original_fields_back(redis_url: str, namespace: str) -> None:
    """An entry too large for a worker's limit; the limit is raised, the entry
    replayed unchanged: its original fields (not the DLQ's) are back, and it merges."""
    cli = (redis_url, namespace, SHARDS)
    big = _update("x" * 400)
    async with Harness(redis_url, namespace, SHARDS) as harness:
        small = await harness.start_worker(limits=Limits(max_entry_bytes=300))
        await harness.add([{"response_id": "big", "session_id": "s1", "update": big}])
        await harness.wait_applied()
        await harness.stop_worker(small)
        [letter] = await _dlq(harness)
        assert letter["reason"] == "too_large"

        code, _, err = await arun(*cli, "dlq", "replay", letter["_id"])
        assert code == 0, err
        shard = harness.ns.shard(int(letter["_shard"]))
        [(_, fields)] = await harness.client.xrange(shard.updates)
        assert fields == {b"response_id": b"big", b"session_id": b"s1", b"update": big.encode()}
        assert await harness.client.xlen(shard.dlq) == 0

        await harness.start_worker()
        await harness.add([{"response_id": "big", "kind": "end"}])
        await harness.wait_merged(1)
        outputs = await harness.outputs()
    merged = outputs.turns[TurnKey("big", "")].merged[0]
    assert merged["status"] == "completed"
    assert json.loads(merged["response"])["messages"][0]["contents"][0]["text"] == "x" * 400
    assert json.loads(merged["meta"])["ids"] == {"session_id": "s1"}


async def test_replay_refuses_an_entry_of_an_ended_turn(redis_url: str, namespace: str) -> None:
    cli = (redis_url, namespace, SHARDS)
    async with Harness(redis_url, namespace, SHARDS) as harness:
        await harness.start_worker()
        await harness.add([{"response_id": "over", "update": _update("a")},
                           {"response_id": "over", "kind": "end"}])
        await harness.wait_merged(1)
        await harness.add([{"response_id": "over", "update": _update("late")}])
        await harness.wait_applied()
        [letter] = await _dlq(harness)
        assert letter["reason"] == "turn_closed"
        code, _, err = await arun(*cli, "dlq", "replay", letter["_id"])
        assert code == 1 and "already ended" in err
        assert len(await _dlq(harness)) == 1
        # --all goes through the same checks.
        code, _, err = await arun(*cli, "dlq", "replay", "--all")
        assert code == 1 and "already ended" in err
        assert len(await _dlq(harness)) == 1


async def test_replay_script_is_all_or_nothing(async_redis_client: Any, namespace: str) -> None:
    """The Lua step: a missing, truncated or foreign DLQ entry changes nothing."""
    keys = Namespace(namespace, 1)
    shard = keys.shard(0)
    client = async_redis_client
    script = client.register_script(source("replay_dead_letter"))
    added = {"reason": "too_large", "detail": "d", "source_id": "1-0", "deliveries": "1"}
    cut = (await client.xadd(shard.dlq, {"response_id": "r", **added, "truncated": "1"})).decode()
    foreign = (await client.xadd(shard.dlq, {"response_id": "r", "note": "hand-made"})).decode()
    packed = (await client.xadd(shard.dlq, {"packed_fields": b"\x90", **added,
                                            "packed": "1"})).decode()
    for entry_id, error in [(cut, "TRUNCATED"), (foreign, "NOTDEADLETTER"),
                            ("9-9", "NODEADLETTER"), (packed, "PACKED")]:
        with pytest.raises(ResponseError, match=error):
            await script(keys=[shard.dlq, shard.updates], args=[entry_id])
    assert await client.xlen(shard.updates) == 0 and await client.xlen(shard.dlq) == 3
    letter = split(0, packed, (await client.xrange(shard.dlq, packed, packed))[0][1])
    with pytest.raises(DlqError, match="more fields than one replay"):
        await replay(client, keys, letter)
    await client.xdel(shard.dlq, packed)

    # Through dlq.replay: the truncated entry is refused before the script, and
    # goes back with fixed fields.
    letter = split(0, cut, (await client.xrange(shard.dlq, cut, cut))[0][1])
    assert letter.truncated and letter.original_fields() == {"response_id": "r"}
    with pytest.raises(DlqError, match="truncated when stored"):
        await replay(client, keys, letter)
    new_id = await replay(client, keys, letter, [("response_id", "r"), ("kind", "end")])
    [(got_id, fields)] = await client.xrange(shard.updates)
    assert (got_id.decode(), fields) == (new_id, {b"response_id": b"r", b"kind": b"end"})
    assert [i.decode() for i, _ in await client.xrange(shard.dlq)] == [foreign]


def test_dlq_bad_arguments_give_one_line(
    redis_url: str, namespace: str, tmp_path: Path, capsys: Any, redis_client: Any
) -> None:
    init_namespace_sync(redis_client, namespace, SHARDS)
    cases = [
        (["dlq", "replay"], 2, "give DLQ entry ids or --all"),
        (["dlq", "replay", "1-0", "2-0", "--from-file", "x.json"], 2, "exactly one"),
        (["dlq", "replay", "1-0", "--from-file", str(tmp_path / "none.json")], 2, "cannot read"),
        (["dlq", "show", "1-0"], 2, "no dead letter 1-0"),
        (["dlq", "show", "latest"], 2, "'latest' is not an entry id"),
        (["dlq", "list", "--shard", "5"], 2, "--shard 5 is not one of the 2 shard(s)"),
    ]
    (tmp_path / "bad.json").write_text("[1, 2]")
    cases.append((["dlq", "replay", "1-0", "--from-file", str(tmp_path / "bad.json")], 2,
                  "must be a non-empty JSON object"))
    for args, status, message in cases:
        code, _, err = call(capsys, redis_url, namespace, SHARDS, *args)
        assert code == status, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, err)
        assert lines[0].startswith("processor dlq")


async def test_replay_on_a_redis_cluster(
    redis_cluster: Any, namespace: str, tmp_path: Path
) -> None:
    """The DLQ and the updates stream of a shard share a hash tag: one script moves
    the entry on whichever master holds the shard."""
    shards = 3
    cli = (redis_cluster.url, namespace, shards)
    async with Harness(redis_cluster.url, namespace, shards, cluster=True) as harness:
        await harness.start_worker()
        # One turn per shard (so per master): each replay runs on its own node.
        turns = [next(f"k{i}" for i in range(100) if shard_of(f"k{i}", shards) == s)
                 for s in range(shards)]
        await harness.add([{"response_id": t, "update": "{broken"} for t in turns])
        await harness.wait_applied()
        code, out, err = await arun(*cli, "dlq", "list", "--json")
        assert code == 0, err
        letters = json_lines(out)
        assert sorted(d["turn"] for d in letters) == sorted(turns)
        assert {d["shard"] for d in letters} == set(range(shards))
        for letter in letters:
            path = tmp_path / f"{letter['turn']}.json"
            path.write_text(json.dumps({"response_id": letter["turn"],
                                        "update": json.loads(_update(letter["turn"]))}))
            code, _, err = await arun(*cli, "dlq", "replay", letter["id"], "--shard",
                                      str(letter["shard"]), "--from-file", str(path))
            assert code == 0, err
        assert not (await harness.outputs()).dlq
        await harness.add([{"response_id": t, "kind": "end"} for t in turns])
        await harness.wait_merged(len(turns))
        outputs = await harness.outputs()
    for t in turns:
        [merged] = outputs.turns[TurnKey(t, "")].merged
        assert json.loads(merged["response"])["messages"][0]["contents"][0]["text"] == t


@pytest.mark.parametrize("error", [RuntimeError, MemoryError])
async def test_a_large_valid_entry_is_dead_lettered_whole_and_replayed(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    """A valid 0.93 MB entry dead-lettered (``max_deliveries``: decoding it
    fails, as a bug or a MemoryError would) keeps every field as the
    producer wrote it, so ``dlq replay`` brings it back byte for byte and it
    merges whole (the DLQ used to keep 64 KiB of it, marked truncated, which
    replay refuses: the entry was lost)."""
    import processor.scripts.stored_calls

    real = processor.scripts.stored_calls.decode_stream_entry

    def failing(fields: Any, **kw: Any) -> Any:
        if b"poison" in fields:
            raise error("this entry always fails")
        return real(fields, **kw)

    monkeypatch.setattr(processor.scripts.stored_calls, "decode_stream_entry", failing)
    big = {**big_update("whole", 0), "session_id": "s1", "poison": "1"}
    cli = (redis_url, namespace, SHARDS)
    # (Stored from its first delivery: the stored path decodes it, and fails,
    # at each one; a held turn is decoded once, by the held path.)
    async with Harness(redis_url, namespace, SHARDS, reclaim_idle_ms=100,
                       max_deliveries=2, hold_turns=False) as harness:
        worker = await harness.start_worker()
        [source_id] = await harness.add([big])
        await harness.wait_applied()
        await harness.stop_worker(worker)
        [letter] = await _dlq(harness)
        assert letter["reason"] == "max_deliveries" and letter["source_id"] == source_id
        assert "truncated" not in letter and "packed" not in letter
        assert {k: letter[k] for k in big} == big

        code, _, err = await arun(*cli, "dlq", "replay", letter["_id"])
        assert code == 0, err
        shard = harness.ns.shard(int(letter["_shard"]))
        [(_, fields)] = await harness.client.xrange(shard.updates)
        assert fields == {k.encode(): v.encode() for k, v in big.items()}
        assert await harness.client.xlen(shard.dlq) == 0

        monkeypatch.undo()
        await harness.start_worker()
        await harness.add([{"response_id": "whole", "kind": "end"}])
        await harness.wait_merged(1)
        outputs = await harness.outputs()
    merged = outputs.turns[TurnKey("whole", "")].merged[0]
    assert merged["status"] == "completed"
    assert uris_of(merged["response"]) == [json.loads(big["update"])["contents"][0]["uri"]]

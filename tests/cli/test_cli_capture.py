"""`processor capture` as a user runs it: it follows the input streams while
live workers merge them, takes nothing from the workers, and writes what
`processor merge` reads: merging the capture gives what the workers
published, turn for turn. One turn's capture stops by itself at the turn's
end, or writes the cancel line when the turn is cancelled."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
from support.cli_tools import ENV, arun, command, json_lines
from support.records import init_namespace
from support.worker_harness import Harness

from processor.wire.ids import TurnKey, shard_of

SHARDS = 2


def _update(text: str, message_id: str = "m") -> dict[str, Any]:
    return {"type": "agent_response_update", "role": "assistant", "message_id": message_id,
            "contents": [{"type": "text", "text": text}]}


def _entries(prefix: str) -> list[dict[str, Any]]:
    """Turns of every kind: completed (one with a msgpack update and an
    attempt), failed, one with a dead letter, interleaved as producers would."""
    ok, bad, mixed = f"{prefix}-ok", f"{prefix}-bad", f"{prefix}-mixed"
    return [
        {"response_id": ok, "update": _update("Hello ", "m1")},
        {"response_id": bad, "update": _update("partial")},
        {"response_id": mixed, "attempt_id": "a2", "enc": "msgpack",
         "update": msgspec.msgpack.encode(_update("packed "))},
        {"response_id": ok, "update": _update("world", "m2")},
        {"response_id": mixed, "attempt_id": "a2", "update": "{not json"},
        {"response_id": bad, "kind": "error", "error": "model overloaded", "code": "503"},
        {"response_id": mixed, "attempt_id": "a2", "update": _update("and plain")},
        {"response_id": ok, "kind": "end"},
        {"response_id": mixed, "attempt_id": "a2", "kind": "end"},
    ]


async def _start(url: str, namespace: str, *args: str) -> asyncio.subprocess.Process:
    """A capture that has started reading (its note is on stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *command(url, namespace, SHARDS, "capture", *args), env=ENV,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    note = await asyncio.wait_for(proc.stderr.readline(), 30)
    assert note.startswith(b"capturing the input of"), note
    return proc


async def _finish(proc: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def _merge(path: Path) -> dict[TurnKey, dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "processor.cli", "merge", str(path), env=ENV,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out_bytes, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    out = out_bytes.decode()
    return {TurnKey(line["response_id"], line["attempt_id"] or ""): line
            for line in json_lines(out)}


def _same_as_published(merged: dict[TurnKey, dict[str, Any]], published: Any) -> None:
    assert set(merged) == {key for key, turn in published.turns.items() if turn.merged}
    for key, line in merged.items():
        got = published.turns[key]
        assert line["status"] == got.merged[0]["status"], key
        assert line["response"] == json.loads(got.response), key


async def _lines(proc: asyncio.subprocess.Process, n: int) -> list[str]:
    """The next ``n`` lines the capture writes."""
    assert proc.stdout is not None
    lines = []
    for _ in range(n):
        try:
            lines.append((await asyncio.wait_for(proc.stdout.readline(), 30)).decode())
        except TimeoutError:
            proc.send_signal(signal.SIGINT)
            raise AssertionError((lines, await proc.communicate())) from None
    return lines


async def test_merge_of_a_capture_is_what_the_workers_published(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """The entries are captured as they arrive, before the workers (which
    delete what they applied) start: what a capture reads then does not race
    them, and the workers still get every entry."""
    entries = _entries("c")
    async with Harness(redis_url, namespace, SHARDS) as harness:
        await init_namespace(harness.client, namespace, SHARDS)  # as processor init would
        capture = await _start(redis_url, namespace)
        ids = await harness.add(entries)
        out = "".join(await _lines(capture, len(entries)))
        await harness.start_worker()
        await harness.wait_merged(3)
        await harness.wait_drained()
        published = await harness.outputs()
        capture.send_signal(signal.SIGINT)
        code, rest, err = await _finish(capture)
        assert (code, rest) == (0, ""), err
        assert not await harness.state_keys(), "the workers finished every turn"

    # One line per entry, as sent: its id, then its fields as text (the msgpack
    # update as JSON text, without its enc field).
    lines = json_lines(out)
    assert sorted(line["id"] for line in lines) == sorted(ids)
    by_id = {line.pop("id"): line for line in lines}
    for entry_id, entry in zip(ids, entries, strict=True):
        want = {k: (json.dumps(v) if k == "update" and isinstance(v, dict) else v)
                for k, v in entry.items()}
        if want.get("enc") == "msgpack":
            del want["enc"]
            want["update"] = json.dumps(msgspec.msgpack.decode(want["update"]))
        got = by_id[entry_id]
        if "update" in want and want["update"] != "{not json":
            got["update"], want["update"] = json.loads(got["update"]), json.loads(want["update"])
        assert got == want, entry_id
    assert len(published.dlq) == 1

    (tmp_path / "captured.jsonl").write_text(out)
    _same_as_published(await _merge(tmp_path / "captured.jsonl"), published)


async def test_capture_of_one_turn_stops_at_its_end_or_cancel(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    async with Harness(redis_url, namespace, SHARDS) as harness:
        await init_namespace(harness.client, namespace, SHARDS)
        done = await _start(redis_url, namespace, "--turn", "one-ok")
        gone = await _start(redis_url, namespace, "--turn", "one-gone")
        await harness.add([
            {"response_id": "one-ok", "update": _update("Hi ")},
            {"response_id": "one-other", "update": _update("not this one")},
            {"response_id": "one-gone", "update": _update("never mind")},
            {"response_id": "one-ok", "update": _update("there")},
            {"response_id": "one-ok", "kind": "end"},
        ])
        code, out, err = await _finish(done)  # stops by itself at the end entry
        assert code == 0, err
        await harness.start_worker()
        await harness.wait_merged(1)
        await harness.wait_applied()
        await harness.cancel("one-gone", reason="user pressed stop")
        code, cancelled, err = await _finish(gone)  # stops by itself at the cancel
        assert code == 0, err
        await harness.wait_merged(2)
        published = await harness.outputs()
    assert [line["response_id"] for line in json_lines(out)] == ["one-ok"] * 3
    assert json_lines(cancelled)[-1] == {"response_id": "one-gone", "kind": "cancel",
                                         "reason": "user pressed stop"}
    (tmp_path / "ok.jsonl").write_text(out)
    (tmp_path / "gone.jsonl").write_text(cancelled)
    merged = {**await _merge(tmp_path / "ok.jsonl"), **await _merge(tmp_path / "gone.jsonl")}
    assert merged[TurnKey("one-gone")]["status"] == "cancelled"
    assert merged[TurnKey("one-gone")]["meta"]["cancel_reason"] == "user pressed stop"
    _same_as_published(merged, published)


async def test_entries_deleted_before_the_capture_read_them_are_reported(
    redis_url: str, namespace: str, redis_server: Any
) -> None:
    """Entries added after the position and deleted unread make the capture
    incomplete: it says so and exits 1 (Redis 7 tells; Redis 6.2 cannot)."""
    async with Harness(redis_url, namespace, SHARDS) as harness:
        await init_namespace(harness.client, namespace, SHARDS)
        rid = "gap"
        ids = await harness.add([{"response_id": rid, "update": _update(str(i))}
                                 for i in range(3)])
        stream = harness.ns.shard(shard_of(rid, SHARDS)).updates
        await harness.client.xdel(stream, ids[1])
        code, out, err = await arun(redis_url, namespace, SHARDS, "capture", "--from", ids[0],
                                    "--no-follow")
        assert [line["id"] for line in json_lines(out)] == [ids[2]]
        # From the beginning, what was deleted before is history, not a gap.
        code_all, out_all, _ = await arun(redis_url, namespace, SHARDS, "capture",
                                                "--from", "beginning", "--no-follow")
    assert (code_all, [line["id"] for line in json_lines(out_all)]) == (0, [ids[0], ids[2]])
    if redis_server.version_info >= (7,):
        assert code == 1
        assert f"entries of {stream} after {ids[0]} were deleted before they could be read" in err
    else:  # no max-deleted-entry-id before Redis 7
        assert code == 0, err


async def test_capture_on_a_redis_cluster(redis_cluster: Any, namespace: str) -> None:
    """Shards on several masters: each is read on its own node (and polled)."""
    url, shards = redis_cluster.url, 3
    entries = [{"response_id": f"cl-{i}", "update": _update(f"u{i}")} for i in range(9)]
    async with Harness(url, namespace, shards, cluster=True) as harness:
        await init_namespace(harness.client, namespace, shards)
        proc = await asyncio.create_subprocess_exec(
            *command(url, namespace, shards, "capture"), env=ENV,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        await asyncio.wait_for(proc.stderr.readline(), 30)
        ids = await harness.add(entries)
        lines = [json.loads(line) for line in await _lines(proc, len(entries))]
        proc.send_signal(signal.SIGINT)
        code, _, err = await _finish(proc)
        assert code == 0, err
        code, out, err = await arun(url, namespace, shards, "capture", "--from", "beginning",
                                    "--no-follow")
        assert code == 0, err
    assert sorted(line["id"] for line in lines) == sorted(ids)
    assert sorted(line["id"] for line in json_lines(out)) == sorted(ids)
    assert len({shard_of(e["response_id"], shards) for e in entries}) > 1

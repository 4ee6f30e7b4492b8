"""`processor tail` against a live run: it prints the merged entries and
events of the turns the test pushes, readable and as JSON lines, follows new
ones, starts where --from says and stops cleanly on SIGINT."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from typing import Any

from support.cli_tools import ENV, arun, call, command, json_lines
from support.records import init_namespace, init_namespace_sync
from support.worker_harness import Harness

from processor.engine import events as ev
from processor.engine.events import event_fields
from processor.wire.ids import TurnKey

SHARDS = 2


def _update(text: str, message_id: str = "m") -> dict[str, Any]:
    return {"type": "agent_response_update", "role": "assistant", "message_id": message_id,
            "contents": [{"type": "text", "text": text}]}


def _turns(prefix: str) -> list[dict[str, Any]]:
    """A completed turn with two messages, a failed one and a cancelled attempt."""
    ok, bad, gone = f"{prefix}-ok", f"{prefix}-bad", f"{prefix}-gone"
    return [
        {"response_id": ok, "update": _update("Hello\nthere ", "m1")},
        {"response_id": ok, "update": _update("world", "m2")},
        {"response_id": ok, "kind": "end"},
        {"response_id": bad, "update": _update("partial")},
        {"response_id": bad, "kind": "error", "error": "model overloaded", "code": "503"},
        {"response_id": gone, "attempt_id": "a2", "update": _update("never mind")},
    ]


async def _published(harness: Harness) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """Every merged entry's fields and every event, as the harness reads them."""
    outputs = await harness.outputs()
    merged = [m for turn in outputs.turns.values() for m in turn.merged]
    events = [e for turn in outputs.turns.values() for e in turn.events]
    return merged, events


async def _run_turns(harness: Harness, prefix: str) -> None:
    await harness.add(_turns(prefix))
    await harness.wait_merged(await harness.merged_count() + 2)
    await harness.cancel(f"{prefix}-gone")
    await harness.wait_merged(await harness.merged_count() + 1)
    await harness.wait_drained()


async def test_tail_prints_every_merged_entry_and_event(redis_url: str, namespace: str) -> None:
    async with Harness(redis_url, namespace, SHARDS, progress=False) as harness:
        await harness.start_worker()
        await _run_turns(harness, "t")
        merged, events = await _published(harness)
        code, text, err = await arun(redis_url, namespace, SHARDS, "tail", "--from",
                                     "beginning", "--no-follow")
        assert code == 0, err
        code, out, err = await arun(redis_url, namespace, SHARDS, "tail", "--from",
                                    "beginning", "--no-follow", "--json")
        assert code == 0, err

    # JSON: one line per output entry, every field decoded, nothing else.
    lines = json_lines(out)
    assert len(lines) == len(merged) + len(events) == 3 + 6
    got_merged = {m["response_id"]: m for m in lines if m["type"] == "merged"}
    for fields in merged:
        line = got_merged[fields["response_id"]]
        assert line["status"] == fields["status"]
        assert line["response"] == json.loads(fields["response"])
        assert line["meta"] == json.loads(fields["meta"])
        assert line["stream"] == f"{{{namespace}:{line['shard']}}}:merged"
    assert sorted(json.dumps(e["event"], sort_keys=True) for e in lines if "event" in e) == \
        sorted(json.dumps(e, sort_keys=True) for e in events)
    assert got_merged["t-gone"]["attempt_id"] == "a2"

    # Readable: one line per entry, with the turn, the status and the content.
    rows = text.splitlines()
    assert len(rows) == len(lines)
    assert all("\n" not in row for row in rows)

    def row(kind: str, turn: str) -> str:
        found = [r for r in rows if r.split()[2:4] == [kind, turn]]
        assert len(found) == 1, (kind, turn, rows)
        return found[0]

    assert 'completed "Hello there world" messages=2 updates=2' in row("merged", "t-ok")
    assert 'seq=1 completed "Hello there world"' in row("synthesis", "t-ok")
    assert "error" in row("merged", "t-bad") and '"partial"' in row("merged", "t-bad")
    assert "seq=1 error producer_error: model overloaded" in row("synthesis", "t-bad")
    assert "cancelled" in row("merged", "t-gone/a2")
    assert "seq=0" in row("synthesis.started", "t-gone/a2")


async def test_tail_follows_new_turns_and_stops_on_sigint(redis_url: str, namespace: str) -> None:
    async with Harness(redis_url, namespace, SHARDS, progress=False) as harness:
        await harness.start_worker()
        await _run_turns(harness, "old")
        # Follow from now: the "old" turns are not printed, the "new" ones are.
        proc = await asyncio.create_subprocess_exec(
            *command(redis_url, namespace, SHARDS, "tail", "--json", "--from", "now"),
            env=ENV, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            await _follow_then_interrupt(harness, proc)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def _is_marker(line: dict[str, Any]) -> bool:
    return "marker" in (line.get("response_id"), line.get("event", {}).get("response_id"))


async def _follow_then_interrupt(harness: Harness, proc: asyncio.subprocess.Process) -> None:
    redis_url, namespace = harness.url, harness.ns.name
    assert proc.stdout is not None and proc.stderr is not None
    assert b"following" in await asyncio.wait_for(proc.stderr.readline(), 30)
    # "now" is fixed at the first read, which follows the note: wait until it has
    # happened (a marker entry added now must be printed, the old ones not).
    # A well-formed event of a turn of its own (the harness checks every event
    # it reads against `processor schema`).
    started = event_fields(TurnKey("marker"), ev.started(TurnKey("marker"), {}, 0))
    marker = dict(zip(started[::2], started[1::2], strict=True))
    seen: list[dict[str, Any]] = []
    for _ in range(100):
        await harness.client.xadd(harness.ns.shard(0).events, marker)
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 0.5)
        except TimeoutError:
            continue  # added before "now" was fixed: add another
        seen.append(json.loads(line))
        if _is_marker(seen[-1]):
            break
    assert all(_is_marker(s) for s in seen), seen
    await _run_turns(harness, "new")
    merged, events = await _published(harness)
    want = len([m for m in merged if m["response_id"].startswith("new")]) + \
        len([e for e in events if e["response_id"].startswith("new")])
    printed = []
    while len(printed) < want:
        line = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        if not _is_marker(line):
            printed.append(line)
    proc.send_signal(signal.SIGINT)
    code = await asyncio.wait_for(proc.wait(), 10)
    rest = (await proc.stdout.read()).decode()
    err = (await proc.stderr.read()).decode()

    assert code == 0, err
    assert all(p.get("response_id", p.get("event", {}).get("response_id", "")).startswith(
        "new") for p in printed)
    assert {(p["type"], p.get("response_id") or p["event"]["response_id"]) for p in printed
            if p["type"] in ("merged", "synthesis")} == {
        (t, f"new-{k}") for t in ("merged", "synthesis") for k in ("ok", "bad", "gone")}
    assert not [line for line in json_lines(rest) if not _is_marker(line)]
    resume = err.split("resume with: ", 1)[1].split()
    assert resume.count("--from") == 2 * SHARDS

    # Resuming where it stopped prints only what came after.
    await _run_turns(harness, "late")
    code, out, err = await arun(redis_url, namespace, SHARDS, "tail", "--json",
                                "--no-follow", *resume)
    assert code == 0, err
    after = json_lines(out)
    assert after and all(
        (a.get("response_id") or a["event"]["response_id"]).startswith("late") for a in after)


async def test_tail_limit_and_now(redis_url: str, namespace: str) -> None:
    async with Harness(redis_url, namespace, SHARDS, progress=False) as harness:
        await harness.start_worker()
        await _run_turns(harness, "t")
        code, out, err = await arun(redis_url, namespace, SHARDS, "tail", "--json", "--from",
                                    "beginning", "--limit", "4")
        assert code == 0, err
        assert len(json_lines(out)) == 4
        code, out, _ = await arun(redis_url, namespace, SHARDS, "tail", "--from", "now",
                                  "--no-follow")
        assert (code, out) == (0, "")


def test_tail_bad_from_gives_one_line(redis_url: str, namespace: str, capsys: Any,
                                     redis_client: Any) -> None:
    init_namespace_sync(redis_client, namespace, SHARDS)
    for bad, message in [("yesterday", "expected beginning, now, an entry id or STREAM=ID"),
                         ("{x:0}:merged=1-0", "is not a followed stream"),
                         (f"{{{namespace}:0}}:merged=abc", "is not an entry id")]:
        code, _, err = call(capsys, redis_url, namespace, SHARDS, "tail", "--from", bad)
        assert code == 2
        assert err.strip().startswith("processor tail: --from") and message in err, err
        assert len(err.strip().splitlines()) == 1


async def test_tail_on_a_redis_cluster(redis_cluster: Any, namespace: str) -> None:
    """Three shards spread over three masters: one XREAD per shard, merged into one tail."""
    shards = 3
    async with Harness(redis_cluster.url, namespace, shards, cluster=True,
                       progress=False) as harness:
        await harness.start_worker()
        turns = [f"c{i}" for i in range(6)]
        assert len({harness.shard_of({"response_id": t}).index for t in turns}) == shards
        await harness.add([e for t in turns for e in (
            {"response_id": t, "update": _update(f"text of {t}")},
            {"response_id": t, "kind": "end"})])
        await harness.wait_merged(len(turns))
        await harness.wait_drained()
        code, out, err = await arun(redis_cluster.url, namespace, shards, "tail", "--json",
                                    "--from", "beginning", "--no-follow")
    assert code == 0, err
    lines = json_lines(out)
    assert sorted(line["response_id"] for line in lines if line["type"] == "merged") == turns
    assert len(lines) == 3 * len(turns)  # merged, synthesis.started, synthesis
    assert {line["shard"] for line in lines} == set(range(shards))


async def test_tail_no_follow_notes_say_neither_ctrl_c_nor_an_empty_resume(
    redis_url: str, namespace: str, async_redis_client: Any
) -> None:
    await init_namespace(async_redis_client, namespace, SHARDS)  # initialised, nothing sent
    code, out, err = await arun(redis_url, namespace, SHARDS, "tail", "--no-follow")
    assert (code, out) == (0, ""), err
    assert "Ctrl-C" not in err and "resume" not in err, err
    async with Harness(redis_url, namespace, SHARDS, progress=False) as harness:
        await harness.start_worker()
        await _run_turns(harness, "t")
        code, out, err = await arun(redis_url, namespace, SHARDS, "tail", "--from",
                                    "beginning", "--no-follow")
    assert code == 0 and len(out.splitlines()) == 9, err
    assert "Ctrl-C" not in err
    resume = err.partition("resume with: ")[2].split()
    assert resume and resume[::2] == ["--from"] * (len(resume) // 2)
    for position in resume[1::2]:  # every stream that has entries, at its last one
        stream, _, entry_id = position.partition("=")
        assert stream.startswith(f"{{{namespace}:") and re.fullmatch(r"\d+-\d+", entry_id), err

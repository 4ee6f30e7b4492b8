"""One consumer group per namespace (processor/host/groups.py): ``processor run``
with a ``--group`` other than the one already on the namespace's shard
streams refuses to start, with one line naming that group and exit status
2, and creates nothing; ``--allow-other-groups`` starts it with a warning."""

from __future__ import annotations

import asyncio
import json

from support.worker_harness import Harness

from processor.host.groups import OtherGroup, find_others, refusal
from processor.wire.keys import Namespace


async def _exit_status(harness: Harness, sub: object, timeout: float = 30) -> int:
    proc = sub.proc  # type: ignore[attr-defined]
    for _ in range(int(timeout / 0.05)):
        if proc.poll() is not None:
            harness.procs.remove(sub)  # type: ignore[arg-type]
            return int(proc.returncode)
        await asyncio.sleep(0.05)
    raise AssertionError(f"still running after {timeout:g} s:\n{sub.log()}")  # type: ignore[attr-defined]


async def _groups(harness: Harness) -> list[set[str]]:
    return [{g["name"].decode() for g in await harness.client.xinfo_groups(s.updates)}
            for s in harness.shards]


async def test_a_second_group_is_refused_at_start(redis_url: str, namespace: str) -> None:
    async with Harness(redis_url, namespace, shards=2) as harness:
        first = harness.spawn(group="blue")
        await harness.wait_started([first])
        second = harness.spawn(group="green")
        assert await _exit_status(harness, second) == 2
        lines = second.log().splitlines()
        refused = [line for line in lines if not line.startswith("{")]  # (the rest: JSON logs)
        assert len(refused) == 1, lines
        assert refused[0].startswith(
            f"processor run: namespace {namespace!r} is read by other consumer group(s): "
            f"'blue' (on 2 of 2 shard stream(s)")
        assert "--allow-other-groups" in refused[0]
        assert await _groups(harness) == [{"blue"}, {"blue"}]  # green was not created
        # The same group starts, as before.
        again = harness.spawn(group="blue")
        await harness.wait_started([again])
        assert first.proc.poll() is None and again.proc.poll() is None


async def test_a_group_on_one_shard_stream_only_is_found_too(
    redis_url: str, namespace: str
) -> None:
    async with Harness(redis_url, namespace, shards=3) as harness:
        await harness.client.xgroup_create(harness.shards[2].updates, "stray", id="0",
                                           mkstream=True)
        sub = harness.spawn()  # the default group
        assert await _exit_status(harness, sub) == 2
        assert (f"'stray' (on 1 of 3 shard stream(s), e.g. {harness.shards[2].updates}; "
                "0 consumer(s), 0 pending)") in sub.log()


async def test_allow_other_groups_starts_with_a_warning(redis_url: str, namespace: str) -> None:
    async with Harness(redis_url, namespace) as harness:
        await harness.client.xgroup_create(harness.shards[0].updates, "stray", id="0",
                                           mkstream=True)
        sub = harness.spawn(allow_other_groups=True)
        await harness.wait_started([sub])
        warnings = [json.loads(line) for line in sub.log().splitlines()
                    if line.startswith("{") and '"other_groups"' in line]
        assert [(w["level"], w["other_groups"]) for w in warnings] == [("warning", ["stray"])]
        assert await _groups(harness) == [{"stray", harness.group}]


def test_other_groups_are_read_from_xinfo_groups_replies() -> None:
    def group(name: str, consumers: int, pending: int) -> dict[bytes, object]:
        return {b"name": name.encode(), b"consumers": consumers, b"pending": pending,
                b"last-delivered-id": b"0-0"}

    replies = [("s0", [group("mine", 2, 5), group("b", 1, 3)]),
               ("s1", Exception("ERR no such key")),
               ("s2", [group("b", 2, 0), group("a", 0, 0)])]
    assert find_others(replies, "mine") == [OtherGroup("a", ["s2"], 0, 0),
                                            OtherGroup("b", ["s0", "s2"], 3, 3)]
    assert find_others([("s0", [group("mine", 1, 1)]), ("s1", [])], "mine") == []
    line = refusal(Namespace("ns", 3), "mine", find_others(replies, "mine"))
    assert "\n" not in line
    assert line.startswith("namespace 'ns' is read by other consumer group(s): 'a' (on 1 of 3 "
                           "shard stream(s), e.g. s2; 0 consumer(s), 0 pending), 'b' (on 2 of 3")

"""The end-to-end workload: realistic multi-agent turns as input stream entries.

The turns are the pure-merge benchmark's (``turns.build_entries``:
genuine ``AgentResponseUpdate.to_dict()`` JSON, 2-3 agents handing off, 10-40
updates per turn, text deltas of 2-20 characters, reasoning, tool calls in
argument chunks plus results, usage and finish reason last, 8 turns in flight
and interleaved), so both benchmarks measure the same data. Each turn gets its
``kind=end`` entry right after its last update.

The stream is written once to a template key (with every bench consumer
group created at id 0) and each run gets an instant server-side ``COPY`` of
it: the workers are already up and idle when their stream fills, so the
timing starts at the ``COPY`` and no producer speed leaks into it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for path in (str(ROOT), str(BENCH)):
    if path not in sys.path:
        sys.path.insert(0, path)

from turns import SEED, build_entries  # noqa: E402

from processor.wire.ids import shard_of  # noqa: E402

#: Mean updates per turn of ``build_entries`` (sizes uniform in 10..40).
MEAN_TURN = 25

Fields = dict[str, str]


@dataclass
class Workload:
    """Input entries in arrival order and what they hold."""

    entries: list[Fields]
    turns: list[str]  # response ids, in order of first appearance
    updates: int  # entries that are updates (the rest are the turns' ends)
    raw_bytes: int  # field names + values of every entry

    @property
    def size(self) -> int:
        return len(self.entries)

    def head(self, turns: int) -> Workload:
        """The first ``turns`` turns (by first appearance), entries in the same order."""
        keep = set(self.turns[:turns])
        return of([e for e in self.entries if e["response_id"] in keep],
                         self.turns[:turns])

    def split(self, shards: int) -> list[Workload]:
        """The entries of each of ``shards`` shards, as producers route them
        (``crc32(response_id) % shards``), in the same order."""
        parts: list[list[Fields]] = [[] for _ in range(shards)]
        turns: list[list[str]] = [[] for _ in range(shards)]
        for rid in self.turns:
            turns[shard_of(rid, shards)].append(rid)
        for e in self.entries:
            parts[shard_of(e["response_id"], shards)].append(e)
        return [of(p, t) for p, t in zip(parts, turns, strict=True)]

    def renamed(self, suffix: str) -> Workload:
        """The same entries for turns named ``<response_id><suffix>``."""
        entries = [{**e, "response_id": e["response_id"] + suffix} for e in self.entries]
        return of(entries, [rid + suffix for rid in self.turns])


def of(entries: list[Fields], turns: list[str]) -> Workload:
    """The workload of ``entries`` (in arrival order) of ``turns``."""
    updates = sum(1 for e in entries if e.get("kind") != "end")
    raw = sum(len(k) + len(v) for e in entries for k, v in e.items())
    return Workload(entries, turns, updates, raw)


def build(turns: int, seed: int = SEED) -> Workload:
    """Exactly ``turns`` turns of ``build_entries(..., seed)``."""
    total = max(10, int(turns * MEAN_TURN * 1.08) + 40)
    while True:
        pairs = build_entries(total, seed)
        order: dict[str, None] = {}
        for rid, _text in pairs:
            order.setdefault(rid, None)
        if len(order) > turns:  # the last turn kept must be complete
            break
        total *= 2
    keep = set(list(order)[:turns])
    last: dict[str, int] = {}
    kept = [(rid, text) for rid, text in pairs if rid in keep]
    for i, (rid, _text) in enumerate(kept):
        last[rid] = i
    entries: list[Fields] = []
    for i, (rid, text) in enumerate(kept):
        entries.append({"response_id": rid, "update": text})
        if last[rid] == i:
            entries.append({"response_id": rid, "kind": "end"})
    return of(entries, list(order)[:turns])


async def fill(client: Any, key: str, entries: list[Fields], chunk: int = 5000) -> None:
    """XADD ``entries`` to ``key``, pipelined."""
    for start in range(0, len(entries), chunk):
        async with client.pipeline(transaction=False) as pipe:
            for fields in entries[start:start + chunk]:
                pipe.xadd(key, fields)
            await pipe.execute()


async def make_template(client: Any, key: str, work: Workload, groups: list[str]) -> None:
    """The template stream with ``groups`` created at id 0 (copied along)."""
    await client.delete(key)
    await fill(client, key, work.entries)
    for group in groups:
        await client.xgroup_create(key, group, id="0")


async def copy_into(client: Any, template: str, key: str) -> int:
    """Replace ``key`` with a copy of the template; returns Redis time (ms) after."""
    if not await client.copy(template, key, replace=True):
        raise RuntimeError(f"COPY {template} {key} failed")
    return await redis_ms(client)


async def forget(client: Any, pattern: str) -> None:
    """Delete a finished run's keys, so the next run starts from the same
    memory, and wait until redis-server has freed them."""
    keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
    for start in range(0, len(keys), 1000):
        await client.unlink(*keys[start:start + 1000])
    await freed(client)


async def freed(client: Any, timeout: float = 300) -> None:
    """Until redis-server's background thread has freed every key UNLINK
    handed it, so that no timed run shares the machine's two cores with
    it. A guard, not a measured cause: freeing is quick for these keys (a
    104 MB stream of 300,000 entries was freed within 6 ms of its UNLINK)."""
    deadline = time.monotonic() + timeout
    while int((await client.info("memory")).get("lazyfree_pending_objects", 0)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"redis-server still freeing keys after {timeout:g} s")
        await asyncio.sleep(0.05)


async def redis_ms(client: Any) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def id_ms(entry_id: Any) -> int:
    """The millisecond part of a stream entry id (Redis's clock at XADD)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return int(text.partition("-")[0])

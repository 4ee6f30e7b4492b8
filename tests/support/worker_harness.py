"""Live workers on a real Redis, for the worker integration tests.

``Harness`` runs N in-process ``Worker`` tasks
and/or ``processor run`` subprocesses on one namespace, XADDs input entries
(batched pipelines, routed to their shard like a producer would), waits until
everything is drained, and collects what the workers published: merged
entries, events and dead letters, per turn in the shape of a ``processor
merge`` line so that ``support.expectations`` can check them.

Nothing here knows the merge rules: a test compares the live outputs with
``turn_reference.offline_results`` (``processor merge`` of the same entries). Every
merged entry, event and dead letter read is checked against ``processor schema``
(tests/support/contract.py), so every integration test is also a contract test.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from processor.redis_io.connections import connect
from processor.redis_io.options import RedisOptions
from processor.wire.ids import TurnKey, shard_of
from processor.wire.keys import Namespace, Shard
from processor.worker.worker import Worker, WorkerConfig
from support.contract import check_dlq_entry, check_event_entry, check_merged_entry
from support.subprocess_workers import ROOT, Subprocesses, SubprocessWorker  # noqa: F401 (ROOT: re-exported)
from support.turn_reference import Outputs, TurnOutput, entry_fields, routing_id


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(raw: dict[Any, Any]) -> dict[str, str]:
    return {_text(k): v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            for k, v in raw.items()}


# --------------------------------------------------------------------------- workers


@dataclass
class InProcessWorker:
    worker: Worker
    client: Any
    task: asyncio.Task[None]

    @property
    def consumer(self) -> str:
        return self.worker.config.consumer


class Harness(Subprocesses):
    """Workers, a producer and a reader on one namespace of one Redis."""

    def __init__(
        self, url: str, namespace: str, shards: int = 1, *, log_dir: Path | None = None,
        cluster: bool = False, **config: Any,
    ) -> None:
        self.url = url
        self.cluster = cluster  # a Redis Cluster: every client is a cluster client
        self.ns = Namespace(namespace, shards)
        self.config = config  # WorkerConfig keyword arguments shared by every worker
        self.client = self.connect()
        self.workers: list[InProcessWorker] = []
        self.procs: list[SubprocessWorker] = []
        self.log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
        self._serial = 0

    def connect(self, **kwargs: Any) -> Any:
        """A new client on the harness's Redis (bytes responses).

        Without a ``socket_timeout`` of the caller's (in-process workers
        give theirs), none: redis-py 8 gives every client a 5 s one by
        default, and it bounds the whole of a reply, not a pause in it. The
        harness reads replies of any size (``outputs()`` read the ten ~56 MB
        merged turns of tests/worker/test_worker_bytes.py, 560 MB, in one XRANGE),
        which took over 5 s on a machine busy with other work: that test
        failed with ``TimeoutError: Timeout reading from 127.0.0.1:...``
        although nothing was wrong. The tests' own deadlines bound their waits."""
        kwargs.setdefault("socket_timeout", None)
        if self.cluster:
            return RedisCluster.from_url(self.url, **kwargs)
        return redis.asyncio.Redis.from_url(self.url, **kwargs)

    @property
    def shards(self) -> list[Shard]:
        return self.ns.all()

    async def __aenter__(self) -> Harness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ in-process

    def worker_config(self, **overrides: Any) -> WorkerConfig:
        """An in-process worker's config. Its idle waits (``idle_wait``: the
        inbox bell's BLPOP, a read of the cancel channel) last 0.1 s instead
        of 1 s, so that stopping it takes that long, not up to a second:
        every test that stops a worker waited for them (a test may give its own)."""
        self._serial += 1
        values = {"namespace": self.ns.name, "shards": self.ns.shards,
                  "consumer": f"w{self._serial}", "idle_wait": 0.1, **self.config,
                  **overrides}
        return WorkerConfig(**values)

    async def start_worker(self, **overrides: Any) -> InProcessWorker:
        """An in-process worker with its own connection, made as ``processor
        run`` makes it (``processor.redis_io.connections.connect``: its
        parser, packing and retries); returns once its groups exist."""
        client = await connect(RedisOptions(self.url, socket_timeout=10))
        worker = Worker(client, self.worker_config(**overrides))
        task = asyncio.create_task(worker.run(), name=worker.config.consumer)
        running = InProcessWorker(worker, client, task)
        self.workers.append(running)
        ready = asyncio.create_task(worker.ready.wait())
        await asyncio.wait([ready, task], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            ready.cancel()
            task.result()  # raises what run() raised
        return running

    async def start_workers(self, n: int, **overrides: Any) -> list[InProcessWorker]:
        return [await self.start_worker(**overrides) for _ in range(n)]

    async def stop_worker(self, running: InProcessWorker, timeout: float = 30) -> None:
        """``stop()`` and wait for ``run()`` to return (it raises what run raised)."""
        running.worker.stop()
        try:
            await asyncio.wait_for(asyncio.shield(running.task), timeout)
        finally:
            if running in self.workers:
                self.workers.remove(running)
            await running.client.aclose()

    def assert_workers_alive(self) -> None:
        """Every in-process worker is still running (a crashed one raises here)."""
        for running in self.workers:
            if running.task.done():
                running.task.result()
                raise AssertionError(f"worker {running.consumer} returned on its own")
        for sub in self.procs:
            code = sub.proc.poll()
            assert code is None, f"{sub.consumer} exited with {code}:\n{sub.log()[-3000:]}"

    # ------------------------------------------------------------ producing

    @property
    def group(self) -> str:
        return str(self.config.get("group", "processor"))

    def shard_of(self, entry: dict[str, Any]) -> Shard:
        return self.ns.shard(shard_of(routing_id(entry), self.ns.shards))

    async def add(self, entries: Iterable[dict[str, Any]], chunk: int = 2000) -> list[str]:
        """XADD each entry to its shard's updates stream, pipelined; returns the ids."""
        ids: list[str] = []
        batch: list[dict[str, Any]] = []

        async def flush() -> None:
            async with self.client.pipeline(transaction=False) as pipe:
                for entry in batch:
                    pipe.xadd(self.shard_of(entry).updates, entry_fields(entry))
                ids.extend(_text(i) for i in await pipe.execute())
            batch.clear()

        for entry in entries:
            batch.append(entry)
            if len(batch) >= chunk:
                await flush()
        if batch:
            await flush()
        return ids

    async def add_raw(self, shard: Shard, fields: dict[Any, Any]) -> str:
        """XADD exactly these fields (garbage entries)."""
        return _text(await self.client.xadd(shard.updates, fields))

    async def cancel(self, response_id: str, reason: str = "test", ttl: int = 600) -> None:
        shard = self.ns.shard(shard_of(response_id, self.ns.shards))
        await self.client.set(shard.cancel(response_id), reason, ex=ttl)

    # ------------------------------------------------------------ waiting

    async def wait_for(self, predicate: Any, timeout: float, what: str) -> None:
        """Until ``predicate()`` (a bool, or an awaitable of one) is true."""
        deadline = time.monotonic() + timeout
        while not await _truth(predicate()):
            self.assert_workers_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s: {what}\n"
                                     f"{await self.describe()}")
            await asyncio.sleep(0.02)

    async def applied(self) -> bool:
        """Every entry XADDed so far has been applied (acked and deleted)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for shard in self.shards:
                pipe.xlen(shard.updates)
            lengths = await pipe.execute()
        if any(lengths):
            return False
        for shard in self.shards:
            with contextlib.suppress(redis.ResponseError):  # no group yet: nothing pending
                if (await self.client.xpending(shard.updates, self.group))["pending"]:
                    return False
        return True

    async def drained(self) -> bool:
        """Applied, and no turn left active or closing (everything finalised)."""
        if not await self.applied():
            return False
        async with self.client.pipeline(transaction=False) as pipe:
            for shard in self.shards:
                pipe.zcard(shard.active)
                pipe.zcard(shard.closing)
            counts = await pipe.execute()
        return not any(counts)

    async def wait_applied(self, timeout: float = 30) -> None:
        await self.wait_for(self.applied, timeout, "entries still unapplied")

    async def wait_drained(self, timeout: float = 60) -> None:
        await self.wait_for(self.drained, timeout, "not drained")

    async def merged_count(self) -> int:
        async with self.client.pipeline(transaction=False) as pipe:
            for shard in self.shards:
                pipe.xlen(shard.merged)
            return sum(await pipe.execute())

    async def wait_merged(self, count: int, timeout: float = 60) -> None:
        async def enough() -> bool:
            return await self.merged_count() >= count

        await self.wait_for(enough, timeout, f"fewer than {count} merged entries")

    async def describe(self) -> str:
        """A one-paragraph picture of the namespace, for failure messages."""
        lines = []
        for shard in self.shards:
            try:
                pending = (await self.client.xpending(shard.updates, self.group))["pending"]
            except redis.ResponseError:
                pending = "no group"
            lines.append(
                f"shard {shard.index}: updates={await self.client.xlen(shard.updates)} "
                f"pending={pending} active={await self.client.zcard(shard.active)} "
                f"closing={await self.client.zcard(shard.closing)} "
                f"merged={await self.client.xlen(shard.merged)} "
                f"dlq={await self.client.xlen(shard.dlq)}"
            )
        for running in self.workers:  # what each worker believes about the others
            member = running.worker.membership
            lines.append(f"worker {member.consumer}: live={member.live} "
                         f"owned={sorted(member.owned)} rescued={sorted(member.rescued)}")
        beats = await self.client.zrange(self.ns.workers(self.group), 0, -1, withscores=True)
        lines.append(f"workers zset: {beats}")
        return "\n".join(lines)

    # ------------------------------------------------------------ reading

    async def _xrange_all(self, stream: str) -> list[tuple[str, dict[str, str]]]:
        out: list[tuple[str, dict[str, str]]] = []
        start = "-"
        while True:
            chunk = await self.client.xrange(stream, start, "+", count=10_000)
            out += [(_text(i), _fields(f)) for i, f in chunk]
            if len(chunk) < 10_000:
                return out
            start = "(" + _text(chunk[-1][0])

    async def outputs(self, events: bool = True) -> Outputs:
        """Every merged entry, event (unless not ``events``) and dead letter
        of the namespace."""
        turns: dict[TurnKey, TurnOutput] = {}
        by_synthesis: dict[str, TurnKey] = {}
        dlq: list[dict[str, str]] = []
        merged_count = events_count = 0
        pending_events: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for shard in self.shards:
            for _id, fields in await self._xrange_all(shard.merged):
                check_merged_entry(fields)  # the contract test, on every live output
                key = TurnKey(fields["response_id"], fields.get("attempt_id", ""))
                turns.setdefault(key, TurnOutput(key)).merged.append(fields)
                by_synthesis[fields["synthesis_id"]] = key
                merged_count += 1
            for _id, fields in await self._xrange_all(shard.events) if events else []:
                pending_events[fields["synthesis_id"]].append(check_event_entry(fields))
                events_count += 1
            for i, f in await self._xrange_all(shard.dlq):
                check_dlq_entry(f)
                dlq.append({**f, "_id": i, "_shard": str(shard.index)})
        for synthesis_id, events in pending_events.items():
            key = by_synthesis.get(synthesis_id)
            if key is None:  # events of a turn never merged: keep them visible
                first = events[0]
                key = TurnKey(first["response_id"], first.get("attempt_id") or "")
                turns.setdefault(key, TurnOutput(key))
            turns[key].events.extend(events)
        return Outputs(turns, dlq, merged_count, events_count)

    async def state_keys(self) -> list[str]:
        """Internal per-turn state left behind: turn/recs hashes, active/closing zsets."""
        found: list[str] = []
        for shard in self.shards:
            for pattern in (f"{shard.tag}:turn:*", f"{shard.tag}:recs:*"):
                found += [_text(k) async for k in self.client.scan_iter(match=_glob(pattern))]
            for name in (shard.active, shard.closing):
                if await self.client.exists(name):
                    found.append(name)
        return found

    async def consumers(self, shard: Shard) -> list[str]:
        info = await self.client.xinfo_consumers(shard.updates, self.group)
        return [_text(c["name"]) for c in info]

    # ------------------------------------------------------------ teardown

    async def stop_all(self) -> None:
        for running in list(self.workers):
            await self.stop_worker(running)

    async def close(self) -> None:
        for running in list(self.workers):
            running.worker.stop()
        for running in list(self.workers):
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(running.task, 10)
            with contextlib.suppress(BaseException):
                await running.client.aclose()
        self.workers.clear()
        for sub in list(self.procs):
            if sub.proc.poll() is None:
                sub.proc.kill()
            sub.proc.wait(10)
        self.procs.clear()
        await self.client.aclose()


async def _truth(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _glob(pattern: str) -> str:
    """Escape the glob specials of a key prefix (the hash tag's braces are fine)."""
    head, star, tail = pattern.rpartition("*")
    escaped = "".join("\\" + c if c in "?[]\\" else c for c in head)
    return escaped + star + tail

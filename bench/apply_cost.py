"""Redis's CPU per entry inside the worker's per-batch scripts.

Reads the end-to-end workload's stream in batches of 500 and takes each
batch as a worker holding turns does (the default: ``open_turns`` for its
new turns, ``finalise_held`` for the turns it ends, through the worker's own
``apply``), or with ``--stored`` as one storing every entry
(``--no-hold-turns``) does: ``apply_entries`` as the worker builds it
(``build_apply``), with no finalise. ``INFO commandstats`` splits
redis-server's time between the scripts as a whole (``evalsha``) and the
commands they run (``hset``, ``xack``, ...); the difference is the Lua
interpreter's own share. Starts its own redis-server; prints microseconds
per entry, best of ``--rounds``::

    python bench/apply_cost.py [--turns 800] [--rounds 3] [--stored]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import redis.asyncio
import workload

from processor.embedded import EmbeddedRedis
from processor.redis_io.connections import fast_stream_reads, read_raw
from processor.scripts import Scripts
from processor.scripts.stored_calls import build_apply
from processor.wire.keys import Namespace
from processor.worker.held.batch import HeldCall, decode_batch
from processor.worker.worker import Worker, WorkerConfig


async def one_round(client: Any, work: workload.Workload, batch: int = 500,
                    stored: bool = False,
                    finalise: bool = False) -> tuple[int, dict[str, Any]]:
    """Apply the whole stream once, ``batch`` entries a call; the entries
    applied and the commandstats. By default each batch goes through the
    worker's own ``apply``, holding turns (``open_turns`` and
    ``finalise_held``). With ``stored`` (``--no-hold-turns``), each batch
    goes to ``apply_entries`` alone; with ``finalise`` too, through the
    worker's own ``apply`` (the script, its mirrors of the turns, then
    ``finalise_turns`` for the turns made ready), so the shard's zsets hold
    only the turns in flight, as in a running worker."""
    held = not stored
    finalise = finalise or held
    config = WorkerConfig(namespace="cost", consumer="cost", hold_turns=held)
    shard = next(iter(Namespace(config.namespace, 1).all()))
    scripts, options = Scripts(client), config
    worker = Worker(client, config) if finalise else None
    await client.copy("cost:template", shard.updates, replace=True)
    await client.config_resetstat()
    applied = 0
    fast_stream_reads(client)  # (read_raw's parser, as a worker's client has)
    while entries := await (read_raw(client, config.group, "cost", shard.updates, batch) if held
                            else _read(client, config.group, shard.updates, batch)):
        now = int(time.time() * 1000)
        call = (decode_batch(shard, entries, options, now) if held
                else build_apply(shard, entries, {}, options, now))
        if worker is not None:
            call.newest = True  # read with ">", as the shard loop marks it
            if isinstance(call, HeldCall):
                await worker.held.apply_held(shard, entries, call)
            else:
                await worker.stored.store(shard, entries, {}, call)
        else:
            await scripts.apply_entries(keys=call.keys, args=call.argv())
        applied += len(entries)
    stats = await client.info("commandstats")
    await workload.forget(client, "{cost:*")
    return applied, stats


async def _read(client: Any, group: str, stream: str, batch: int) -> list[Any]:
    reply = await client.xreadgroup(group, "cost", {stream: ">"}, count=batch)
    return reply[0][1] if reply else []


def scripts_of(stored: bool, finalise: bool = False) -> str:
    """The scripts ``one_round`` calls, for the printed figures."""
    if not stored:
        return "open_turns and finalise_held (held turns, the default)"
    return ("apply_entries and finalise_turns" if finalise else "apply_entries") + (
        " (--no-hold-turns)")


async def measure(turns: int, rounds: int, stored: bool) -> None:
    with EmbeddedRedis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        work = workload.build(turns)
        await workload.make_template(client, "cost:template", work, [WorkerConfig().group])
        best: tuple[float, int, dict[str, Any]] | None = None
        for _ in range(rounds):
            applied, stats = await one_round(client, work, stored=stored)
            script = stats["cmdstat_evalsha"]["usec"] / applied
            if best is None or script < best[0]:
                best = (script, applied, stats)
        assert best is not None
        script, applied, stats = best
        inside = {name.removeprefix("cmdstat_"): s["usec"] / applied
                  for name, s in stats.items()
                  if name not in ("cmdstat_evalsha", "cmdstat_xreadgroup", "cmdstat_copy",
                                  "cmdstat_config|resetstat", "cmdstat_script|load")}
        print(f"entries applied: {applied:,} ({len(work.turns):,} turns), best of {rounds}")
        print(f"{scripts_of(stored)}: {script:.2f} us of redis-server CPU per entry")
        for name, usec in sorted(inside.items(), key=lambda kv: -kv[1])[:8]:
            print(f"  of which {name}: {usec:.2f} us")
        print(f"  of which the Lua interpreter: {script - sum(inside.values()):.2f} us")
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stored", action="store_true",
                        help="apply each batch as a worker storing every entry does "
                             "(--no-hold-turns): apply_entries alone")
    args = parser.parse_args()
    asyncio.run(measure(args.turns, args.rounds, args.stored))


if __name__ == "__main__":
    main()

"""Instruction counts for the worker's Python around decode and merge.

``bench/loop_idle.py --free-decode-merge`` showed that decode and merge are
about a fifth of one worker's CPU; this counts the rest of the worker's own
Python per entry, without Redis or the event loop, so that a change to it
can be measured under ``valgrind --tool=callgrind`` (stable under load,
unlike timings on a shared machine). Each side runs the steps of a shard
loop on the end-to-end workload's entries as redis-py returns them (bytes),
in batches of 500, with the replies the scripts would give made up (every
entry stored, so every turn keeps its mirror; every turn opened held)::

    python bench/shell_count.py none --turns 400 --entries /tmp/sc.entries  # builds them once
    export PYTHONHASHSEED=0  # else str hashing moves a side by up to ~1,200 per entry
    unset PYTHONDONTWRITEBYTECODE  # and run each side once first: compiling a changed
                                   # module (no .pyc to read) adds thousands per entry
    for side in none decode build follow finish held; do
        valgrind --tool=callgrind --callgrind-out-file=/tmp/sc.$side \\
            python bench/shell_count.py $side --turns 400 --entries /tmp/sc.entries
    done
    # instructions per entry of a step: (cg.<side> - cg.<previous side>) / entries

Sides, each doing what the one before does and more: ``none`` (the
entries built, nothing else), ``decode`` (``decode_stream_entry`` per
entry), ``build`` (``build_apply`` per batch, which decodes too, instead),
``follow`` (``Mirrors.update`` per batch: the worker's mirror of each turn,
merge included), ``finish`` (``render`` of each turn whose end was fed, as
a finalise from the worker's mirror does): the steps of a worker storing
every entry (``--no-hold-turns``); and ``held``, on its own beside
``none``: what a worker holding turns (the default) does instead of
``build`` to ``finish`` (decode, feed the held copy, render). ``python bench/shell_count.py
SIDE`` alone prints the entries and turns and the seconds it took.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import workload

from processor.engine.replay import render
from processor.host.run import tune_gc
from processor.ingest.decode import decode_stream_entry
from processor.scripts.calls import BatchOptions
from processor.scripts.stored_calls import ApplyCall, Version, build_apply
from processor.wire import defaults
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace, Shard
from processor.worker.budget import HELD_BYTES
from processor.worker.held.batch import decode_batch
from processor.worker.held.holds import Holds
from processor.worker.stored.mirror import Mirrors
from processor.worker.worker import WorkerConfig

SIDES = ("none", "decode", "build", "follow", "finish", "held")
BATCH = 500
NOW_MS = 1_700_000_000_000

Entry = tuple[bytes, dict[bytes, bytes]]
_cached = msgspec.msgpack.Decoder(tuple[int, list[list[Entry]]])


def batches(turns: int, cache: Path | None = None) -> list[list[Entry]]:
    """The workload's entries as XREADGROUP replies of BATCH entries, read
    from ``cache`` if it has them (building them under callgrind takes a
    minute) or built and written there."""
    if cache is not None and cache.exists():
        found = _cached.decode(cache.read_bytes())
        if found[0] == turns:
            return found[1]
    replies = _build(turns)
    if cache is not None:
        cache.write_bytes(msgspec.msgpack.encode((turns, replies)))
    return replies


def _build(turns: int) -> list[list[Entry]]:
    work = workload.build(turns)
    entries = [(f"{NOW_MS}-{i}".encode(), {k.encode(): v.encode() for k, v in e.items()})
               for i, e in enumerate(work.entries)]
    return [entries[i:i + BATCH] for i in range(0, len(entries), BATCH)]


def versions(call: ApplyCall, mirrors: Mirrors) -> dict[TurnKey, Version]:
    """What ``apply_entries`` reports when it stores every entry of the call."""
    stored: dict[TurnKey, int] = {}
    for entry in call.applied:
        stored[entry.key] = stored.get(entry.key, 0) + 1
    out = {}
    for key, count in stored.items():
        mirror = mirrors.turns.get(key)
        before = mirror.version if mirror is not None else 0
        out[key] = Version(before, before + count, count, str(NOW_MS))
    return out


def ended(mirrors: Mirrors, keys: Iterator[TurnKey]) -> list[TurnKey]:
    """The turns among ``keys`` whose mirror has an outcome (their end was fed)."""
    return [key for key in keys
            if (m := mirrors.turns.get(key)) is not None and m.replay.life.outcome is not None]


def hold(shard: Shard, entries: list[Any], options: BatchOptions, holds: Holds) -> None:
    """One batch, as read_raw gives it, as a worker holding turns takes it
    (``processor.worker.held.path``):
    decoded, new turns opened (open_turns made up: every one held), fed,
    and the turns it ended rendered for finalise_held."""
    grouped = decode_batch(shard, entries, options, NOW_MS).held
    assert grouped is not None
    holds.opened({key: True for key in holds.to_open(grouped)}, str(NOW_MS), 0.0)
    routed = holds.route(entries, grouped)
    for key in routed.held:
        held = holds.turns[key]
        if held.ended:
            holds.take(key)
            render(key, held.replay, held.turn_hash(), "closing", NOW_MS)


def as_read(replies: list[list[Entry]]) -> list[list[Any]]:
    """The replies as a worker holding turns reads them (``connections.read_raw``)."""
    return [[[entry_id, [x for pair in fields.items() for x in pair]]
             for entry_id, fields in entries] for entries in replies]


def run(side: str, replies: list[list[Entry]], read: list[list[Any]]) -> None:
    config = WorkerConfig(namespace="count")
    shard = next(iter(Namespace(config.namespace, 1).all()))
    options = config
    mirrors = Mirrors(config.limits)
    holds = Holds(config.limits, defaults.HELD_TURNS, HELD_BYTES)
    for entries, raw in zip(replies, read, strict=True):
        if side == "decode":
            for _id, fields in entries:
                decode_stream_entry(fields)
            continue
        if side == "none":
            continue
        if side == "held":
            hold(shard, raw, options, holds)
            continue
        call = build_apply(shard, entries, {}, options, NOW_MS)
        if side == "build":
            continue
        fresh = mirrors.update(call.applied, versions(call, mirrors), newest=True)
        if side == "follow":
            continue
        for key in ended(mirrors, iter(fresh)):
            mirror = mirrors.take(key)
            assert mirror is not None
            render(key, mirror.replay, mirror.turn_hash(), "closing", NOW_MS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=SIDES)
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--entries", type=Path, help="a file to keep the built entries in")
    args = parser.parse_args()
    replies = batches(args.turns, args.entries)
    read = as_read(replies)  # (made for every side: the count of 'none' has it too)
    tune_gc()  # the worker's collector settings, as processor run has them
    started = time.perf_counter()
    run(args.side, replies, read)
    took = time.perf_counter() - started
    count = sum(len(b) for b in replies)
    print(f"{args.side}: {count:,} entries, {args.turns} turns, {took:.3f} s")


if __name__ == "__main__":
    main()

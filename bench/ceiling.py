"""The ceiling of processor's own code: one process that reads the stream,
decodes and merges every entry with processor's decode and merge, keeps the
turns in its memory only, and writes nothing but the outputs and the acks.

It is not a safe design (a crash loses every open turn, two consumers split
a turn, nothing is exactly-once); it measures what any design built on this
per-entry decode and merge can reach with one process, so that the distance
of a worker storing every entry (``--no-hold-turns``) from the drain splits
into "the cost of keeping state in Redis" (that worker vs this) and "the
cost of decoding and merging in Python" (this vs the drain). A worker
holding turns (the default) is not bound by it: it decodes a turn's plain
updates together and folds a run of them at a time (docs/design.md, *Held
turns*).

Per batch (``XREADGROUP COUNT 500``): decode each entry (``decode_stream_entry``),
feed it to its turn's ``TurnLife``; one pipeline then ``XADD``s a
``synthesis.started`` per new turn, the merged entry and the terminal event
of each turn that ended (rendered by ``settle.render``, as the worker does),
and ``XACK``s the batch. Run as a process; prints ``ready`` once its group
exists::

    python bench/ceiling.py REDIS_URL STREAM MERGED EVENTS [--group G] [--count 500]
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import msgspec
import redis.asyncio
from drain import ready

from processor.engine import events as ev
from processor.engine.events import event_fields
from processor.engine.lifecycle import Limits, TurnLife
from processor.engine.replay import Replay, render
from processor.ingest.decode import decode_stream_entry
from processor.redis_io.connections import fast_stream_reads
from processor.wire.ids import TurnKey

_unpack = msgspec.msgpack.Decoder()


class Turns:
    """Every open turn, in memory."""

    def __init__(self) -> None:
        self.open: dict[TurnKey, Replay] = {}
        self.started: dict[TurnKey, int] = {}

    def feed(self, entry_id: str, fields: dict[Any, Any], now: int) -> tuple[TurnKey, bool]:
        key, record, size = decode_stream_entry(fields)
        replay = self.open.get(key)
        new = replay is None
        if replay is None:
            replay = self.open[key] = Replay(TurnLife(key, Limits()))
            self.started[key] = now
        replay.feed(entry_id, record, size)
        return key, new


async def consume(url: str, stream: str, merged: str, events: str, group: str,
                  count: int) -> None:
    client = redis.asyncio.Redis.from_url(url)
    fast_stream_reads(client)  # the worker's reply parsing, as the rest is its code
    await ready(client, stream, group)
    turns = Turns()
    while True:
        reply = await client.xreadgroup(group, "ceiling", {stream: ">"}, count=count, block=100)
        for _name, entries in reply or []:
            if entries:
                await _batch(client, turns, entries, stream, merged, events, group)


async def _batch(client: Any, turns: Turns, entries: list[Any], stream: str, merged: str,
                 events: str, group: str) -> None:
    now = int(entries[-1][0].split(b"-")[0])
    pipe = client.pipeline(transaction=False)
    ended: list[TurnKey] = []
    for raw_id, fields in entries:
        key, new = turns.feed(raw_id.decode(), fields, now)
        if new:
            pipe.xadd(events, dict(_pairs(event_fields(key, ev.started(key, {}, now)))))
        if turns.open[key].life.outcome is not None:
            ended.append(key)
    for key in ended:
        replay = turns.open.pop(key)
        settled = render(key, replay, {"started": str(turns.started.pop(key))}, "closing", now)
        assert settled is not None
        merged_fields, final_fields = _unpack.decode(settled.outputs)[:2]
        pipe.xadd(merged, dict(_pairs(merged_fields)))
        pipe.xadd(events, dict(_pairs(final_fields)))
    pipe.xack(stream, group, *(i for i, _f in entries))
    await pipe.execute()


def _pairs(flat: list[Any]) -> list[tuple[Any, Any]]:
    return list(zip(flat[::2], flat[1::2], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("stream")
    parser.add_argument("merged")
    parser.add_argument("events")
    parser.add_argument("--group", default="processor")
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(consume(args.url, args.stream, args.merged, args.events, args.group,
                        args.count))


if __name__ == "__main__":
    main()

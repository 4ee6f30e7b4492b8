"""Instructions redis-server spends per turn in ``publish_live`` (callgrind).

Live progress of many turns at once (the paced and many-live-turns
workloads) is a ``publish_live`` call per read batch or interval, with one
or a few events per turn: its cost per turn is most of redis-server's share
of a live update there. Like ``bench/apply_count.py``, this starts a
redis-server (the one on ``PATH``) under ``valgrind --tool=callgrind
--toggle-collect=evalShaCommand``, so that only what runs inside EVALSHA is
counted, then makes ``--turns`` turns (their hashes, as ``open_turns``
leaves them) and publishes each of them ``--rounds`` times, ``--per-call``
turns a call, each with ``--events`` text chunks of a realistic size and
one update, as the worker builds the calls (``build_publish_live``), and
prints the instructions per turn published::

    python bench/live_count.py [--turns 1000] [--per-call 100] [--events 1] [--rounds 5]
                               [--keep FILE]

Needs valgrind. Takes about 20 s with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import msgspec
import redis.asyncio
from apply_count import under_callgrind

from processor.engine.live import _BLANK
from processor.scripts import Scripts
from processor.scripts.live_calls import LiveTurn, build_publish_live, publish_live
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace
from processor.wire.outputs import SynthesisChunk
from processor.worker.config import WorkerConfig

#: One update as the paced workload's producer writes it (its JSON text).
UPDATE = (b'{"type":"agent_response_update","role":"assistant","message_id":"m1",'
          b'"author_name":"bench","contents":[{"type":"text","text":"word 12 "}]}')


def _calls(turns: int, per_call: int, events: int, rounds: int) -> list[list[LiveTurn]]:
    """The calls' turns: every turn once per round, ``per_call`` a call."""
    keys = [TurnKey(f"paced_{i:05d}") for i in range(turns)]
    calls = []
    for r in range(rounds):
        for start in range(0, turns, per_call):
            one = []
            for key in keys[start:start + per_call]:
                chunks = [msgspec.structs.replace(
                    _BLANK[SynthesisChunk], synthesis_id=key.synthesis_id(),
                    response_id=key.response_id, ts=1764380000000, message_id="m1",
                    agent_id="agent", author_name="bench", role="assistant",
                    delta=f"word {r} {e} ") for e in range(events)]
                one.append(LiveTurn(key, chunks, b"[" + UPDATE + b"]", r, r == 0))
            calls.append(one)
    return calls


async def count(turns: int, per_call: int, events: int, rounds: int,
                keep: Path | None = None) -> None:
    shard = Namespace("count", 1).shard(0)
    config = WorkerConfig()

    async def run(client: redis.asyncio.Redis) -> None:
        async with client.pipeline(transaction=False) as pipe:
            for i in range(turns):
                pipe.hset(shard.turn(TurnKey(f"paced_{i:05d}").encode()), "seq", 1)
            await pipe.execute()
        script = Scripts(client).publish_live
        for turns_of_call in _calls(turns, per_call, events, rounds):
            said = await publish_live(
                script, build_publish_live(shard, turns_of_call, config, "speaker"))
            if said != [events] * len(turns_of_call):
                raise RuntimeError(f"publish_live answered {said[:5]}...")

    _, total = await under_callgrind(run, keep)
    published = turns * rounds
    print(f"publish_live: {total / published:,.0f} instructions of redis-server per turn "
          f"({published:,} turns published, {per_call} a call, {events} event(s) each; "
          f"{total:,} inside EVALSHA)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--per-call", type=int, default=100)
    parser.add_argument("--events", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="where to copy callgrind's output")
    args = parser.parse_args()
    asyncio.run(count(args.turns, args.per_call, args.events, args.rounds, args.keep))

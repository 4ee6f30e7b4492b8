"""The two workloads of real agent turns, beside ``bench/run.py``'s backlog.

- **Many live turns** (``round_robin``): ``turns`` turns of ``updates``
  text updates each, XADDed round-robin (update i of every turn before
  update i+1 of any), then each turn's ``end``: a read batch holds about
  one update of each of many turns, as when hundreds of agents stream at
  once. Timed like the backlog (a ``COPY`` of a pre-filled stream).
- **Paced long turns** (``paced``): ``turns`` turns at once, each one
  update every ``period`` seconds for ``seconds`` seconds (10,000/s
  offered for 1,000 turns every 100 ms), then their ends, produced live by
  this process: the turns outlive ``--hold-ms`` (5 s by default). What
  counts is the CPU per update (worker and redis-server), not the rate,
  which is the producer's. With ``--messages M`` each turn's updates go
  to M messages one after the other (three agents handing off), so that
  the turns also grow in messages as they run.

Both are compared, in the same run, with the raw drain of the same input
and (unless ``--no-peer``) the FastStream peer.
``bench/run.py`` runs them beside the backlog; on their own (one round, a
private redis-server)::

    python bench/live_turns.py [--turns 1000] [--updates 100] [--seconds 20]
                               [--messages 1] [--repeat 1] [--no-peer] [--no-paced]
                               [--no-many] [--commandstats]

``--commandstats`` also prints, for each paced worker run, redis-server's
time per update per command (``INFO commandstats``, the producer's
``XADD``s included) and per script (its slow log, every command kept for
the run: some hundred MB of redis-server's memory for 20 s, and its time
in the run's CPU figures), as ``bench/loop_idle.py --commandstats`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio
import scenarios
import workload
from agent_framework import AgentResponseUpdate, Content
from measures import print_commandstats, print_scripts
from scenarios import Ctx, Feed, Throughput
from turns import WORDS
from workload import Fields, Workload

#: The agents of a turn of several messages, taking turns (handoffs).
AGENTS = ("Writer", "Critic", "Planner")


def _text_update(rid: str, message: str, author: str = "Writer") -> dict[str, Any]:
    """A genuine text update of turn ``rid`` (``AgentResponseUpdate.to_dict()``)."""
    update = AgentResponseUpdate(contents=[Content.from_text("x")], role="assistant",
                                 response_id=rid, message_id=message, author_name=author,
                                 agent_id=f"agent-{author.lower()}",
                                 created_at="2026-01-01T00:00:00.000Z")
    return update.to_dict()


def text_entries(turns: int, updates: int, prefix: str = "live",
                 messages: int = 1) -> list[list[Fields]]:
    """Per round i (of ``updates``), the i-th text update of every turn, in
    turn order; turn ids ``<prefix>_<n>``. Deltas of 2-20 characters. Each
    turn's updates go to ``messages`` messages one after the other (the
    agents of ``AGENTS`` in turn, as after handoffs), an equal share each."""
    rids = [f"{prefix}_{n:05d}" for n in range(turns)]
    rounds: list[list[Fields]] = []
    for i in range(updates):
        one = []
        m = i * messages // updates
        if i == 0 or m != (i - 1) * messages // updates:
            author = AGENTS[m % len(AGENTS)]
            protos = [_text_update(rid, f"msg_{rid}_{m}", author) for rid in rids]
        for n, (rid, proto) in enumerate(zip(rids, protos, strict=True)):
            word = WORDS[(i * 7 + n) % len(WORDS)]
            proto["contents"][0]["text"] = (word + " ")[: 2 + (i + n) % 19]
            one.append({"response_id": rid, "update": json.dumps(proto)})
        rounds.append(one)
    return rounds


def ends(turns: int, prefix: str = "live") -> list[Fields]:
    return [{"response_id": f"{prefix}_{n:05d}", "kind": "end"} for n in range(turns)]


def round_robin(turns: int, updates: int) -> Workload:
    """Many live turns: every turn's update i before any turn's update i+1,
    then the turns' ends."""
    entries = [e for one in text_entries(turns, updates) for e in one] + ends(turns)
    return workload.of(entries, [f"live_{n:05d}" for n in range(turns)])


@dataclass(frozen=True)
class Pace:
    """``turns`` turns, one update each every ``period`` s for ``seconds`` s."""

    turns: int = 1000
    seconds: float = 20.0
    period: float = 0.1
    messages: int = 1  # per turn (text_entries)

    @property
    def updates(self) -> int:
        return self.turns * round(self.seconds / self.period)

    def workload(self) -> Workload:
        """What the producer writes (for the counts and the drain's total)."""
        return workload.of([{} for _ in range(self.updates)] + ends(self.turns, "paced"),
                           [f"paced_{n:05d}" for n in range(self.turns)])


def paced(ctx: Ctx, pace: Pace) -> Feed:
    """The producer of the paced run: every ``period`` s one update of each
    turn, spread over the period in ten slices (a pipeline each), then the
    ends. Returns the Redis time of its first XADD."""
    rounds = text_entries(pace.turns, round(pace.seconds / pace.period), "paced", pace.messages)
    slices = 10

    async def feed(streams: list[str]) -> int:
        (stream,) = streams
        # Its own connection, which waits out a script that blocks redis-server
        # for seconds (the longest call is reported) rather than time out.
        client = redis.asyncio.Redis.from_url(ctx.url, socket_timeout=120)
        try:
            return await produce(client, stream)
        finally:
            await client.aclose()

    async def produce(client: Any, stream: str) -> int:
        start_ms = await workload.redis_ms(client)
        began = time.monotonic()
        step = pace.period / slices
        tick = 0
        for one in rounds:
            size = -(-len(one) // slices)
            for k in range(slices):
                async with client.pipeline(transaction=False) as pipe:
                    for fields in one[k * size:(k + 1) * size]:
                        pipe.xadd(stream, fields)
                    await pipe.execute()
                tick += 1
                await asyncio.sleep(max(0.0, began + tick * step - time.monotonic()))
        await workload.fill(client, stream, ends(pace.turns, "paced"))
        return start_ms

    return feed


def per_update_us(t: Throughput) -> tuple[float, float]:
    """Microseconds of CPU per update: the consumers', redis-server's."""
    return (1e6 * t.cpu.get("consumers", 0) / t.updates, 1e6 * t.cpu.get("redis", 0) / t.updates)


@dataclass
class Live:
    """The two workloads' rows: each round of the many live turns (drain,
    processor, FastStream), and the paced runs (drain, default, held
    throughout)."""

    turns: int
    updates: int  # per turn, many live turns
    pace: Pace
    rounds: list[list[Throughput]]
    paced: list[Throughput]

    @property
    def ratio(self) -> float:
        """Median over the rounds of processor / drain (many live turns)."""
        found = sorted(one[1].rate / one[0].rate for one in self.rounds)
        return found[(len(found) - 1) // 2]

    @property
    def peer_ratio(self) -> float | None:
        found = sorted(one[1].rate / one[2].rate for one in self.rounds if len(one) > 2)
        return found[(len(found) - 1) // 2] if found else None

    def paced_us(self, name: str) -> float:
        """Consumer + redis-server CPU per update (µs) of the paced row ``name``."""
        row = next(t for t in self.paced if t.name == name)
        return sum(per_update_us(row))

    @property
    def paced_peer_us(self) -> float | None:
        """``paced_us`` of FastStream, None when the peer did not run."""
        return self.paced_us(PACED_PEER) if any(t.name == PACED_PEER for t in self.paced) \
            else None


#: The paced rows' names.
PACED_DRAIN, PACED_DEFAULT, PACED_HELD = "drain", "processor, default", "processor, --hold-ms 60000"
PACED_PEER = "FastStream"


async def measure(ctx: Ctx, turns: int, updates: int, pace: Pace, repeat: int, peer: bool,
                  say: Any, many: bool = True, paced_runs: bool = True,
                  flags: tuple[str, ...] = (), commandstats: bool = False) -> Live:
    """Both workloads on the server of ``ctx``: ``repeat`` rounds of the many
    live turns (the drain, one default worker and, with ``peer``, FastStream),
    then the paced turns once each (the drain, with ``peer`` FastStream, the
    default worker, one holding every turn throughout)."""
    rounds: list[list[Throughput]] = []
    paced_rows: list[Throughput] = []
    if many:
        rounds = await _many(ctx, turns, updates, repeat, peer, say, flags)
    if paced_runs:
        paced_rows = await _paced(ctx, pace, say, flags, commandstats, peer)
    return Live(turns, updates, pace, rounds, paced_rows)


async def _many(ctx: Ctx, turns: int, updates: int, repeat: int, peer: bool,
                say: Any, flags: tuple[str, ...] = ()) -> list[list[Throughput]]:
    work = round_robin(turns, updates)
    live = Ctx(ctx.url, ctx.client, ctx.server_pid, ctx.log_dir, "bench:template:live")
    await workload.make_template(ctx.client, live.template, work, ["processor"])
    say(f"{'many live turns':>24}: {turns:,} turns x {updates} text updates, round-robin")
    rounds = []
    for _ in range(repeat):
        one = [await scenarios.drain(live, work),
               await scenarios.processor(live, work, 1, flags=flags,
                                                label=" ".join(("processor, 1 worker", *flags)))]
        if peer:
            one.append(await scenarios.faststream(live, work))
        for t in one:
            w, r = per_update_us(t)
            say(f"{t.name:>24}: {t.rate:>10,.0f} updates/s  ({t.seconds:.2f} s; CPU per "
                f"update: consumers {w:.1f} us, redis {r:.1f} us)")
        rounds.append(one)
    await ctx.client.delete(live.template)
    return rounds


async def _paced(ctx: Ctx, pace: Pace, say: Any, extra: tuple[str, ...] = (),
                 commandstats: bool = False, peer: bool = True) -> list[Throughput]:
    say(f"{'paced long turns':>24}: {pace.turns:,} turns, one update each per "
        f"{pace.period * 1000:g} ms for {pace.seconds:g} s"
        + (f", {pace.messages} messages each" if pace.messages > 1 else ""))
    shape = pace.workload()
    await _longest_call(ctx.client)  # (from here on)
    paced_rows = [await scenarios.drain(ctx, shape, feed=paced(ctx, pace))]
    longest = [await _longest_call(ctx.client)]
    if peer:
        paced_rows.append(await scenarios.faststream(ctx, shape, feed=paced(ctx, pace)))
        longest.append(await _longest_call(ctx.client))
    for name, flags in ((PACED_DEFAULT, ()), (PACED_HELD, ("--hold-ms", "60000"))):
        if commandstats:  # (from here on: the drain's and the other run's left out)
            await ctx.client.config_resetstat()
            await ctx.client.config_set("slowlog-log-slower-than", 0)
            await ctx.client.config_set("slowlog-max-len", 4_000_000)
            await ctx.client.slowlog_reset()
        row = await scenarios.processor(ctx, shape, 1, flags=(*flags, *extra),
                                        feed=paced(ctx, pace), label=name)
        paced_rows.append(row)
        if commandstats:
            say(f"{name}:")
            print_commandstats(await ctx.client.info("commandstats"), row.updates)
            log = await ctx.client.slowlog_get(4_000_000)
            print_scripts(log, row.updates)
            await _longest_call(ctx.client)  # (settings back; it would find that SLOWLOG GET)
            longest.append(max((e["duration"] for e in log), default=0) / 1000)
        else:
            longest.append(await _longest_call(ctx.client))
    for t, ms in zip(paced_rows, longest, strict=True):
        w, r = per_update_us(t)
        say(f"{t.name:>24}: CPU per update: consumers {w:.1f} us, redis {r:.1f} us, "
            f"together {w + r:.1f} us ({t.seconds:.1f} s; longest Redis call {ms:.0f} ms)")
    return paced_rows


async def _longest_call(client: Any) -> float:
    """The longest command redis-server ran since the last call (``SLOWLOG``,
    commands over 10 ms), in ms: a script that blocks every other client."""
    longest = max((e["duration"] for e in await client.slowlog_get(100_000)), default=0) / 1000
    await client.config_set("slowlog-log-slower-than", 10_000)
    await client.config_set("slowlog-max-len", 100_000)  # (the default 128 drops the oldest)
    await client.slowlog_reset()
    return float(longest)


async def _main(args: argparse.Namespace) -> None:
    from processor.embedded import EmbeddedRedis

    with EmbeddedRedis() as server, tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        client = redis.asyncio.Redis.from_url(server.url)
        ctx = Ctx(server.url, client, server.pid or 0, Path(tmp))
        pace = Pace(args.turns, args.seconds, messages=args.messages)
        await measure(ctx, args.turns, args.updates, pace, args.repeat, not args.no_peer,
                      lambda text: print(text, flush=True), many=not args.no_many,
                      paced_runs=not args.no_paced, flags=tuple(args.worker_flags.split()),
                      commandstats=args.commandstats)
        await client.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=1000)
    p.add_argument("--updates", type=int, default=100)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--messages", type=int, default=1,
                   help="messages per paced turn, one after the other (agents handing off)")
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--no-paced", action="store_true")
    p.add_argument("--no-many", action="store_true")
    p.add_argument("--commandstats", action="store_true",
                   help="redis-server's time per command and per script of each paced worker run")
    p.add_argument("--worker-flags", default="",
                   help="extra `processor run` flags for the workers of both workloads, "
                        "e.g. '--no-progress'")
    asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    main()

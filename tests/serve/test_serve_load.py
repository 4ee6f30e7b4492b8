"""Many clients on many live turns, some dropping and resuming at random
moments, also after the turn ended: each client's ids are gap-free across
its resumes, it gets exactly one terminal event with the exact merged
response just before it, and the text it built (a snapshot's, plus the
deltas) is the merged text. Bounded: a few seconds, one worker and one
``processor serve`` (in this process), over real HTTP.

This is what a load run once caught (1 client of 240 got ids 32 then 43):
a resume that reads the turn's state (running), then its live log, while
the turn is published in between (tests/serve/test_serve_resume.py makes that
moment happen on purpose)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable

import aiohttp
from support.serve_harness import check_followed, config, start_local, text_update
from support.sse_followers import Client, follow
from support.worker_harness import Harness

from processor.client import Subscriber

TURNS = 24
CLIENTS = 5  # per turn: 0-1 before its first entry, 2-3 while it runs, 4 at any time
DELTAS = 16
DELTA_PAUSE = 0.03  # seconds between two deltas of one turn (about 0.4 s a turn)
CUT_CHANCE = 0.6  # a connection the client cuts itself, after 1 to CUT_MOST events
CUT_MOST = 8


async def test_many_clients_drop_and_resume_at_random_moments_and_each_gets_it_all(
    redis_url: str, namespace: str
) -> None:
    rng = random.Random(32)
    rids = [f"load{i:02d}" for i in range(TURNS)]
    clients = {rid: [Client(rid, k) for k in range(CLIENTS)] for rid in rids}
    ended: dict[str, float] = {}  # when the turn's merged entry was there
    started = time.monotonic()
    # (Every batch published, --live-interval-ms 0: a client cuts itself after
    # 1 to CUT_MOST events, which a turn must have many of to be cut mid-way.)
    async with Harness(redis_url, namespace, live_interval_ms=0) as harness:
        await harness.start_worker()
        serve = await start_local(config(redis_url, namespace))
        subscriber = Subscriber(harness.client, namespace)
        followers: list[asyncio.Task[None]] = []
        try:
            async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=None)) as session:

                def start(client: Client) -> None:
                    own = random.Random(rng.random())
                    # back after 0 to 0.8 s: often after the turn's end
                    followers.append(asyncio.create_task(follow(
                        session, client, lambda _: serve.url, own, CUT_CHANCE,
                        lambda own=own: own.uniform(0, 0.8), CUT_MOST)))  # type: ignore[misc]

                async def turn(rid: str) -> None:
                    own = clients[rid]
                    for client in own[:2]:
                        start(client)
                    for client in own[:2]:
                        await asyncio.wait_for(client.connected.wait(), 30)
                    joins = dict(zip(rng.sample(range(1, DELTAS), 2), own[2:4], strict=True))
                    joining = asyncio.ensure_future(_later(rng.uniform(0, 1.2), start, own[4]))
                    for i in range(DELTAS):
                        if i in joins:
                            start(joins.pop(i))
                        await harness.add([{"response_id": rid,
                                            "update": text_update(f"{rid}:{i} ", "m")}])
                        await asyncio.sleep(DELTA_PAUSE * rng.uniform(0.5, 1.5))
                    for client in joins.values():
                        start(client)
                    await harness.add([{"response_id": rid, "kind": "end"}])
                    await subscriber.wait_for(rid, 30)
                    ended[rid] = time.monotonic()
                    await joining

                await asyncio.gather(*(turn(rid) for rid in rids))
                _, late = await asyncio.wait(followers, timeout=30)
                assert not late, [c for cs in clients.values() for c in cs if not c.finished]
                for task in followers:
                    task.result()
        finally:
            for task in followers:
                task.cancel()
            await serve.close()
        merged = {rid: (await subscriber.wait_for(rid, 5)).response for rid in rids}
    for rid in rids:
        for client in clients[rid]:
            where = f"{rid} client {client.index}"
            assert client.problems == [] and client.finished, (where, client.problems)
            got = [(ident, json.loads(data)) for ident, data in client.events]
            try:
                check_followed(got, merged[rid])
            except AssertionError as exc:
                raise AssertionError(f"{where}: {exc}\n{client.opened}\n{got}") from exc
    every = [c for cs in clients.values() for c in cs]
    resumes = [(rid_of, when, after) for c in every for (when, after) in c.opened[1:]
               for rid_of in [c.rid]]
    after_end = sum(1 for rid, when, after in resumes if after is not None and when > ended[rid])
    print(f"\nserve load: {len(every)} clients on {TURNS} turns, "
          f"{sum(c.connections for c in every)} connections, {len(resumes)} reconnections "
          f"({after_end} resumed after the turn's end), {sum(c.cuts for c in every)} cut by "
          f"the clients, {time.monotonic() - started:.1f} s")
    assert after_end > 0 and len(resumes) > len(every) // 2


async def _later(delay: float, start: Callable[[Client], None], client: Client) -> None:
    await asyncio.sleep(delay)
    start(client)

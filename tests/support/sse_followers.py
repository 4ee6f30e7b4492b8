"""SSE clients that follow one turn each over real HTTP, the way
``EventSource`` does: on any break they reconnect (to the next server, if
there are several) with ``Last-Event-ID``, and some cut their own
connections. What each received is kept, per connection, for the checks
(tests/chaos/test_serve_chaos.py, tests/serve/test_serve_load.py)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from processor.serve import sse
from support.serve_harness import bearer


@dataclass
class Client:
    """One follower of one turn, across all its connections."""

    rid: str
    index: int
    events: list[tuple[str | None, str]] = field(default_factory=list)  # (id, data)
    last_id: str | None = None
    connections: int = 0
    replicas: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)  # answers other than 200
    breaks: Counter[str] = field(default_factory=Counter)  # connections that broke, by how
    cuts: int = 0  # connections it closed itself
    opened: list[tuple[float, str | None]] = field(default_factory=list)  # (when, resumed after)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False



async def follow(session: aiohttp.ClientSession, client: Client, base_of: Callable[[int], str],
                 rng: random.Random, cut_chance: float = 0.0,
                 pause: Callable[[], float] = lambda: 0.05, most: int = 20) -> None:
    """Follow the turn to its terminal event, reconnecting on every break
    to ``base_of(n)`` for its nth connection (as ``EventSource`` does, with
    ``Last-Event-ID``). With ``cut_chance``, a connection is cut by the
    client itself after 1 to ``most`` events; ``pause()``: the seconds it waits
    before it reconnects."""
    n = client.index
    while True:
        base = base_of(n)
        n += 1
        headers = bearer(client.rid)
        if client.last_id is not None:
            headers["Last-Event-ID"] = client.last_id
        try:
            async with session.get(f"{base}/v1/turns/{client.rid}/events", headers=headers,
                                   timeout=aiohttp.ClientTimeout(sock_connect=5,
                                                                 sock_read=20)) as response:
                if response.status != 200:
                    client.statuses[response.status] += 1
                    if response.status not in (503,):  # 503: Redis is restarting
                        client.problems.append(f"{base} answered {response.status}: "
                                               f"{await response.text()}")
                        return
                    await asyncio.sleep(0.1)
                    continue
                client.connections += 1
                client.opened.append((time.monotonic(), client.last_id))
                client.replicas.add(base)
                client.connected.set()
                cut_after = rng.randint(1, most) if rng.random() < cut_chance else None
                if await _read(client, response, cut_after):
                    return
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            client.breaks[type(exc).__name__] += 1
        await asyncio.sleep(pause())


async def _read(client: Client, response: aiohttp.ClientResponse,
                cut_after: int | None) -> bool:
    """Read one connection; True once the terminal event came (or the
    stream cannot go on: a ``gone`` turn, a problem)."""
    parser = sse.Parser()
    read = 0
    async for chunk in response.content.iter_any():
        for item in parser.feed(chunk):
            if not isinstance(item, sse.Event):
                continue
            read += 1
            client.events.append((item.id, item.data))
            kind = json.loads(item.data)["type"]
            if item.id is not None:
                client.last_id = item.id
            if kind == "dropped":  # a slow client: it resumes from the id it is given
                notice = json.loads(item.data)
                if notice["last_event_id"] != client.last_id:
                    client.problems.append(f"dropped with {notice}, last id {client.last_id}")
            if kind == "gone":
                client.problems.append(f"the turn is gone: {item.data}")
                return True
            if kind == "synthesis":
                client.finished = True
                return True
        if cut_after is not None and read >= cut_after:
            client.cuts += 1
            return False  # leaving the block closes the connection
    client.breaks["closed"] += 1  # by the server: stopping, Redis failed, dropped
    return False

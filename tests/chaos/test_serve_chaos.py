"""``processor serve`` under faults: every client that reconnects ends with
the exact merged response and one terminal event.

A private redis-server (AOF, ``appendfsync always``), two ``processor
serve`` replicas (the same token secret) and two ``processor run --progress``
workers. A producer streams turns of many text deltas each; every turn has
three SSE clients (aiohttp, over real HTTP) that follow
``GET /v1/turns/{id}/events`` with a token: two open before the turn's first
entry, one joins while it runs. On any disconnect a client reconnects to the
next replica with ``Last-Event-ID`` (as ``EventSource`` does), and some
connections are cut by the clients themselves. Meanwhile, at set points of
the input:

- a serve replica is SIGKILLed mid-stream and a new one started; later the
  other one is stopped (SIGTERM, as a rolling deploy does: it must exit 0)
  and a new one started;
- a worker is SIGKILLed mid-turn, while it holds entries it read and has not
  applied (frozen with SIGSTOP until its pending list shows some), and a new
  one started; the survivor reclaims them (``--reclaim-idle-ms 1000``);
- redis-server is SIGKILLed and restarted on the same port and directory
  (the producer pauses meanwhile: its own writes are not the subject)
  while both replicas are frozen (SIGSTOP), until the workers have written
  more events: the replicas' readers must take up from where they were, so
  that the streams still open get the events written meanwhile.

Then, for every client: the events with an id are exactly seqs 0..terminal,
each once and in order (no gap, no repeat across reconnects), each
byte-identical to the event the workers wrote to the ``events`` stream; one
terminal event, last, with the ``merged`` event just before it; every
``merged`` event it saw carries the turn's merged entry's ``response`` and
``meta`` byte for byte, and the text deltas add up to the merged text. Every
turn's merged entry equals ``processor merge`` of the entries sent, byte for
byte (tests/support/turn_reference.py).

The slow client (dropped after ``--client-queue`` events with a resumable
id, then resuming to the end) is tests/serve/test_serve_stream.py's
``test_a_client_that_does_not_read_is_dropped_with_its_resume_id``; here a
``dropped`` notice, should one come, must name the client's last id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import redis.asyncio
from support.serve_harness import ServeProcess, spawn_serve
from support.sse_followers import Client, follow
from support.turn_reference import compare_with_offline, offline_results
from support.worker_harness import Harness, SubprocessWorker

from processor.wire.ids import TurnKey

TURNS = 30
SHARDS = 2  # the workers split them (shard affinity: one may read both); a replica reads both
DELTAS = 30  # text deltas per turn, then its end
WINDOW = 8  # turns written at once
CLIENTS = 3  # per turn: 0 and 1 open before its first entry, 2 joins while it runs
DELTA_PAUSE = 0.12  # seconds between two deltas of one turn
CUT_CHANCE = 0.3  # a connection the client cuts itself, after a few events
# (Every batch published, --live-interval-ms 0: the faults are placed by
# counts of events, one per delta; coalesced, a turn writes a few.)
WORKER_FLAGS: dict[str, Any] = {"progress": True, "reclaim_idle_ms": 1000, "log_level": "info",
                                "live_interval_ms": 0}
FROZEN_EVENTS = 40  # written while both replicas are frozen, during the Redis restart
SERVE_FLAGS = ("--heartbeat", "1", "--log-level", "info")
#: The faults, each at a fraction of the deltas sent.
FAULTS = (("serve-kill", 0.2), ("worker-kill", 0.4), ("redis-kill", 0.6), ("serve-stop", 0.8))


class Replicas:
    """The serve replicas: a client's nth connection goes to the next one."""

    def __init__(self, url: str, namespace: str, log_dir: Path) -> None:
        self.url, self.namespace, self.log_dir = url, namespace, log_dir
        self.procs: list[ServeProcess] = []
        self.gone: list[ServeProcess] = []  # killed or stopped

    async def start(self, count: int) -> None:
        self.procs = [self._spawn() for _ in range(count)]
        for proc in self.procs:
            await proc.wait_serving()

    def base(self, n: int) -> str:
        return self.procs[n % len(self.procs)].url

    async def replace(self, slot: int, kill: bool) -> None:
        """SIGKILL (``kill``) or SIGTERM the replica in ``slot``, whose streams
        break mid-turn, and start another. A stopped one must exit 0."""
        victim = self.procs[slot]
        if kill:
            await asyncio.to_thread(victim.kill)
        else:
            code = await asyncio.to_thread(victim.terminate)
            assert code == 0, f"processor serve exited {code} on SIGTERM:\n{victim.log()}"
        self.gone.append(victim)
        fresh = self._spawn()
        await fresh.wait_serving()
        self.procs[slot] = fresh

    def _spawn(self) -> ServeProcess:
        return spawn_serve(self.url, self.namespace, self.log_dir, *SERVE_FLAGS, shards=SHARDS)


class _Merged(msgspec.Struct):
    """A ``merged`` event as a client reads it: its response and meta as sent."""

    type: str
    status: str
    response: msgspec.Raw
    meta: msgspec.Raw


_decode_merged = msgspec.json.Decoder(_Merged)


# --------------------------------------------------------------------------- the run


@dataclass
class Run:
    harness: Harness
    replicas: Replicas
    restart_redis: Callable[[], Any]
    sent: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    deltas_sent: int = 0
    sending: int = 0  # turns between their first and last delta (they need no replica)
    done_faults: list[str] = field(default_factory=list)
    workers: list[SubprocessWorker] = field(default_factory=list)  # every one started
    gate: asyncio.Lock = field(default_factory=asyncio.Lock)
    rng: random.Random = field(default_factory=lambda: random.Random(28))

    async def add(self, entry: dict[str, Any]) -> None:
        async with self.gate:  # not while Redis restarts
            await self.harness.add([entry])
        self.sent.setdefault(entry["response_id"], []).append(entry)

    async def turn(self, rid: str, clients: list[Client], start: Callable[[Client], None],
                   slots: asyncio.Semaphore) -> None:
        async with slots:
            for client in clients[:2]:
                start(client)
            for client in clients[:2]:  # subscribed (200) before the turn has an entry
                await asyncio.wait_for(client.connected.wait(), 60)
            self.sending += 1
            try:
                for i in range(DELTAS):
                    if i == DELTAS // 3:
                        start(clients[2])
                    await self.add(_delta(rid, i))
                    self.deltas_sent += 1
                    await asyncio.sleep(DELTA_PAUSE * self.rng.uniform(0.5, 1.5))
            finally:
                self.sending -= 1
            await asyncio.wait_for(clients[2].connected.wait(), 60)  # joined while running
            await self.add({"response_id": rid, "kind": "end"})

    async def faults(self) -> None:
        total = TURNS * DELTAS
        serve_slot = 0
        for what, at in FAULTS:
            while self.deltas_sent < at * total:
                await asyncio.sleep(0.05)
            if what.startswith("serve-"):
                await self.replicas.replace(serve_slot, kill=what == "serve-kill")
                serve_slot += 1
            elif what == "worker-kill":
                await self.kill_worker()
            else:
                await self.redis_restart()
            self.done_faults.append(what)

    async def redis_restart(self) -> None:
        """Restart Redis with both replicas frozen (SIGSTOP) until the workers
        wrote more events: their readers must take up where they were (the
        events written meanwhile reach the streams still open), not at the end."""
        frozen = list(self.replicas.procs)
        for proc in frozen:
            proc.proc.send_signal(signal.SIGSTOP)
        try:
            async with self.gate:
                await self.restart_redis()
                with contextlib.suppress(Exception):  # pooled connections are dead
                    await self.harness.client.connection_pool.disconnect()
                before = await self._events_written()
            await self.harness.wait_for(self._frozen_events(before), 30,
                                        f"{FROZEN_EVENTS} events after the restart")
        finally:
            for proc in frozen:
                proc.proc.send_signal(signal.SIGCONT)

    async def _events_written(self) -> int:
        return sum([await self.harness.client.xlen(shard.events)
                    for shard in self.harness.shards])

    def _frozen_events(self, before: int) -> Callable[[], Any]:
        """Enough events written since ``before`` while the replicas are
        frozen: ``FROZEN_EVENTS``, or fewer, but some, once no more can
        come: only turns between their first and last delta go on (the
        others wait for a client to connect to a replica), and on a busy
        machine a worker merges more deltas into each event, so those turns
        may end their deltas with fewer events (the wait used to time out).
        When the restart comes after every turn of the window sent its last
        delta (each waits for a client on a frozen replica before its end),
        none comes at all: the wait required one and timed out (CI, with the
        8 turns active and nothing pending)."""
        async def reached() -> bool:
            written = await self._events_written() - before
            return written >= FROZEN_EVENTS or self.sending == 0
        return reached

    def worker_logs(self) -> list[str]:
        return [sub.log() for sub in self.workers]

    async def kill_worker(self) -> None:
        """SIGKILL a worker while it holds entries it has not applied, start
        another. Frozen (SIGSTOP) in its blocking XREADGROUP, it is still
        delivered the next entries of its shard: they are pending to it."""
        harness = self.harness
        for attempt in range(20):  # a worker may read no shard (affinity): try each
            victim = harness.procs[attempt % len(harness.procs)]
            victim.proc.send_signal(signal.SIGSTOP)
            if await self._comes_to_hold(victim):
                break
            victim.proc.send_signal(signal.SIGCONT)
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("no worker ever held an entry to be killed with")
        harness.kill(victim)
        self.workers.append(harness.spawn(**WORKER_FLAGS))

    async def _comes_to_hold(self, sub: SubprocessWorker) -> bool:
        for _ in range(25):
            if await self._holds_entries(sub):
                return True
            await asyncio.sleep(0.02)
        return False

    async def _holds_entries(self, sub: SubprocessWorker) -> bool:
        for shard in self.harness.shards:
            if await self.harness.client.xpending_range(
                    shard.updates, self.harness.group, min="-", max="+", count=1,
                    consumername=sub.consumer):
                return True
        return False


def _delta(rid: str, i: int) -> dict[str, Any]:
    return {"response_id": rid, "update": {
        "type": "agent_response_update", "role": "assistant", "message_id": "m",
        "author_name": "bob", "contents": [{"type": "text", "text": f"{rid}:{i} "}]}}


async def test_streams_survive_killed_replicas_workers_and_a_redis_restart(
    make_redis_server, namespace: str, tmp_path: Path
) -> None:
    server = make_redis_server(appendonly=True)  # appendfsync always
    assert server.appendonly

    async def restart_redis() -> None:
        await server.akill()  # a crash: only what the AOF fsynced survives
        await server.astart()

    async with Harness(server.url, namespace, SHARDS, log_dir=tmp_path) as harness:
        workers = [harness.spawn(**WORKER_FLAGS) for _ in range(2)]
        await harness.wait_started(workers, timeout=60)  # the namespace's record
        replicas = Replicas(server.url, namespace, tmp_path)
        run = Run(harness, replicas, restart_redis, workers=list(workers))
        rids = [f"sc{i:02d}" for i in range(TURNS)]
        clients = {rid: [Client(rid, k) for k in range(CLIENTS)] for rid in rids}
        followers: list[asyncio.Task[None]] = []
        try:
            await replicas.start(2)
            async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=None)) as session:
                rng = random.Random(5)

                def start(client: Client) -> None:
                    followers.append(asyncio.create_task(
                        follow(session, client, replicas.base, random.Random(rng.random()),
                               CUT_CHANCE)))

                slots = asyncio.Semaphore(WINDOW)
                faults = asyncio.create_task(run.faults())
                await asyncio.gather(*(run.turn(rid, clients[rid], start, slots)
                                       for rid in rids))
                await asyncio.wait_for(faults, 60)
                await harness.wait_merged(TURNS, timeout=60)
                _, late = await asyncio.wait(followers, timeout=60)
                assert not late, _unfinished(clients)
                for task in followers:
                    task.result()
            harness.assert_workers_alive()
            outputs = await harness.outputs()
            events = await _events(harness)
            exits = [await asyncio.to_thread(proc.terminate) for proc in replicas.procs]
        finally:
            for task in followers:
                task.cancel()
            for proc in replicas.procs:
                proc.kill()  # (SIGKILL ends a frozen one too)
    assert run.done_faults == [what for what, _ in FAULTS]
    assert exits == [0, 0], [proc.log()[-2000:] for proc in replicas.procs]
    logs = [proc.log() for proc in replicas.procs + replicas.gone] + run.worker_logs()
    for log in logs:
        assert '"level": "error"' not in log, log[-3000:]
    # The killed worker held entries: another one reclaimed them.
    assert any('"reclaimed entries"' in log for log in run.worker_logs())

    # Every turn's merged entry is processor merge of the entries sent.
    entries = [entry for rid in rids for entry in run.sent[rid]]
    compare_with_offline(outputs, offline_results(entries), "serve chaos")
    for rid in rids:
        merged = outputs.turns[TurnKey(rid)].merged[0]
        for client in clients[rid]:
            check_client(client, merged, events[rid])
    reconnects = sum(c.connections - 1 for cs in clients.values() for c in cs)
    moved = sum(len(c.replicas) > 1 for cs in clients.values() for c in cs)
    breaks = sum((c.breaks for cs in clients.values() for c in cs), Counter())
    statuses = sum((c.statuses for cs in clients.values() for c in cs), Counter())
    print(f"\nserve chaos: {TURNS * CLIENTS} clients, {reconnects} reconnections, "
          f"{moved} clients on more than one replica, broken connections {dict(breaks)}, "
          f"answers other than 200 {dict(statuses)}")
    # The faults reached the streams: clients were cut off and resumed elsewhere.
    assert breaks and moved


def check_client(client: Client, merged: dict[str, str], events: dict[int, str]) -> None:
    """The events one client saw, across all its connections."""
    where = f"{client.rid} client {client.index}"
    assert client.problems == [], f"{where}: {client.problems}"
    assert client.finished, f"{where}: no terminal event"
    with_id = [(event_id, data) for event_id, data in client.events if event_id is not None]
    seqs = [json.loads(data)["seq"] for _, data in with_id]
    assert [event_id for event_id, _ in with_id] == [str(seq) for seq in seqs], where
    # From synthesis.started (or, for a client that joined a running turn, from
    # one snapshot, whose id is the last seq it folds) to the terminal event,
    # each seq once and in order: no gap, no duplicate at the join.
    first = json.loads(with_id[0][1])
    types = [json.loads(data)["type"] for _, data in client.events]
    if first["type"] == "synthesis":
        # No event reached it before the turn ended: each connection it had
        # broke first (a replica killed, or frozen through the Redis
        # restart), and it came back without a Last-Event-ID after the end.
        # A fresh join of an ended turn gets its merged and terminal events.
        assert len(client.opened) > 1 and client.opened[-1][1] is None, where
        assert with_id == [(str(len(events) - 1), events[len(events) - 1])], where
        assert types == ["merged", "synthesis"], f"{where}: {types}"
    else:
        start = first["seq"] + 1 if first["type"] == "snapshot" else 0
        live = with_id[1:] if first["type"] == "snapshot" else with_id
        assert seqs[len(with_id) - len(live):] == list(range(start, len(events))), \
            f"{where}: seqs {seqs}, events {len(events)}"
        for (_, data) in live:
            seq = json.loads(data)["seq"]
            assert data == events[seq], f"{where}: seq {seq}: {data} != {events[seq]}"
    assert types.count("synthesis") == 1 and types[-1] == "synthesis", f"{where}: {types}"
    assert types[-2] == "merged", f"{where}: {types}"
    assert types.count("snapshot") <= 1, f"{where}: {types}"
    assert set(types) <= {"snapshot", "synthesis.started", "step", "synthesis.chunk",
                          "merged", "synthesis", "dropped"}, f"{where}: {types}"
    # Every merged event carries the turn's merged entry, byte for byte (a client
    # cut off between the merged event and the terminal one gets both again).
    for _, data in client.events:
        if json.loads(data)["type"] == "merged":
            seen = _decode_merged.decode(data)
            assert bytes(seen.response) == merged["response"].encode(), where
            assert bytes(seen.meta) == merged["meta"].encode(), where
            assert seen.status == merged["status"] == "completed", where
    # The view a UI builds before the merged event (the snapshot, then each
    # chunk appended, or replacing with replace: true) holds each delta at most
    # once: none repeated across the join or a resume. Progress may miss
    # deltas after a worker is killed (the worker that takes the turn over
    # stays silent for it, docs/design.md "Offline vs live"); the merged event
    # is what makes the end exact.
    pieces = [f"{client.rid}:{i} " for i in range(DELTAS)]
    view: dict[str, str] = {}
    for _, data in with_id:
        event = json.loads(data)
        if event["type"] == "snapshot":
            view = {m["message_id"]: "".join(c.get("text") or "" for c in m["contents"])
                    for m in event["response"]["messages"]}
        elif event["type"] == "synthesis.chunk":
            before = "" if event.get("replace") else view.get(event["message_id"], "")
            view[event["message_id"]] = before + event["delta"]
    shown = Counter(re.findall(rf"{re.escape(client.rid)}:\d+ ", "".join(view.values())))
    assert set(shown) <= set(pieces) and all(n == 1 for n in shown.values()), \
        f"{where}: {view}"
    response = json.loads(merged["response"])
    text = "".join(c["text"] for m in response["messages"] for c in m["contents"])
    assert text == "".join(pieces), where


async def _events(harness: Harness) -> dict[str, dict[int, str]]:
    """Each turn's events as the workers wrote them: seq -> the event's JSON."""
    out: dict[str, dict[int, str]] = {}
    raw: redis.asyncio.Redis = harness.client
    for shard in harness.shards:
        for _entry_id, fields in await raw.xrange(shard.events):
            event = fields[b"event"].decode()
            rid = fields[b"response_id"].decode()
            seq = json.loads(event)["seq"]
            assert seq not in out.setdefault(rid, {}), f"{rid}: seq {seq} written twice"
            out[rid][seq] = event
    return out


def _unfinished(clients: dict[str, list[Client]]) -> str:
    lines = []
    for cs in clients.values():
        for c in cs:
            if not c.finished:
                lines.append(f"{c.rid}/{c.index}: last id {c.last_id}, {c.connections} "
                             f"connections to {sorted(c.replicas)}, breaks "
                             f"{dict(c.breaks)}, statuses {dict(c.statuses)}, "
                             f"problems {c.problems}")
    return "clients without a terminal event:\n" + "\n".join(lines)

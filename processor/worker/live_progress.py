"""The worker's side of live progress (``--progress``, on by default;
``processor.engine.live`` decides what to say): after each batch, one
``publish_live`` call for the turns the batch moved (two for a held batch of
many turns), from the held path (the held turn's merge) and from the stored
path (the worker's own mirror of the turn, ``processor.worker.stored.mirror``).
``LivePublisher`` is one part of ``Worker``,
given to both paths and run inside its shard runners, before the batch's
finalise (so a turn's last deltas come before its outcome).

What a turn's live events have said (``Shown``) lives
with the turn: on its ``Held`` while held, on
its mirror while stored. A held turn that spills hands it over, with how many
of its updates its log holds already and how many calls for it ran (kept in
the shard's ``ShardState``), to the stored
path's first publish of it. A stored turn without a mirror (stored by several
workers, or past ``--mirror-turns``) publishes no deltas: its stream goes on
with its outcome, whose ``merged`` event is authoritative.

Exactly once: a call is retried, unchanged, until its outcome is known
(the worker's ``retrying``, as every step of the shard loop); each turn's
token in the call (how many of this worker's calls for it ran, under this
worker's random ``speaker`` id) makes a call that ran but whose reply was
lost answer "ran before" (-3) instead of saying it again, and what it said
is then committed. A call whose outcome stays unknown (a non-transient
error, or the worker stopping while Redis is away) silences its turns: they
say nothing more, and their ``merged`` event ends any view.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal, NamedTuple

import msgspec

from processor.engine.live import live_events
from processor.engine.live_growth import live_progress
from processor.engine.shown import Shown
from processor.redis_io.connections import handed_over
from processor.scripts.live_calls import LiveTurn, build_publish_live, publish_live, updates_json
from processor.scripts.stored_calls import Applied
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.wire.outputs import Event, Response
from processor.worker.held.holds import Held, Holds
from processor.worker.live_pace import RENEW_S, Renewals, live_interval, read_lag
from processor.worker.shard_state import HandedLive, ShardState
from processor.worker.shell import Retrying, Shell
from processor.worker.stored.mirror import Mirror

log = logging.getLogger("processor.worker")

_json = msgspec.json.Encoder()

#: ``publish_live``'s answers for a turn besides its count of events: ended
#: (or no hash), another speaks for it, this very call ran before.
ENDED, SILENT, RAN_BEFORE = -1, -2, -3


class Ended(NamedTuple):
    """A held turn that ended, as a live step left it for its finalise."""

    entries: int  # how many entries it held then
    response: Response  # its merged response (valid while it holds no more)
    events: list[Event]  # its last live events (from that response)
    spoken: int  # how many publish_live calls for it ran (the token finalise_held checks)


#: What a live step made of the held turns that ended, for their finalise.
Rendered = dict[TurnKey, Ended]

#: A batch that moved at least this many held turns publishes them in two
#: calls, the first sent while the second half is diffed.
SPLIT_TURNS = 16
#: Seconds between two log lines about turns without a mirror.
LOG_EVERY_S = 60.0


async def nothing(rendered: Rendered) -> None:
    """No finalise (a publish of turns outside their batch: it finalised what ended)."""


class LivePublisher:
    """Live progress of the worker's shards, for its held and stored paths.

    A running turn's live progress is published at most once per
    ``live_interval`` (``--live-interval-ms``, stretched while the shard's
    reads are behind): a turn a batch moves sooner after its last
    publish waits (its updates coalesce), and ``publish_waiting``, run
    by the shard loop after each batch and each idle read, publishes it once
    its time comes. A turn that ended, or whose mirror began with the batch,
    never waits; a held turn never published waits only while the interval
    is stretched (``_wait``)."""

    def __init__(self, shell: Shell, shards: Mapping[int, ShardState],
                 retrying: Retrying) -> None:
        self.shell = shell  # (the worker's client, settings, scripts and metrics, shared)
        self.shards = shards
        self.retrying = retrying
        self.interval = shell.config.live_interval_ms / 1000
        self.most = shell.config.live_interval_max_ms / 1000
        # Per shard, the least seconds between two publishes of a running turn
        # now (live_interval of its last read's lag).
        self._intervals: dict[int, float] = {}
        self.renewals = Renewals(RENEW_S, time.monotonic())
        # Per shard, the turns waiting for their next publish, and when it is due
        # (monotonic seconds).
        self._waiting: dict[int, dict[TurnKey, float]] = {}
        self._without_mirror_logged = -LOG_EVERY_S
        # This worker's id in its turns' `live` tokens (publish_live.lua):
        # random, so that no other worker, nor this one restarted, has it.
        self.speaker = secrets.token_hex(8)

    def hand_over(self, shard: Shard, key: TurnKey, shown: Shown | Literal[False],
                  logged: int, spoken: int) -> None:
        """A held turn spills: its live state goes with it to the stored path."""
        if self.shell.config.progress:
            self.shards[shard.index].hand_live(key, HandedLive(shown, logged, spoken))

    def read(self, shard: Shard, newest_id: bytes | str | None, now_ms: int) -> None:
        """A read of the shard is about to be applied: ``newest_id``, its
        newest entry's id (None: it read nothing, so it is not behind)."""
        lag = 0.0 if newest_id is None else read_lag(newest_id, now_ms)
        self._intervals[shard.index] = live_interval(self.interval, lag, self.most)

    def interval_of(self, shard: Shard) -> float:
        """The least seconds between two publishes of a running turn of the shard now."""
        return self._intervals.get(shard.index, self.interval)

    def _wait(self, shard: Shard, key: TurnKey, since: float) -> bool:
        """Whether a running turn last published at ``since`` (0: never)
        waits for its next publish (then noted as waiting). A turn never
        published is published at once, unless the shard's interval is
        stretched (its reads are behind their producers by more than
        ``--live-interval-ms``, which is not 0: 0 publishes every batch):
        then its first publish waits that long too, so that a turn read
        whole within it (a backlog's) is told once, with its outcome,
        instead of once and again, and a reader sees it no later than the
        lag already shows it."""
        now = time.monotonic()
        interval = self.interval_of(shard)
        waiting = self._waiting.get(shard.index)
        if since:
            due = since + interval
        elif self.interval and interval > self.interval:
            due = waiting.get(key, now + interval) if waiting else now + interval
        else:
            due = now
        if due <= now:
            if waiting:
                waiting.pop(key, None)
            return False
        self._waiting.setdefault(shard.index, {}).setdefault(key, due)
        return True

    async def publish_waiting(self, shard: Shard) -> None:
        """Publish the waiting turns whose time came (those still held or
        followed by a mirror; an ended one goes with its outcome)."""
        waiting = self._waiting.get(shard.index)
        if not waiting:
            return
        now = time.monotonic()
        due = [key for key, at in waiting.items() if at <= now]
        for key in due:
            del waiting[key]
        state = self.shards[shard.index]
        held = [key for key in due if key in state.holds.turns]
        stored = [key for key in due if key not in state.holds.turns
                  and key in state.mirrors.turns]
        if held:
            await self.publish_live_held(shard, held, nothing)
        if stored:
            await self._say_stored(shard, stored, set())

    async def publish_live_held(self, shard: Shard, keys: list[TurnKey],
                                then: Callable[[Rendered], Awaitable[None]],
                                force: bool = False) -> None:
        """The live progress of the held turns a batch fed, then ``then``
        (the batch's finalise). A turn that ended is not in the call: its
        events, and the merged response they were diffed from, go to
        ``then`` (``Rendered``), whose ``finalise_held`` publishes them
        just before its outcome, in the same step. The call for the other
        turns (two for many of them: the first half's sent as soon as it is
        made) is sent first, so that redis-server runs it while the ended
        turns are diffed and finalised; its outcome is awaited last (no
        event of one turn waits for another's). A running turn published
        less than ``--live-interval-ms`` ago waits, unless ``force``."""
        holds = self.shards[shard.index].holds
        now = int(time.time() * 1000)
        going: list[tuple[TurnKey, Held, Shown]] = []
        ended: list[tuple[TurnKey, Held, Shown]] = []
        for key in keys:
            held = holds.turns.get(key)
            if held is None or held.shown is False:
                continue
            # A running turn that waits keeps its plain updates pending,
            # undecoded, so that they are decoded and folded together when it
            # is published (they cannot end it: Held's room keeps them within
            # its limits, and anything else fed catches up first).
            if held.replay.life.outcome is None and not force \
                    and self._wait(shard, key, held.live_at):
                continue
            if not held.catch_up():
                continue  # (a broken turn spills: the stored path goes on)
            if held.replay.life.outcome is not None:
                ended.append((key, held, held.shown))
            else:
                going.append((key, held, held.shown))
        sent: list[tuple[asyncio.Future[list[int]], list[LiveTurn], list[tuple[Shown, int]]]] = []
        turns: list[LiveTurn] = []
        after: list[tuple[Shown, int]] = []
        half = len(going) // 2 if len(going) >= SPLIT_TURNS else -1
        at = time.monotonic()
        try:
            for i, (key, held, was) in enumerate(going):
                if i == half and turns:
                    sent.append((asyncio.ensure_future(self._publish(shard, turns)), turns, after))
                    turns, after = [], []
                    await handed_over()
                turn = held.replay.life.turn
                found, shown = live_progress(key, turn.state.ids, was, turn, now)
                held.live_at = at
                if found or held.fresh:
                    turns.append(self._turn(key, found, held.fresh, held.spoken, at))
                    after.append((shown, len(held.fresh)))
                else:
                    held.shown = shown  # (nothing to say: nothing sent)
            if turns:
                sent.append((asyncio.ensure_future(self._publish(shard, turns)), turns, after))
                await handed_over()
            rendered: Rendered = {}
            for key, held, was in ended:
                life = held.replay.life
                response = life.response()
                found, _ = live_events(key, life.turn.state.ids, was, response, now)
                rendered[key] = Ended(len(held.ids), response, found, held.spoken)
            await then(rendered)
            for publishing, turns, after in sent:
                self._commit_held(holds, turns, after, await publishing)
        finally:
            for publishing, _, _ in sent:
                publishing.cancel()  # (a no-op once done)

    def _turn(self, key: TurnKey, found: list[Event], fresh: list[bytes], spoken: int,
              now: float) -> LiveTurn:
        """A turn's part of a ``publish_live`` call: its log gets its TTL
        when ``Renewals`` says so (asked only of a part that adds a log
        entry, so that the entry that makes the log gets it)."""
        return LiveTurn(key, found, updates_json(fresh), spoken,
                        bool(found or fresh) and self.renewals.due(key, now))

    @staticmethod
    def _commit_held(holds: Holds, turns: list[LiveTurn], after: list[tuple[Shown, int]],
                     results: list[int]) -> None:
        """What a call said of held turns, now known (``results``: its answers)."""
        for turn, (shown, n), result in zip(turns, after, results, strict=True):
            held = holds.turns.get(turn.key)
            if held is None:
                continue
            if result < 0 and result != RAN_BEFORE:
                held.shown = False  # (ended, another speaks for it, or unknown)
                held.fresh.clear()
                continue
            held.shown = shown
            del held.fresh[:n]
            held.logged += n
            held.spoken += 1

    async def publish_live_stored(self, shard: Shard, applied: list[Applied],
                                  fresh: set[TurnKey]) -> None:
        """The live progress of the turns an ``apply_entries`` call stored,
        from this worker's mirrors of them (``fresh``: the mirrors that are
        the state the call left). A running turn published less than
        ``--live-interval-ms`` ago waits, its updates kept on its mirror."""
        state = self.shards[shard.index]
        mirrors = state.mirrors.turns
        by_turn: dict[TurnKey, list[Applied]] = {}
        for entry in applied:
            by_turn.setdefault(entry.key, []).append(entry)
        say: list[TurnKey] = []  # (the turns to publish now)
        first: set[TurnKey] = set()
        without_mirror = 0
        for key, records in by_turn.items():
            hand = state.take_handed(key)
            mirror = mirrors.get(key) if key in fresh else None
            if mirror is None:
                without_mirror += 1
                continue
            # (A repeat of a number, docs/contract.md §3.4, is merged nowhere:
            # the live log, which serve folds for a snapshot, leaves it out.)
            repeats = mirror.replay.duplicates
            updates = [e.record.update for e in records
                       if e.record.update is not None and e.entry_id not in repeats]
            if mirror.shown is False:  # silent (publish_live answered -2, or unknown)
                continue
            if mirror.shown is None:
                if hand is not None:  # a spilled turn: its log has the first `logged`
                    mirror.shown, mirror.spoken = hand.shown, hand.spoken
                    if mirror.shown is False:
                        continue
                    updates = updates[hand.logged:]
                elif mirror.version == len(records):  # the mirror began with this call
                    mirror.shown = Shown()
                    first.add(key)
                else:
                    continue
            mirror.fresh += [_json.encode(u) for u in updates]
            if (key in first or mirror.replay.life.outcome is not None
                    or not self._wait(shard, key, mirror.live_at)):
                say.append(key)
        if without_mirror:
            self._no_mirror(shard, without_mirror)
        if say:
            await self._say_stored(shard, say, first)

    async def _say_stored(self, shard: Shard, keys: list[TurnKey], first: set[TurnKey]) -> None:
        """One ``publish_live`` call for stored turns, from their mirrors
        (``first``: turns whose mirror began with this batch, said even with
        nothing to say, so that their log's token is theirs from the start)."""
        mirrors = self.shards[shard.index].mirrors.turns
        now = int(time.time() * 1000)
        at = time.monotonic()
        turns: list[LiveTurn] = []
        after: list[tuple[Mirror, Shown, int]] = []
        for key in keys:
            mirror = mirrors.get(key)
            if mirror is None or not isinstance(shown := mirror.shown, Shown):
                continue
            turn = mirror.replay.life.turn
            found, shown_after = live_progress(key, turn.state.ids, shown, turn, now)
            mirror.live_at = at
            if found or mirror.fresh or key in first:
                turns.append(self._turn(key, found, mirror.fresh, mirror.spoken, at))
                after.append((mirror, shown_after, len(mirror.fresh)))
            else:
                mirror.shown = shown_after  # (nothing to say: nothing sent)
        if not turns:
            return
        results = await self._publish(shard, turns)
        for (mirror, shown_after, n), result in zip(after, results, strict=True):
            if result >= 0 or result == RAN_BEFORE:
                mirror.shown = shown_after
                del mirror.fresh[:n]
                mirror.spoken += 1
            else:
                mirror.shown = False
                mirror.fresh.clear()

    def _no_mirror(self, shard: Shard, turns: int) -> None:
        """Count (and log, once a minute) stored turns this batch moved whose
        live progress it could not say, for lack of this worker's mirror."""
        self.shell.metrics.live_without_mirror.inc(turns)
        now = time.monotonic()
        if now - self._without_mirror_logged >= LOG_EVERY_S:
            self._without_mirror_logged = now
            log.warning("stored turns without a mirror publish no live progress until their "
                        "outcome (processor_live_without_mirror_total)",
                        extra={"shard": shard.index, "turns": turns})

    async def _publish(self, shard: Shard, turns: list[LiveTurn]) -> list[int]:
        """One ``publish_live`` call, retried unchanged until its outcome is
        known: its answer per turn (``publish_live.lua``). One whose outcome
        stays unknown answers ``SILENT`` for each turn (the caller
        silences them: saying anything more of them might repeat what the
        call said). The batch is applied whatever happens here."""
        call = build_publish_live(shard, turns, self.shell.options, self.speaker)

        async def publish() -> list[int]:
            return await publish_live(self.shell.scripts.publish_live, call)

        try:
            return await self.retrying(publish)
        except Exception as exc:
            log.warning("live progress not published: its turns go silent until their end",
                        extra={"shard": shard.index, "turns": len(turns), "error": repr(exc)})
            return [SILENT] * len(turns)

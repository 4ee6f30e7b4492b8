"""The worker's side of live progress (``--progress``, on by default;
:mod:`processor.engine.live` decides what to say): after each batch, one
``publish_live`` call for the turns the batch moved, from the held path
(the held turn's merge) and from the stored path (the worker's own copy of
the turn, :mod:`processor.worker.stored.mirror`). A mixin of
:class:`~processor.worker.Worker`, run inside its shard loops, before the
batch's finalise (so a turn's last deltas come before its outcome).

What a turn's live events have said (:class:`~processor.engine.live.Shown`) lives
with the turn: on its :class:`~processor.hold.Held` while held, on its copy
while stored. A held turn that spills hands it over, with how many of its
updates its log holds already, to the stored path's first publish of it. A
stored turn without a copy (stored by several workers, or past
``--mirror-turns``) publishes no deltas: its stream goes on with its
outcome, whose ``merged`` event is authoritative.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec

from processor.engine.live import Shown, live_events
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.wire.models import Update
from processor.worker.batches import BatchOptions, LiveTurn, build_publish_live, updates_json
from processor.worker.held.hold import Holds
from processor.worker.stored.mirror import Applied, Mirrors

log = logging.getLogger("processor.worker")

_json = msgspec.json.Encoder()


class Publishing:
    """Live progress, for :class:`~processor.worker.Worker`."""

    config: Any  # WorkerConfig
    options: BatchOptions
    scripts: Any
    _holds: dict[int, Holds]
    _mirrors: dict[int, Mirrors]

    def _handed(self, shard: Shard) -> dict[TurnKey, tuple[Shown, int]]:
        """Spilled turns' live state, until the stored path's first publish of them."""
        handed: dict[int, dict[TurnKey, tuple[Shown, int]]] = self.__dict__.setdefault(
            "_live_handed", {})
        return handed.setdefault(shard.index, {})

    def _hand_over(self, shard: Shard, key: TurnKey, shown: Shown, logged: int) -> None:
        """A held turn spills: its live state goes with it to the stored path."""
        if self.config.progress:
            self._handed(shard)[key] = (shown, logged)

    async def _publish_live_held(self, shard: Shard, keys: list[TurnKey]) -> None:
        """The live progress of the held turns a batch fed."""
        holds = self._holds[shard.index]
        now = int(time.time() * 1000)
        turns: list[LiveTurn] = []
        after: dict[TurnKey, tuple[Shown, int]] = {}
        for key in keys:
            held = holds.turns.get(key)
            if held is None or not held.catch_up():
                continue  # (a broken turn spills: the stored path goes on)
            life = held.replay.life
            found, shown = live_events(key, life.turn.state.ids, held.shown, life.response(), now)
            if found or held.fresh:
                turns.append((key, found, updates_json(held.fresh), False))
                after[key] = (shown, len(held.fresh))
        if not turns or await self._publish(shard, turns) is None:
            return
        for key, (shown, n) in after.items():
            held = holds.turns.get(key)
            if held is not None:
                held.shown = shown
                del held.fresh[:n]
                held.logged += n

    async def _publish_live_stored(self, shard: Shard, applied: list[Applied],
                                   fresh: set[TurnKey]) -> None:
        """The live progress of the turns an ``apply_entries`` call stored,
        from this worker's copies of them (``fresh``: the copies that are
        the state the call left)."""
        handed = self._handed(shard)
        by_turn: dict[TurnKey, list[Update | None]] = {}
        for entry in applied:
            by_turn.setdefault(entry.key, []).append(entry.record.update)
        mirrors = self._mirrors[shard.index].turns
        now = int(time.time() * 1000)
        turns: list[LiveTurn] = []
        after: dict[TurnKey, Shown] = {}
        for key, records in by_turn.items():
            hand = handed.pop(key, None)
            mirror = mirrors.get(key) if key in fresh else None
            if mirror is None:
                continue
            updates = [u for u in records if u is not None]
            shown, first = mirror.shown, False
            if shown is False:  # another worker spoke for it (publish_live answered -2)
                continue
            if shown is None:
                if hand is not None:  # a spilled turn: its log has the first `logged`
                    shown, logged = hand
                    updates = updates[logged:]
                elif mirror.version == len(records):  # the copy began with this call
                    shown, first = Shown(), True
                else:
                    continue
            life = mirror.replay.life
            found, shown_after = live_events(key, life.turn.state.ids, shown, life.response(),
                                             now)
            if found or updates or first:
                turns.append((key, found, updates_json([_json.encode(u) for u in updates]),
                              first))
            after[key] = shown_after
        results = await self._publish(shard, turns) if turns else []
        if results is None:
            return
        silent = {turn[0] for turn, result in zip(turns, results, strict=True)
                  if int(result) == -2}
        for key, shown in after.items():
            mirror = mirrors.get(key)
            if mirror is not None:
                mirror.shown = False if key in silent else shown

    async def _publish(self, shard: Shard, turns: list[LiveTurn]) -> list[Any] | None:
        """One ``publish_live`` call: its answer, or None if it failed. Best
        effort: the batch is applied whatever happens here, and what a failed
        call did not say is in the next one's diff (what was shown stays as
        it was)."""
        call = build_publish_live(shard, turns, self.options)
        try:
            results: list[Any] = await self.scripts.publish_live(keys=call.keys, args=call.args)
        except Exception as exc:
            log.warning("live progress not published", extra={
                "shard": shard.index, "turns": len(turns), "error": repr(exc)})
            return None
        return results

"""The worker's own mirror of the turns it is applying, so that finalising a
turn need not read its records back from Redis and replay them.

Redis stays the source of truth: every record is still stored by
``apply_entries`` (any worker can finish any turn, and a crash loses
nothing). A ``Mirror`` is only a cache of the replay of those records,
kept while this worker stored *every* record of the turn, in entry-id
order. ``apply_entries`` reports each turn's version before and after a call
and how many records it stored; a mirror whose version is not exactly the
one before, or a call that did not store every entry it was given for the
turn, or whose version moved by more than those records and the turn's
dead letters the worker asked for (each counted in the turn's hash, as the
mirror counts them), or an entry older than the mirror's last one (a
reclaimed entry), and the mirror is dropped (a dropped entry of the turn,
or one dead-lettered by the script itself, moves its version too). A dead
letter the worker decided (an entry that does not decode) does not drop
it: the turn's live progress, told from the mirror, goes on after it.
The finalise uses a mirror only if the turn hash it reads has the
mirror's version and start time, or, without reading it, if the apply
call that made the turn ready left it at the mirror's version
(``Mirrors.update`` names those turns); ``finalise_turns`` checks that
version again atomically with the publish: whatever happened since, the
published response is the replay of exactly the stored records, as before.

Bounded: at most ``max_turns`` mirrors and ``max_bytes`` of their entries
(oldest dropped first); a dropped mirror only means a replay from Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from processor.engine.lifecycle import Limits, TurnLife
from processor.engine.replay import Replay
from processor.engine.shown import Shown
from processor.scripts.stored_calls import Applied, Version
from processor.wire.ids import TurnKey
from processor.wire.stream_ids import id_order
from processor.worker.budget import MIRROR_BYTES


@dataclass
class TurnCopy:
    """A turn merged in this worker's memory: the replay of the entries it
    fed, and what rendering it needs of the turn's hash (its version and
    start). Two kinds, which share this: a ``Mirror`` follows a
    stored turn (its version is the one ``apply_entries`` left, its live
    progress may not have begun here), a ``Held``
    turn was never stored (version 0), keeps its entries, pending, to spill
    them, and its live progress from its first entry on."""

    replay: Replay
    started: str  # ms, as the turn's hash has it
    version: int = 0
    dlq: int = 0  # the turn's dead letters counted in its hash (``dlq``)
    # Live progress (processor.worker.live_progress): the updates merged since
    # the turn's last live log entry (JSON texts), and when (monotonic
    # seconds) its live progress was last published from this mirror.
    fresh: list[bytes] = field(default_factory=list)
    live_at: float = 0.0

    def turn_hash(self) -> dict[bytes, bytes]:
        """The turn's hash as this mirror knows it: its version, start and count
        of dead letters, and nothing dropped (that moves the version past a mirror)."""
        known = {b"ver": str(self.version).encode(), b"started": self.started.encode()}
        if self.dlq:
            known[b"dlq"] = str(self.dlq).encode()
        return known


@dataclass
class Mirror(TurnCopy):
    """This worker's mirror of a stored turn it applied every record of."""

    last_id: tuple[int, int] = (0, 0)
    # What the turn's live events said so far (processor.engine.live; set by the
    # worker that publishes them from this mirror; False: another worker spoke
    # for the turn first, or what this one said is unknown: it stays silent),
    # and how many of this worker's publish_live calls for it ran.
    shown: Shown | Literal[False] | None = None
    spoken: int = 0

    def matches(self, turn_hash: dict[str, str]) -> bool:
        """Whether ``turn_hash`` (as read from Redis, as text) is the state this mirror replays."""
        return (turn_hash.get("ver") == str(self.version)
                and turn_hash.get("started") == self.started)


class _Fed:
    """One turn of a batch fed ahead (``Mirrors.feed_ahead``)."""

    __slots__ = ("bytes", "count", "known", "last", "mirror", "version")

    def __init__(self, key: TurnKey, mirror: Mirror | None, limits: Limits) -> None:
        self.known = mirror is not None  # followed before this batch
        if mirror is None:
            mirror = Mirror(Replay(TurnLife(key, limits)), "")
        self.mirror = mirror
        self.version = mirror.version  # before this batch
        self.bytes = mirror.replay.life.bytes  # of its entries, before this batch
        self.count = 0
        self.last = ""

    def confirmed(self, version: Version, dead: int) -> bool:
        started = self.mirror.started if self.known else None
        return _confirms(version, started, self.version, self.count, dead)


def _confirms(version: Version, started: str | None, before: int, count: int,
              dead: int = 0) -> bool:
    """Whether an ``apply_entries`` call that reported ``version`` for a turn
    stored exactly the ``count`` entries given for it on top of the mirror's
    state, and dead-lettered the ``dead`` the worker asked it to (each moves
    a started turn's version by one, as a record does): version ``before``
    and start ``started`` (None: a turn not followed yet, which must have
    had nothing before the call: a dead letter before its first entry makes
    its version start at 1)."""
    if started is None:
        if version.before != 0:
            return False  # records stored before this worker followed the turn
    elif started != version.started:
        return False  # a turn started again under the same key
    return (before == version.before and version.stored == count
            and version.after - version.before == count + dead)


@dataclass
class Ahead:
    """A batch fed into the mirrors before its ``apply_entries`` call answered."""

    turns: dict[TurnKey, _Fed] = field(default_factory=dict)
    accounted: bool = False  # its bytes counted in Mirrors.bytes


@dataclass
class Mirrors:
    """The mirrors of one shard's turns, oldest first."""

    limits: Limits
    max_turns: int = 10_000
    # The bytes of entries the mirrors may hold (processor.worker.budget: by
    # default all of a worker's, over all its shards). The entries' size bounds
    # what a mirror holds (the merged text and contents).
    max_bytes: int = MIRROR_BYTES
    turns: dict[TurnKey, Mirror] = field(default_factory=dict)
    bytes: int = 0

    def update(
        self, applied: list[Applied], versions: dict[TurnKey, Version], newest: bool = False,
        dead: Mapping[TurnKey, int] | None = None,
    ) -> set[TurnKey]:
        """Feed what one ``apply_entries`` call stored into the mirrors, and
        return the turns whose mirror is now exactly the state that call left.
        ``newest``: the entries came from one ``XREADGROUP >``, so they are
        in id order and newer than anything applied before (no check needed).
        ``dead``: per turn, the entries the call was asked to dead-letter."""
        if self.max_turns == 0:
            return set()  # --mirror-turns 0: every finalise reads the records back
        by_turn: dict[TurnKey, list[Applied]] = {}
        for entry in applied:
            by_turn.setdefault(entry.key, []).append(entry)
        dead = dead or {}
        for key, version in versions.items():
            self._keep(key, self._follow(key, version, by_turn.get(key, []), newest,
                                         dead.get(key, 0)))
        self._bound()
        return {key for key in versions if key in self.turns}

    def _follow(
        self, key: TurnKey, version: Version, entries: list[Applied], newest: bool,
        dead: int = 0,
    ) -> Mirror | None:
        """The turn's mirror after this call, or None when it cannot be trusted."""
        mirror = self.turns.get(key)
        started = mirror.started if mirror is not None else None
        if not _confirms(version, started, mirror.version if mirror else 0, len(entries), dead):
            return None
        if mirror is None:
            mirror = Mirror(Replay(TurnLife(key, self.limits)), version.started)
        if newest:  # the last one is enough: a later reclaim must come after it
            mirror.last_id = id_order(entries[-1].entry_id) if entries else mirror.last_id
        elif not self._in_order(mirror, entries):
            return None  # an older entry (reclaimed): the replay order would differ
        life, before = mirror.replay.life, mirror.replay.life.bytes
        feed = mirror.replay.feed
        for entry in entries:
            feed(entry.entry_id, entry.record, entry.size)
        self.bytes += life.bytes - before
        mirror.version = version.after
        mirror.dlq += dead
        return mirror

    def feed_ahead(self, applied: list[Applied], ahead: Ahead) -> None:
        """Feed a batch read with one ``XREADGROUP >`` into the mirrors before
        ``apply_entries`` answers, so that the worker's Python runs while
        redis-server runs the script; ``confirm`` then keeps what the
        call's versions confirm, and ``forget`` drops it all if the call
        (or this) failed. Together they end as ``update`` with ``newest``."""
        if self.max_turns == 0:
            return
        turns = ahead.turns
        for entry in applied:
            key = entry.key
            fed = turns.get(key)
            if fed is None:
                fed = turns[key] = _Fed(key, self.turns.get(key), self.limits)
            fed.mirror.replay.feed(entry.entry_id, entry.record, entry.size)
            fed.count += 1
            fed.last = entry.entry_id
        self._account(ahead)

    def _account(self, ahead: Ahead) -> None:
        """Count in ``self.bytes`` what was fed to the mirrors it holds."""
        if not ahead.accounted:
            ahead.accounted = True
            for fed in ahead.turns.values():
                if fed.known:
                    self.bytes += fed.mirror.replay.life.bytes - fed.bytes

    def confirm(self, ahead: Ahead, versions: dict[TurnKey, Version],
                dead: Mapping[TurnKey, int] | None = None) -> set[TurnKey]:
        """What ``update`` returns, for a batch fed by ``feed_ahead``
        (the same checks, made after feeding: a mirror that fails them is
        dropped, fed or not)."""
        if self.max_turns == 0:
            return set()
        dead = dead or {}
        for key in ahead.turns.keys() - versions.keys():
            self.drop(key)  # (apply_entries reports every turn it was given)
        for key, version in versions.items():
            fed = ahead.turns.get(key)
            if fed is None:  # none of its entries in the batch: as update() does
                self._keep(key, self._follow(key, version, [], True, dead.get(key, 0)))
                continue
            if not fed.confirmed(version, dead.get(key, 0)):
                self.drop(key)
                continue
            mirror = fed.mirror
            mirror.version, mirror.started = version.after, version.started
            mirror.dlq += dead.get(key, 0)
            mirror.last_id = id_order(fed.last)
            if not fed.known:
                self.turns[key] = mirror
                self.bytes += mirror.replay.life.bytes
        self._bound()
        return {key for key in versions if key in self.turns}

    def vanished(self, versions: dict[TurnKey, Version]) -> list[TurnKey]:
        """The turns an ``apply_entries`` call found without state (version
        0 before it) although this worker's mirror had some: only the
        namespace's state lost in Redis does that (continuity.py checks)."""
        turns = self.turns
        return [key for key, version in versions.items()
                if version.before == 0 and (mirror := turns.get(key)) is not None
                and mirror.version > 0]

    def _keep(self, key: TurnKey, mirror: Mirror | None) -> None:
        """Keep the turn's mirror as a call left it, or drop it (None)."""
        if mirror is None:
            self.drop(key)
        elif key not in self.turns:
            self.turns[key] = mirror

    def forget(self, ahead: Ahead) -> None:
        """The call failed (or may have), or feeding did: drop every mirror
        ``feed_ahead`` fed, which a retry would feed again."""
        self._account(ahead)
        for key in ahead.turns:
            self.drop(key)

    @staticmethod
    def _in_order(mirror: Mirror, entries: list[Applied]) -> bool:
        """Whether ``entries`` are in id order and after the mirror's last one."""
        orders = [id_order(entry.entry_id) for entry in entries]
        if orders and (orders[0] <= mirror.last_id or orders != sorted(orders)):
            return False
        if orders:
            mirror.last_id = orders[-1]
        return True

    def take(self, key: TurnKey) -> Mirror | None:
        """Remove and return the turn's mirror (a finalise consumes it)."""
        mirror = self.turns.pop(key, None)
        if mirror is not None:
            self.bytes -= mirror.replay.life.bytes
        return mirror

    def drop(self, key: TurnKey) -> None:
        self.take(key)

    def adopt(self, key: TurnKey, replay: Replay, held: TurnCopy, last_id: str) -> None:
        """Follow, from now on, a turn this worker held and checkpointed
        (``checkpoint_held``) and now spills: ``replay`` is the turn at its
        checkpoint (the state of its hash: ``held``'s version, start and
        dead letters), ``last_id`` the checkpoint's newest entry; the spill's
        entries, after it, are fed as any stored entries. Its live progress
        goes on as a spilled held turn's does (``shown`` None: handed over)."""
        if self.max_turns == 0:
            return
        self.drop(key)
        self.turns[key] = Mirror(replay, held.started, held.version, held.dlq,
                                 last_id=id_order(last_id))
        self.bytes += replay.life.bytes
        self._bound()

    def shared(self) -> None:
        """Another worker reads the shard now (it took the shard over, or
        shares it): drop every mirror. Such a worker may end a turn this one
        has a mirror of without this one seeing it, and a mirror kept after that
        is stale for good (no entry of the turn comes to correct it). Redis
        losing its data later, the mirror was published as ``state_lost``
        (continuity.py): a second terminal event for a turn published
        ``completed``, the done marker that would have refused it lost too.
        A dropped mirror only means a replay from Redis; a turn in flight then
        is one this worker does not know (docs/reliability.md)."""
        while self.turns:
            self.drop(next(iter(self.turns)))

    def _bound(self) -> None:
        while self.turns and (len(self.turns) > self.max_turns or self.bytes > self.max_bytes):
            self.drop(next(iter(self.turns)))

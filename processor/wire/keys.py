"""Every Redis key name, built in one place.

All keys of shard ``s`` share the Cluster hash tag ``{<ns>:<s>}``, so one
Lua script can touch all of them. Lua scripts never build key names: the
worker passes each one in ``KEYS``.

Public keys (docs/contract.md §2):

- ``{ns:s}:updates``   input stream (producers XADD)
- ``{ns:s}:merged``    one merged response per finished turn
- ``{ns:s}:events``    lifecycle, progress and terminal events
- ``{ns:s}:dlq``       entries that could not be merged
- ``{ns:s}:agui``      with ``--agui``: each finished turn as an AG-UI 1.0 run
- ``{ns:s}:cancel:<response_id>``  cancellation key

Internal keys (the state machine, see docs/design.md):

- ``{ns:s}:turn:<tk>``  hash: seq, version, counters of an active turn
- ``{ns:s}:recs:<tk>``  hash: entry id -> record (msgpack), plus a compacted state
- ``{ns:s}:done:<tk>``  hash with TTL: status of a finished turn (dedup, drops),
  and the ids of its merged entry and terminal event
- ``{ns:s}:live:<tk>``  stream with TTL: the turn's live progress, one entry per
  batch (its events and its updates; ``publish_live``), which ``processor serve``
  reads to join or resume a running turn
- ``{ns:s}:active``     zset: tk -> last activity (ms), for timeouts and cancels
- ``{ns:s}:closing``    zset (lex): "<end id>|<tk>" of turns whose last entry is applied
- ``{ns:s}:idem:<key>`` string with TTL: producer idempotency keys
- ``{ns:s}:inbox``      list: entries of least-privilege producers (``send_inbox``),
  one msgpack array of field names and values each, until a worker admits them
  into ``updates`` (``admit_inbox``, ``processor.worker.inbox``)
- ``{ns:s}:inbox:bell`` list: a token when the inbox has entries, which the
  admitting worker waits on (BLPOP)
- ``{ns:s}:updates:repair`` scratch stream of ``processor repair-stream``
  (exists only within its Lua step, or after one that failed half-way)
- ``{ns:0}:workers:<group>`` zset: consumer -> last heartbeat (ms), the live
  workers of a group that split the shards (shard affinity); one per
  namespace, under shard 0's hash tag
- ``{ns:0}:cancels`` a Pub/Sub channel, not a key: cancel requests of clients
  that may not write cancel keys (the ``serve`` and ``producer`` ACL users),
  published by ``cancel_turn.lua``; every worker takes them
  (``processor.worker.cancel_requests``) and sets the key itself
- ``{ns:0}:meta`` hash: the namespace's record (shards, group, epoch), written
  once by ``processor init`` or the first worker, read by every party
  (``processor.scripts.meta``); one per namespace, under shard 0's hash tag

``<tk>`` is ``processor.wire.ids.TurnKey.encode``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.wire import defaults
from processor.wire.ids import MAX_ID_LENGTH, TurnKey, shard_of

DEFAULT_NAMESPACE = "agent"
DEFAULT_GROUP = defaults.GROUP


@dataclass(frozen=True, slots=True)
class Shard:
    """The key names of one shard of one namespace."""

    namespace: str
    index: int
    #: ``{<namespace>:<index>}``, every key's prefix (its hash tag): made
    #: once, as every turn's keys of every batch begin with it.
    tag: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tag", f"{{{self.namespace}:{self.index}}}")

    @property
    def updates(self) -> str:
        return f"{self.tag}:updates"

    @property
    def inbox(self) -> str:
        return f"{self.tag}:inbox"

    @property
    def inbox_bell(self) -> str:
        return f"{self.tag}:inbox:bell"

    @property
    def repair(self) -> str:
        return f"{self.tag}:updates:repair"

    @property
    def merged(self) -> str:
        return f"{self.tag}:merged"

    @property
    def events(self) -> str:
        return f"{self.tag}:events"

    @property
    def dlq(self) -> str:
        return f"{self.tag}:dlq"

    @property
    def agui(self) -> str:
        return f"{self.tag}:agui"

    @property
    def active(self) -> str:
        return f"{self.tag}:active"

    @property
    def closing(self) -> str:
        return f"{self.tag}:closing"

    def cancel(self, response_id: str) -> str:
        return f"{self.tag}:cancel:{response_id}"

    def turn(self, tk: str) -> str:
        return f"{self.tag}:turn:{tk}"

    def recs(self, tk: str) -> str:
        return f"{self.tag}:recs:{tk}"

    def done(self, tk: str) -> str:
        return f"{self.tag}:done:{tk}"

    def live(self, tk: str) -> str:
        """The turn's live log (``publish_live.lua``)."""
        return f"{self.tag}:live:{tk}"

    def idem(self, key: str) -> str:
        return f"{self.tag}:idem:{key}"

    def turn_keys(self, key: TurnKey) -> tuple[str, str, str, str]:
        """The four per-turn keys scripts take, in their KEYS order."""
        tk = key.encode()
        return self.turn(tk), self.recs(tk), self.done(tk), self.cancel(key.response_id)


@dataclass(frozen=True, slots=True)
class Namespace:
    """A namespace of ``shards`` shards."""

    name: str = DEFAULT_NAMESPACE
    shards: int = 1

    def shard(self, index: int) -> Shard:
        return Shard(self.name, index)

    def all(self) -> list[Shard]:
        return [Shard(self.name, i) for i in range(self.shards)]

    def workers(self, group: str) -> str:
        """The live workers of consumer group ``group``: one key for the
        namespace, under shard 0's hash tag (touched by ``beat_worker`` alone)."""
        return f"{self.shard(0).tag}:workers:{group}"

    @property
    def meta(self) -> str:
        """The namespace's record (``processor.scripts.meta``): one key for the
        namespace, under shard 0's hash tag; its name does not depend on
        ``shards``, which it holds."""
        return f"{self.shard(0).tag}:meta"

    def shard_for(self, routing_id: str) -> Shard:
        """The shard of a turn: from its response_id, or its turn_id when it has none."""
        return Shard(self.name, shard_of(routing_id, self.shards))

    @property
    def cancels(self) -> str:
        """The Pub/Sub channel of the namespace's cancel requests (``cancel_turn.lua``)."""
        return f"{self.shard(0).tag}:cancels"

    def cancel_key_shard(self, key: str) -> Shard | None:
        """The shard whose cancellation key ``key`` is (``Shard.cancel``),
        or None when it is not one of this namespace's (its id empty or longer
        than ``MAX_ID_LENGTH``, docs/contract.md §3.2)."""
        head, sep, response_id = key.partition("}:cancel:")
        prefix = f"{{{self.name}:"
        if (not sep or not response_id or len(response_id) > MAX_ID_LENGTH
                or not head.startswith(prefix)):
            return None
        index = head[len(prefix):]
        if not index.isdigit() or index != str(int(index)) or int(index) >= self.shards:
            return None
        return self.shard(int(index))

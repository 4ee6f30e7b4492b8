"""Input entries (docs/contract.md §3): their correlation ids and ``kind`` bodies.

Pure functions: what ``processor.client.Producer`` hands to ``send_update.lua``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from processor.wire.ids import TurnKey, response_id_for_turn
from processor.wire.models import ENTRY_IDS, MAX_ENTRY_NUMBER, TURN_IDS

Encoding = Literal["json", "msgpack"]

#: The correlation ids an entry may carry (docs/contract.md §3.1).
CORRELATION_IDS = frozenset(TURN_IDS + ENTRY_IDS)


@dataclass(frozen=True, slots=True)
class TurnIds:
    """Who an entry belongs to: its ResponseId (or turn_id) and correlation ids."""

    response_id: str | None
    ids: dict[str, str]

    @property
    def routing_id(self) -> str:
        """What the shard is computed from: the response_id, else the turn_id."""
        return self.response_id or self.ids["turn_id"]

    def turn_key(self) -> TurnKey:
        """The turn the worker merges the entry into (docs/contract.md §1)."""
        rid = self.response_id or response_id_for_turn(self.ids["turn_id"])
        return TurnKey(rid, self.ids.get("attempt_id", ""))

    def label(self) -> str:
        """The turn as its producer named it, for messages."""
        name = (f"{self.response_id!r}" if self.response_id
                else f"turn_id {self.ids['turn_id']!r}")
        attempt = self.ids.get("attempt_id")
        return f"{name} (attempt {attempt!r})" if attempt else name

    def fields(self) -> list[str]:
        """The entry's identity fields, for XADD."""
        out = ["response_id", self.response_id] if self.response_id else []
        for name, value in self.ids.items():
            out += [name, value]
        return out


def turn_ids(
    response_id: str | None,
    attempt_id: str | None,
    turn_id: str | None,
    ids: Mapping[str, str] | None,
) -> TurnIds:
    """Validate and combine an entry's ids (``attempt_id``/``turn_id`` may be in ``ids``)."""
    merged = dict(ids or {})
    unknown = sorted(set(merged) - CORRELATION_IDS)
    if unknown:
        raise ValueError(f"unknown correlation ids {unknown}; known: {sorted(CORRELATION_IDS)}")
    for name, value in (("attempt_id", attempt_id), ("turn_id", turn_id)):
        if value is not None and merged.setdefault(name, value) != value:
            raise ValueError(f"{name} is given twice with different values")
    for name, value in merged.items():
        if not isinstance(value, str):
            raise TypeError(f"correlation id {name!r} must be a str, not {type(value).__name__}")
    merged = {name: value for name, value in merged.items() if value}
    if not response_id and "turn_id" not in merged:
        raise ValueError("an entry needs a response_id or a turn_id")
    return TurnIds(response_id or None, merged)


@dataclass(slots=True)
class _Counter:
    """One open turn's numbering: its next number, and the numbers given to
    the caller's idempotency keys (the latest ``KEYS_KEPT``)."""

    next: int = 0
    keys: dict[str, int] = field(default_factory=dict)


#: Idempotency keys remembered per open turn: a send repeated by hand with
#: the same key (docs: ``Producer``) gets the number its first send got.
KEYS_KEPT = 256


@dataclass(slots=True)
class Taken:
    """A number handed out by ``TurnNumbers``, and how to give it back."""

    number: int
    turn: TurnKey
    before: _Counter | None  # the turn's counter before (None: it had none)
    repeat: bool  # the number of an idempotency key used before: nothing changed


class TurnNumbers:
    """Each open turn's next entry number (docs/contract.md §3.4), as
    ``Producer`` numbers its sends. Pure.

    ``take`` hands out the turn's next number (or the one given, or
    the one an idempotency key got before), counted as used: the caller
    sends it, retries it as it is, and gives it back (``refused``) only
    when the send certainly added nothing (Redis refused it). The last
    entry of a turn (its end or error) forgets the turn."""

    def __init__(self) -> None:
        self.turns: dict[TurnKey, _Counter] = {}

    def take(self, turn: TurnKey, n: int | None, idempotency_key: str | None,
             last: bool) -> Taken:
        counter = self.turns.get(turn)
        before = None if counter is None else _Counter(counter.next, dict(counter.keys))
        if counter is None:
            counter = self.turns[turn] = _Counter()
        if n is None and idempotency_key is not None and idempotency_key in counter.keys:
            number, repeat = counter.keys[idempotency_key], True
        else:
            number = counter.next if n is None else n
            counter.next, repeat = number + 1, False
            if idempotency_key is not None:
                counter.keys[idempotency_key] = number
                if len(counter.keys) > KEYS_KEPT:
                    del counter.keys[next(iter(counter.keys))]
        if last:
            del self.turns[turn]
        return Taken(number, turn, before, repeat)

    def refused(self, taken: Taken) -> None:
        """Redis refused the send (nothing was added): the number is free again."""
        if taken.repeat and taken.turn in self.turns:
            return
        if taken.before is None:
            self.turns.pop(taken.turn, None)
        else:
            self.turns[taken.turn] = taken.before

    def forget(self, turn: TurnKey) -> None:
        """The turn has ended: its numbers are of no more use."""
        self.turns.pop(turn, None)


def check_number(n: int) -> None:
    """An entry number a caller gives (docs/contract.md §3.4): an int from 0
    to ``MAX_ENTRY_NUMBER``."""
    if n.__class__ is not int:
        raise TypeError(f"an entry number must be an int, not {type(n).__name__}")
    if not 0 <= n <= MAX_ENTRY_NUMBER:
        raise ValueError(f"an entry number is from 0 to {MAX_ENTRY_NUMBER}, not {n}")


def encode_update(update: Any, enc: Encoding = "json") -> str | bytes:
    """The ``update`` field of an entry: an ``AgentResponseUpdate`` (``.to_dict()``) or a dict."""
    data = update.to_dict() if hasattr(update, "to_dict") else update
    if not isinstance(data, Mapping):
        raise TypeError(f"an update must be an AgentResponseUpdate or a dict, not {type(data)}")
    if enc == "json":
        return msgspec.json.encode(data).decode("utf-8")
    if enc == "msgpack":
        return msgspec.msgpack.encode(data)
    raise ValueError(f"unknown encoding {enc!r} (json or msgpack)")


def update_body(update: Any, enc: Encoding) -> list[Any]:
    """The fields of a ``kind=update`` entry after its ids."""
    body: list[Any] = ["kind", "update", "update", encode_update(update, enc)]
    return body if enc == "json" else [*body, "enc", enc]


def error_body(message: str, code: str | None) -> list[Any]:
    """The fields of a ``kind=error`` entry after its ids."""
    body = ["kind", "error", "error", message]
    return [*body, "code", code] if code else body


@dataclass(frozen=True, slots=True)
class Sent:
    """What ``Producer.stream`` wrote: first entry id, the final entry's id, update
    count (with ``Producer(inbox=True)``, the first and final sends' receipts)."""

    first_id: str
    last_id: str
    updates: int

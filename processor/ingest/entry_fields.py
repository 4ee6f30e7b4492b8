"""The fields of one input entry, below its update: their text, their size
(what ``--max-entry-bytes`` counts), the turn key, the routing id and the
correlation ids (docs/contract.md §3.1).

Every failure is an ``EntryError`` with a DLQ
reason code; ``processor.ingest.decode`` builds the record on top of these, with
fast paths whose results and errors must equal theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from processor.ingest.validate import EntryError, clip
from processor.wire.ids import (
    MAX_ID_LENGTH,
    TurnKey,
    new_turn_key,
    response_id_for_turn,
    shard_of,
)
from processor.wire.models import ENTRY_IDS, MAX_ENTRY_NUMBER, TURN_IDS

CORRELATION_IDS = TURN_IDS + ENTRY_IDS
CORRELATION_SET = frozenset(CORRELATION_IDS)


def text_field(fields: Mapping[str, Any], name: str) -> str | None:
    """A field's value as text (None when absent): bytes must be UTF-8, and a
    str must be text UTF-8 can carry."""
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EntryError("bad_encoding", f"field {name!r} is not valid UTF-8: {exc}") from None
    if isinstance(value, str):
        if not value.isascii():
            _check_encodable(name, value)
        return value
    raise EntryError(
        "invalid_entry", f"field {name!r}: expected a string, got {type(value).__name__}"
    )


def _check_encodable(name: str, value: str) -> None:
    """A str value (offline, or from a client that decoded it) must be text
    that UTF-8 can carry: a lone surrogate cannot be stored or published."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EntryError("bad_encoding", f"field {name!r} is not valid UTF-8: {exc}") from None


def entry_size(fields: Mapping[Any, Any]) -> int:
    """Bytes of an entry's field names and values (what the size limit counts)."""
    return sum(_size(key) + _size(value, key) for key, value in fields.items())


def _size(value: Any, name: Any = None) -> int:
    """UTF-8 bytes of a field name or value, as the stream stores it.

    An offline line may give a value as JSON; its size is its JSON text. One
    that cannot be written back (nested too deeply) is not an entry at all.
    """
    if value.__class__ is bytes:
        return len(value)
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if value is None:
        return 0
    try:
        return len(msgspec.json.encode(value))
    except UnicodeEncodeError as exc:  # a str in it holds a lone surrogate
        raise EntryError("bad_encoding", f"field {name!r} is not valid UTF-8: {exc}") from None
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise EntryError("invalid_entry", f"field {name!r}: not a JSON value") from None


def turn_key(fields: Mapping[str, Any]) -> TurnKey:
    """The entry's turn key; raises ``missing_turn_key`` without one."""
    # Hot path (every entry): plain ASCII ``str`` values skip ``text_field``;
    # anything else takes it, so errors and their order are text_field's.
    response_id = fields.get("response_id")
    if response_id is not None and (response_id.__class__ is not str or not response_id.isascii()):
        response_id = text_field(fields, "response_id")
    attempt_id = fields.get("attempt_id")
    if attempt_id is not None and (attempt_id.__class__ is not str or not attempt_id.isascii()):
        attempt_id = text_field(fields, "attempt_id")
    attempt_id = attempt_id or ""
    if not response_id:
        turn_id = text_field(fields, "turn_id")
        if not turn_id:
            raise EntryError("missing_turn_key", "neither 'response_id' nor 'turn_id' is set")
        check_id("turn_id", turn_id)
        response_id = response_id_for_turn(turn_id)
    if len(response_id) > MAX_ID_LENGTH:
        check_id("response_id", response_id)
    if len(attempt_id) > MAX_ID_LENGTH:
        check_id("attempt_id", attempt_id)
    return new_turn_key(TurnKey, (response_id, attempt_id))


def routing_id(fields: Mapping[str, Any]) -> str:
    """What the shard is computed from: ``response_id``, else ``turn_id``."""
    return text_field(fields, "response_id") or text_field(fields, "turn_id") or ""


def entry_shard(fields: Mapping[Any, Any], shards: int) -> int:
    """The shard an entry's fields route to (bytes or str names; a name that
    is not UTF-8 is just an unknown field, never a reason to fail)."""
    named = {k.decode("utf-8", "replace") if isinstance(k, bytes) else k: v
             for k, v in fields.items()}
    return shard_of(routing_id(named), shards)


def check_id(name: str, value: str) -> None:
    if len(value) > MAX_ID_LENGTH:
        raise EntryError(
            "invalid_entry", f"field {name!r} is longer than {MAX_ID_LENGTH} characters"
        )


def sized_str_keys(fields: Mapping[Any, Any]) -> tuple[dict[str, Any], int]:
    """The fields with str names, and ``entry_size``, in one pass (the hot path).

    Only the size can raise, and it is computed first for each field, so
    failures are those of ``entry_size`` (a bytes name becomes str, never failing). A plain
    dict with ASCII str keys and bytes or ASCII str values is returned as it
    is: nothing in the decoder writes to the fields, so it stands for its own
    copy, and its size is its length in characters.
    """
    if fields.__class__ is dict:
        total = 0
        for key, value in fields.items():
            cls = value.__class__
            if key.__class__ is not str or not key.isascii():
                break
            if cls is not bytes and (cls is not str or not value.isascii()):
                break
            total += len(key) + len(value)
        else:
            return fields, total
    total = 0
    out: dict[str, Any] = {}
    for key, value in fields.items():
        total += _size(key) + _size(value, key)
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        out[key] = value
    return out, total


def correlation_ids(fields: Mapping[str, Any]) -> dict[str, str]:
    ids = {}
    for name in CORRELATION_IDS:
        value = text_field(fields, name)
        if value:
            check_id(name, value)
            ids[name] = value
    return ids


def entry_number(fields: Mapping[str, Any]) -> int | None:
    """The entry's number in its turn, the ``n`` field (docs/contract.md
    §3.4), or None when it has none: decimal digits (0, or no leading zero)
    up to ``MAX_ENTRY_NUMBER``; offline, a JSON
    integer too. Anything else is ``invalid_entry``: a number that cannot be
    read would hide the very gap it is there to show."""
    value = fields.get("n")
    if value is None:
        return None
    if value.__class__ is int:  # (a processor merge line's JSON number; never a bool)
        number: int = value
    else:
        text = text_field(fields, "n")
        if not text or not text.isdigit() or not text.isascii() or len(text) > 16 or (
                len(text) > 1 and text[0] == "0"):
            raise EntryError("invalid_entry", "field 'n': expected the entry's number in its "
                             f"turn, decimal digits from 0 to {MAX_ENTRY_NUMBER}, got "
                             f"{clip(text or '')}")
        number = int(text)
    if not 0 <= number <= MAX_ENTRY_NUMBER:
        raise EntryError("invalid_entry", f"field 'n': {number} is not from 0 to "
                         f"{MAX_ENTRY_NUMBER}")
    return number


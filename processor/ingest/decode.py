"""Stream entry fields -> validated ``Record``, or a specific error.

Every failure is an ``EntryError`` with a DLQ reason code (docs/contract.md §5.3)
and a human-readable detail naming the offending path. Nothing here raises
anything else on bad input: the worker dead-letters the entry and moves on.
What an update may hold is checked in ``processor.ingest.validate``.

This is the hot path of every entry, so the common case (str or bytes
values, ASCII text, no correlation ids) takes as few Python steps as it can;
anything else takes the general helpers, whose errors and their order are the
reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from processor.ingest.entry_fields import (
    CORRELATION_SET,
    correlation_ids,
    entry_number,
    entry_size,
    routing_id,
    sized_str_keys,
    text_field,
    turn_key,
)
from processor.ingest.validate import (
    DETAIL_PREFIX,
    MAX_DEPTH,
    EntryError,
    check_update,
    clip,
    too_deep,
    update_from_object,
)
from processor.wire.ids import MAX_ID_LENGTH, TurnKey, new_turn_key
from processor.wire.models import Record, Update

__all__ = [
    "DEFAULT_MAX_ENTRY_BYTES",
    "DETAIL_PREFIX",
    "MAX_DEPTH",
    "MAX_ID_LENGTH",
    "PLAIN_NAMES",
    "EntryError",
    "check_update",
    "clip",
    "decode_entry",
    "decode_plain",
    "decode_stream_entry",
    "decode_update",
    "entry_size",
    "peek_plain",
    "recent_turn",
    "routing_id",
    "turn_key",
    "update_from_object",
]

DEFAULT_MAX_ENTRY_BYTES = 1 << 20

_json_update = msgspec.json.Decoder(Update)
_msgpack_update = msgspec.msgpack.Decoder(Update)
_json_any = msgspec.json.Decoder()
_msgpack_any = msgspec.msgpack.Decoder()
#: The TurnKeys of recent response ids without attempt: a turn's entries come
#: in runs, and one dict lookup costs a tenth of building the key. Cleared
#: when full, so it holds at most this many keys whatever the stream.
_recent_keys: dict[str | bytes, TurnKey] = {}
_RECENT_KEYS = 1024
#: The TurnKey of a response id (bytes as Redis returns it, or str) seen
#: lately, else None: only ids that passed every check of a turn key of
#: their own (ASCII, not empty, within ``MAX_ID_LENGTH``, no attempt id)
#: are kept. A bound ``dict.get``: grouping a held batch asks it per entry.
recent_turn = _recent_keys.get
_KINDS = ("update", "end", "error")
#: A decoded entry with its size in bytes (``entry_size``).
Sized = tuple[TurnKey, Record, int]
#: The bytes of a plain update's two field names (an entry's size counts
#: its names and values: ``entry_size``).
PLAIN_NAMES = len("response_id") + len("update")
_END_NAMES = len("response_id") + len("kind") + len("end")


def decode_entry(
    raw_fields: Mapping[Any, Any], *, max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
) -> tuple[TurnKey, Record]:
    """Decode one input entry (stream fields, or a ``processor merge`` line).

    ``update`` may be JSON text, msgpack bytes (``enc=msgpack``) or, offline,
    an already-parsed JSON object.
    """
    turn, record, _size = _sized_entry(raw_fields, max_entry_bytes)
    return turn, record


def _sized_entry(raw_fields: Mapping[Any, Any], max_entry_bytes: int) -> Sized:
    """``decode_entry``, with the entry's size (``entry_size``)."""
    if raw_fields.__class__ is dict:
        found = _plain_update(raw_fields, max_entry_bytes)
        if found is not None:
            return found
    fields, size = sized_str_keys(raw_fields)
    if size > max_entry_bytes:
        raise EntryError("too_large", f"entry is {size} bytes, the limit is {max_entry_bytes}")
    turn = turn_key(fields)
    try:
        return turn, _record(fields), size
    except EntryError as exc:
        exc.turn = turn
        raise


def decode_stream_entry(
    raw_fields: dict[Any, Any], *, max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
) -> Sized:
    """``decode_entry`` for fields as Redis returns them (bytes names and
    values), with the entry's size (``entry_size``, which the fast paths
    know already: measuring it again cost a twentieth of a worker holding
    turns). Takes a fast path for the usual all-ASCII update: straight
    from the bytes for an entry of just ``response_id`` and ``update`` (or
    ``kind=end``, a turn's plain end), else through str copies of the fields.

    Only a result of a fast path is kept; anything it declines is decoded
    from the original bytes, so errors (and DLQ details) are exactly those of
    ``decode_entry(raw_fields)``. ASCII bytes and their str give the same
    sizes and the same JSON, so the fast paths' results are the same too.
    """
    if len(raw_fields) == 2:  # the usual entry: decoded from its bytes as they are
        # (msgspec reads ASCII JSON bytes exactly as it reads their str)
        peeked = peek_plain(raw_fields, max_entry_bytes)
        found = (_decoded(*peeked) if peeked is not None
                 else _bytes_end(raw_fields, max_entry_bytes))
        if found is not None:
            return found
        return _sized_entry(raw_fields, max_entry_bytes)
    try:
        fields = {k.decode("ascii"): v.decode("ascii") for k, v in raw_fields.items()}
    except (UnicodeDecodeError, AttributeError):  # non-ASCII, or not bytes
        return _sized_entry(raw_fields, max_entry_bytes)
    found = _plain_update(fields, max_entry_bytes)
    if found is not None:
        return found
    return _sized_entry(raw_fields, max_entry_bytes)


def peek_plain(
    fields: dict[Any, Any], max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
) -> tuple[TurnKey, bytes, int] | None:
    """The turn, update JSON and size of a plain update as Redis returns it
    (just ``response_id`` and ``update``, ASCII bytes, within the limit),
    without decoding the JSON; None for any other entry. A worker holding
    turns decodes a turn's plain updates later, all at once
    (``decode_plain``): the entry may still be one
    ``decode_stream_entry`` refuses."""
    if len(fields) != 2:
        return None
    raw_id: Any = fields.get(b"response_id")
    text = fields.get(b"update")
    if raw_id.__class__ is not bytes or text.__class__ is not bytes:
        return None
    if not (raw_id.isascii() and text.isascii()):
        return None
    size = PLAIN_NAMES + len(raw_id) + len(text)
    if size > max_entry_bytes:
        return None
    turn = _recent_keys.get(raw_id)  # (bytes keys: never equal to the str ones)
    if turn is None:
        if not raw_id or len(raw_id) > MAX_ID_LENGTH:
            return None
        turn = new_turn_key(TurnKey, (raw_id.decode("ascii"), ""))
        _remember(raw_id, turn)
    return turn, text, size


def decode_plain(texts: list[bytes]) -> list[Update] | None:
    """The updates of plain entries (``peek_plain``), decoded in one
    msgspec call and checked, exactly as ``decode_stream_entry`` decodes
    each; None if any of them needs more than that (an error, the .NET
    shape, an unknown field): decode the entries one by one then.

    The texts are decoded as lines (``decode_lines``), so each one must be a
    single line: joined with newlines, then line i is text i and nothing
    else (a text holding a newline could otherwise end one update and start
    the next). ``decode_lines`` skips blank lines: the count is checked."""
    joined = b"\n".join(texts)
    if joined.count(b"\n") != len(texts) - 1:
        return None
    try:
        updates = _json_update.decode_lines(joined)
        if len(updates) != len(texts):
            return None
        for update in updates:
            check_update(update)
    except (msgspec.MsgspecError, RecursionError, EntryError):
        return None
    return updates


def _bytes_end(fields: dict[Any, Any], max_entry_bytes: int) -> Sized | None:
    """``{b"response_id": ..., b"kind": b"end"}``, each turn's last entry, as
    ``decode_entry`` gives it (one in about 25 entries took the general path,
    at about twice an update's cost)."""
    raw_id = fields.get(b"response_id")
    if fields.get(b"kind") != b"end" or raw_id.__class__ is not bytes or not raw_id.isascii():
        return None
    size = _END_NAMES + len(raw_id)
    if size > max_entry_bytes:
        return None
    turn = _recent_keys.get(raw_id)
    if turn is None:
        if not raw_id or len(raw_id) > MAX_ID_LENGTH:
            return None
        turn = new_turn_key(TurnKey, (raw_id.decode("ascii"), ""))
        _remember(raw_id, turn)
    return turn, Record("end"), size


def _remember(cache_as: Any, turn: TurnKey) -> None:
    if len(_recent_keys) >= _RECENT_KEYS:
        _recent_keys.clear()
    _recent_keys[cache_as] = turn


def _plain_update(fields: dict[Any, Any], max_entry_bytes: int) -> Sized | None:
    """The usual entry, decoded in one go: ASCII str names and values, a
    ``response_id``, JSON ``update`` text and no kind, encoding or
    correlation id. ``None`` for anything else (or any doubt): the general
    path then decodes it, with its errors in their order. Every check that
    could fail before the update's own ones passes here, so the update's
    errors are the general path's too.
    """
    try:  # (subscripts: cheaper than .get() calls)
        response_id = fields["response_id"]
        text = fields["update"]
    except KeyError:
        return None
    if response_id.__class__ is not str or text.__class__ is not str:
        return None
    number = None
    if len(fields) == 2:  # just these two: no per-field loop
        if not (response_id.isascii() and text.isascii()):
            return None
        size = PLAIN_NAMES + len(response_id) + len(text)
        attempt_id = ""
        turn = _recent_keys.get(response_id)
    else:
        size = 0
        for key, value in fields.items():
            if key.__class__ is not str or value.__class__ is not str:
                return None
            if not (key.isascii() and value.isascii()):
                return None
            size += len(key) + len(value)
        attempt_id = fields.get("attempt_id") or ""
        if (
            len(attempt_id) > MAX_ID_LENGTH
            or fields.get("kind", "update") != "update"
            or "enc" in fields
            or not CORRELATION_SET.isdisjoint(fields)
        ):
            return None
        if "n" in fields:  # a numbered entry (a bad number: the general path says why)
            try:
                number = entry_number(fields)
            except EntryError:
                return None
        turn = None if attempt_id else _recent_keys.get(response_id)
    if size > max_entry_bytes or not response_id or len(response_id) > MAX_ID_LENGTH:
        return None
    if turn is None:
        turn = new_turn_key(TurnKey, (response_id, attempt_id))
        if not attempt_id:
            _remember(response_id, turn)
    return _decoded(turn, text, size, number)


def _decoded(turn: TurnKey, text: str | bytes, size: int, number: int | None = None
             ) -> Sized | None:
    """The fast paths' common end: the update decoded and checked."""
    try:
        update = _json_update.decode(text)
    except (msgspec.MsgspecError, RecursionError):
        return None
    try:
        return turn, Record("update", check_update(update), {}, n=number), size
    except EntryError as exc:
        exc.turn = turn
        raise


def _record(fields: Mapping[str, Any]) -> Record:
    kind = fields.get("kind")
    if kind is not None:
        if kind.__class__ is not str or not kind.isascii():
            kind = text_field(fields, "kind")
        if kind and kind not in _KINDS:
            raise EntryError("invalid_entry", f"field 'kind': unknown kind {clip(kind)}")
    # Most entries carry no correlation id: skip the per-name lookups then.
    ids = {} if CORRELATION_SET.isdisjoint(fields) else correlation_ids(fields)
    number = None if "n" not in fields else entry_number(fields)
    if not kind or kind == "update":
        return Record("update", decode_update(fields), ids, n=number)
    if kind == "error":
        error, code = text_field(fields, "error"), text_field(fields, "code")
        return Record("error", ids=ids, error=error, code=code, n=number)
    return Record("end", ids=ids, n=number)


def decode_update(fields: Mapping[str, Any]) -> Update:
    """The ``update`` field of an entry as an ``Update``."""
    enc = fields.get("enc")
    raw = fields.get("update")
    if enc is None and raw.__class__ is str:
        # The usual entry: JSON text, handed to msgspec as it is (no copy).
        try:
            return check_update(_json_update.decode(raw))
        except msgspec.ValidationError:
            pass  # maybe .NET shape, an unknown field or type: take the general path
        except UnicodeEncodeError as exc:
            raise EntryError("bad_encoding", f"field 'update' is not valid UTF-8: {exc}") from None
        except msgspec.DecodeError as exc:
            raise EntryError("bad_encoding", f"field 'update' is not valid json: {exc}") from None
        except RecursionError:
            raise too_deep("$.update") from None
        return _general_update(raw, "json", _json_any)
    if enc is not None and (enc.__class__ is not str or not enc.isascii()):
        enc = text_field(fields, "enc")
    enc = enc or "json"
    fast: msgspec.json.Decoder[Update] | msgspec.msgpack.Decoder[Update]
    generic: msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any]
    if enc == "json":
        fast, generic = _json_update, _json_any
    elif enc == "msgpack":
        fast, generic = _msgpack_update, _msgpack_any
    else:
        raise EntryError("bad_encoding", f"field 'enc': unknown encoding {clip(enc)}")
    if raw.__class__ is not bytes:
        if raw is None:
            raise EntryError("invalid_update", "field 'update' is required for kind=update")
        if isinstance(raw, dict):
            return update_from_object(raw)  # its text passed _size: UTF-8 can carry it
        if not isinstance(raw, str):
            raise EntryError(
                "invalid_update", f"field 'update': expected JSON text, got {type(raw).__name__}"
            )
        try:
            raw = raw.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise EntryError("bad_encoding", f"field 'update' is not valid UTF-8: {exc}") from None
    try:
        return check_update(fast.decode(raw))
    except msgspec.ValidationError:
        pass  # maybe .NET shape, an unknown field or type: take the general path
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise EntryError("bad_encoding", f"field 'update' is not valid {enc}: {exc}") from None
    except RecursionError:
        raise too_deep("$.update") from None
    return _general_update(raw, enc, generic)


def _general_update(raw: str | bytes, enc: str, generic: Any) -> Update:
    """An update the typed decoder refused: parse it, then convert and check
    it (the .NET shape, unknown fields and types, or a specific error)."""
    try:
        obj = generic.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise EntryError("bad_encoding", f"field 'update' is not valid {enc}: {exc}") from None
    except RecursionError:
        raise too_deep("$.update") from None
    return update_from_object(obj)

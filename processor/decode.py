"""Stream entry fields -> validated :class:`Record`, or a specific error.

Every failure is an :class:`EntryError` with a DLQ reason code (contract 5.3)
and a human-readable detail naming the offending path. Nothing here raises
anything else on bad input: the worker dead-letters the entry and moves on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from processor import dotnet
from processor.ids import TurnKey, response_id_for_turn
from processor.models import (
    CONTENT_FIELDS,
    ENTRY_IDS,
    TURN_IDS,
    UPDATE_FIELDS,
    Record,
    Update,
)

DEFAULT_MAX_ENTRY_BYTES = 1 << 20
MAX_ID_LENGTH = 512
#: How much of a bad value an error detail may echo (never the whole payload).
DETAIL_PREFIX = 120

_json_update = msgspec.json.Decoder(Update)
_msgpack_update = msgspec.msgpack.Decoder(Update)
_json_any = msgspec.json.Decoder()
_msgpack_any = msgspec.msgpack.Decoder()
_CORRELATION_IDS = TURN_IDS + ENTRY_IDS
_CORRELATION_SET = frozenset(_CORRELATION_IDS)
_new_turn_key = tuple.__new__  # TurnKey(a, b) without NamedTuple's Python-level __new__
_KINDS = ("update", "end", "error")


class EntryError(Exception):
    """An entry that cannot be merged. ``reason`` is the DLQ reason code."""

    def __init__(self, reason: str, detail: str, turn: TurnKey | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.turn = turn


def clip(value: str | bytes) -> str:
    """A bounded, printable prefix of a bad value for error details."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return repr(text[:DETAIL_PREFIX]) + ("..." if len(text) > DETAIL_PREFIX else "")


def _text(fields: Mapping[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EntryError("bad_encoding", f"field {name!r} is not valid UTF-8: {exc}") from None
    if isinstance(value, str):
        return value
    raise EntryError(
        "invalid_entry", f"field {name!r}: expected a string, got {type(value).__name__}"
    )


def _as_str_keys(fields: Mapping[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        out[key] = value
    return out


def entry_size(fields: Mapping[Any, Any]) -> int:
    """Bytes of an entry's field names and values (what the size limit counts)."""
    total = 0
    for key, value in fields.items():
        total += len(key)
        if isinstance(value, bytes | str):
            total += len(value)
        elif value is not None:
            total += len(msgspec.json.encode(value))
    return total


def turn_key(fields: Mapping[str, Any]) -> TurnKey:
    """The entry's turn key; raises ``missing_turn_key`` without one."""
    # Hot path (every entry): plain ``str`` values skip ``_text``; anything
    # else takes it, so errors and their order are those of ``_text``.
    response_id = fields.get("response_id")
    if response_id is not None and response_id.__class__ is not str:
        response_id = _text(fields, "response_id")
    attempt_id = fields.get("attempt_id")
    if attempt_id is not None and attempt_id.__class__ is not str:
        attempt_id = _text(fields, "attempt_id")
    attempt_id = attempt_id or ""
    if not response_id:
        turn_id = _text(fields, "turn_id")
        if not turn_id:
            raise EntryError("missing_turn_key", "neither 'response_id' nor 'turn_id' is set")
        _check_id("turn_id", turn_id)
        response_id = response_id_for_turn(turn_id)
    if len(response_id) > MAX_ID_LENGTH:
        _check_id("response_id", response_id)
    if len(attempt_id) > MAX_ID_LENGTH:
        _check_id("attempt_id", attempt_id)
    return _new_turn_key(TurnKey, (response_id, attempt_id))


def routing_id(fields: Mapping[str, Any]) -> str:
    """What the shard is computed from: ``response_id``, else ``turn_id``."""
    return _text(fields, "response_id") or _text(fields, "turn_id") or ""


def _check_id(name: str, value: str) -> None:
    if len(value) > MAX_ID_LENGTH:
        raise EntryError(
            "invalid_entry", f"field {name!r} is longer than {MAX_ID_LENGTH} characters"
        )


def decode_entry(
    raw_fields: Mapping[Any, Any], *, max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
) -> tuple[TurnKey, Record]:
    """Decode one input entry (stream fields, or a ``processor merge`` line).

    ``update`` may be JSON text, msgpack bytes (``enc=msgpack``) or, offline,
    an already-parsed JSON object.
    """
    fields, size = _sized_str_keys(raw_fields)
    if size > max_entry_bytes:
        raise EntryError("too_large", f"entry is {size} bytes, the limit is {max_entry_bytes}")
    turn = turn_key(fields)
    try:
        return turn, _record(fields)
    except EntryError as exc:
        exc.turn = turn
        raise


def _sized_str_keys(fields: Mapping[Any, Any]) -> tuple[dict[str, Any], int]:
    """``(_as_str_keys(fields), entry_size(fields))`` in one pass (the hot path).

    Only the size can raise, and it is computed first for each field, so
    failures are those of ``entry_size`` followed by ``_as_str_keys``. A plain
    dict with str keys and str/bytes values is returned as it is: nothing in
    the decoder writes to the fields, so it stands for its own copy.
    """
    if fields.__class__ is dict:
        total = 0
        for key, value in fields.items():
            cls = value.__class__
            if key.__class__ is not str or (cls is not str and cls is not bytes):
                break
            total += len(key) + len(value)
        else:
            return fields, total
    total = 0
    out: dict[str, Any] = {}
    for key, value in fields.items():
        total += len(key)
        if isinstance(value, bytes | str):
            total += len(value)
        elif value is not None:
            total += len(msgspec.json.encode(value))
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        out[key] = value
    return out, total


def _record(fields: Mapping[str, Any]) -> Record:
    kind = fields.get("kind")
    if kind is not None and kind.__class__ is not str:
        kind = _text(fields, "kind")
    kind = kind or "update"
    if kind not in _KINDS:
        raise EntryError("invalid_entry", f"field 'kind': unknown kind {clip(kind)}")
    ids = {}
    # Most entries carry no correlation id: skip the per-name lookups then.
    if not _CORRELATION_SET.isdisjoint(fields):
        for name in _CORRELATION_IDS:
            value = _text(fields, name)
            if value:
                _check_id(name, value)
                ids[name] = value
    if kind == "update":
        return Record("update", update=decode_update(fields), ids=ids)
    if kind == "error":
        return Record("error", ids=ids, error=_text(fields, "error"), code=_text(fields, "code"))
    return Record("end", ids=ids)


def decode_update(fields: Mapping[str, Any]) -> Update:
    """The ``update`` field of an entry as an :class:`Update`."""
    enc = fields.get("enc")
    if enc is not None and enc.__class__ is not str:
        enc = _text(fields, "enc")
    enc = enc or "json"
    if enc == "json":
        fast, generic = _json_update, _json_any
    elif enc == "msgpack":
        fast, generic = _msgpack_update, _msgpack_any
    else:
        raise EntryError("bad_encoding", f"field 'enc': unknown encoding {clip(enc)}")
    raw = fields.get("update")
    if raw.__class__ is str:
        raw = raw.encode("utf-8")
    elif raw.__class__ is not bytes:
        if raw is None:
            raise EntryError("invalid_update", "field 'update' is required for kind=update")
        if isinstance(raw, dict):
            return update_from_object(raw)
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        if not isinstance(raw, bytes):
            raise EntryError(
                "invalid_update", f"field 'update': expected JSON text, got {type(raw).__name__}"
            )
    try:
        return fast.decode(raw)
    except msgspec.ValidationError:
        pass  # maybe .NET shape, an unknown field or type: take the general path
    except msgspec.DecodeError as exc:
        raise EntryError("bad_encoding", f"field 'update' is not valid {enc}: {exc}") from None
    try:
        obj = generic.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise EntryError("bad_encoding", f"field 'update' is not valid {enc}: {exc}") from None
    return update_from_object(obj)


def update_from_object(obj: Any) -> Update:
    """Validate a parsed update document of either Agent Framework shape."""
    if not isinstance(obj, dict):
        raise EntryError(
            "invalid_update", f"$.update: expected an object, got {type(obj).__name__}"
        )
    if dotnet.looks_dotnet(obj):
        obj = dotnet.update_to_python(obj)
    obj = _keep_unknown_fields(obj)
    try:
        return msgspec.convert(obj, Update)
    except msgspec.ValidationError as exc:
        raise EntryError("invalid_update", _with_path(str(exc))) from None
    except RecursionError:
        raise EntryError("invalid_update", "$.update: nested too deeply") from None


def _with_path(message: str) -> str:
    # msgspec says "... - at `$.contents[0].text`"; anchor the path at the field.
    return message.replace("`$", "`$.update")


def _keep_unknown_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """Move fields Agent Framework does not know into ``additional_properties``."""
    obj = _fold_unknown(obj, UPDATE_FIELDS, "$.update")
    contents = obj.get("contents")
    if isinstance(contents, list):
        obj["contents"] = [
            _fold_unknown(c, CONTENT_FIELDS, f"$.update.contents[{i}]")
            if isinstance(c, dict)
            else c
            for i, c in enumerate(contents)
        ]
    return obj


def _fold_unknown(obj: dict[str, Any], known: frozenset[str], path: str) -> dict[str, Any]:
    unknown = [k for k in obj if k not in known]
    if not unknown:
        return obj
    kept = {k: v for k, v in obj.items() if k in known}
    extra = kept.get("additional_properties")
    if extra is None:
        extra = {}
    elif not isinstance(extra, dict):
        raise EntryError("invalid_update", f"{path}.additional_properties: expected an object")
    kept["additional_properties"] = {**{k: obj[k] for k in unknown}, **extra}
    return kept

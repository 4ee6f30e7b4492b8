"""Stream entry fields -> validated :class:`Record`, or a specific error.

Every failure is an :class:`EntryError` with a DLQ reason code (contract 5.3)
and a human-readable detail naming the offending path. Nothing here raises
anything else on bad input: the worker dead-letters the entry and moves on.
"""

from __future__ import annotations

import math
import operator
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
    Content,
    Record,
    Update,
)

DEFAULT_MAX_ENTRY_BYTES = 1 << 20
MAX_ID_LENGTH = 512
#: Deepest nesting an update may have (the update object is level 1). Fixed,
#: so an update is accepted or refused the same way on every process: left to
#: the interpreter's recursion limit, one that decodes could still fail to be
#: stored (msgpack) or published (JSON) a few levels deeper, mid-turn.
MAX_DEPTH = 64
#: What msgpack (the turn state) can hold; JSON could carry more.
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
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
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise EntryError("invalid_entry", f"field {name!r}: not a JSON value") from None


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
            if key.__class__ is not str or (cls is not bytes and cls is not str):
                break
            if cls is str and not value.isascii():
                break  # counted in UTF-8 bytes below
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
        return check_update(fast.decode(raw))
    except msgspec.ValidationError:
        pass  # maybe .NET shape, an unknown field or type: take the general path
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise EntryError("bad_encoding", f"field 'update' is not valid {enc}: {exc}") from None
    except RecursionError:
        raise _too_deep("$.update") from None
    try:
        obj = generic.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise EntryError("bad_encoding", f"field 'update' is not valid {enc}: {exc}") from None
    except RecursionError:
        raise _too_deep("$.update") from None
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
        update = msgspec.convert(obj, Update)
    except msgspec.ValidationError as exc:
        raise EntryError("invalid_update", _with_path(str(exc))) from None
    except RecursionError:
        raise _too_deep("$.update") from None
    return check_update(update)


def _too_deep(path: str) -> EntryError:
    return EntryError("invalid_update", f"{path}: nested deeper than {MAX_DEPTH} levels")


# ---------------------------------------------------------------- free-form values

#: Content fields that may hold more than a string or a flag. Only these are
#: walked, so a text delta costs a few attribute reads.
_FREE_FORM = tuple(
    field.name
    for field in msgspec.structs.fields(Content)
    if field.type not in (str | None, bool | None, str)
)
_free_form_values = operator.attrgetter(*_FREE_FORM)
_N_FREE_FORM = len(_FREE_FORM)
_ARGUMENTS = _FREE_FORM.index("arguments")
_EXTRA = _FREE_FORM.index("additional_properties")
#: Content fields that Agent Framework loads as nested contents (``from_dict``).
_NESTED_ONE = frozenset({"function_call", "screenshot"})
_NESTED_MANY = frozenset({"inputs", "outputs", "items"})


def check_update(update: Update) -> Update:
    """Refuse what the merge could not store or publish, and give nested
    contents the same treatment as top-level ones (unknown fields kept in
    ``additional_properties``) so that the output loads in Agent Framework.

    Free-form values (results, arguments, extra properties, ...) must be
    JSON-shaped: string keys, integers msgpack can hold, no msgpack extension
    types, at most :data:`MAX_DEPTH` levels deep.
    """
    for i, content in enumerate(update.contents):
        values = _free_form_values(content)  # one C call instead of 19 getattr
        if not _idle(values, 3):
            _walk_content(content, values, f"$.update.contents[{i}]", 3)
    if update.additional_properties:
        _check_value(update.additional_properties, "$.update.additional_properties", 2)
    if update.continuation_token:
        _check_value(update.continuation_token, "$.update.continuation_token", 2)
    return update


def _check_content(content: Content, path: str, depth: int = 3) -> None:
    values = _free_form_values(content)
    if not _idle(values, depth):
        _walk_content(content, values, path, depth)


def _idle(values: tuple[Any, ...], depth: int) -> bool:
    """Whether :func:`_walk_content` would pass over every value.

    The usual delta: besides Nones at most a str ``arguments`` and an empty
    ``additional_properties`` (what ``to_dict`` writes).
    """
    idle = values.count(None)
    if idle == _N_FREE_FORM:
        return True
    if values[_ARGUMENTS].__class__ is str:
        idle += 1
    extra = values[_EXTRA]
    if extra.__class__ is dict and not extra and depth < MAX_DEPTH:
        idle += 1
    return idle == _N_FREE_FORM


def _walk_content(content: Content, values: tuple[Any, ...], path: str, depth: int) -> None:
    for name, value in zip(_FREE_FORM, values, strict=True):
        if value is None or value.__class__ is str:
            continue
        where = f"{path}.{name}"
        if name in _NESTED_ONE and isinstance(value, dict):
            setattr(content, name, _nested_content(value, where, depth + 1))
        elif name in _NESTED_MANY and isinstance(value, list):
            setattr(content, name, _nested_contents(value, where, depth + 1))
        else:
            _check_value(value, where, depth + 1)


def _nested_contents(items: list[Any], path: str, depth: int) -> list[Any]:
    if depth > MAX_DEPTH:
        raise _too_deep(path)
    return [
        _nested_content(item, f"{path}[{i}]", depth + 1)
        if isinstance(item, dict)
        else _checked(item, f"{path}[{i}]", depth + 1)
        for i, item in enumerate(items)
    ]


def _nested_content(obj: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
    """A content inside a content (a call in an approval request, the items of
    a result, ...): Agent Framework loads it as a ``Content`` too."""
    if not isinstance(obj.get("type"), str):
        raise EntryError("invalid_update", f"{path}.type: a nested content needs a string type")
    try:
        content = msgspec.convert(_fold_unknown(obj, CONTENT_FIELDS, path), Content)
    except msgspec.ValidationError as exc:
        raise EntryError("invalid_update", _anchored(str(exc), path)) from None
    except RecursionError:
        raise _too_deep(path) from None
    _check_content(content, path, depth)
    return msgspec.to_builtins(content)


def _anchored(message: str, path: str) -> str:
    return message.replace("`$", f"`{path}")


def _checked(value: Any, path: str, depth: int) -> Any:
    _check_value(value, path, depth)
    return value


def _check_value(value: Any, path: str, depth: int) -> None:
    """Walk a free-form value without recursion (it may be deep).

    An item's path is only spelled out for an error: each stacked item links
    to its parent's link and its own key, so a wide value under long keys
    costs O(size), not O(size x path length) (a 750 KB entry used to take
    9 GB and 20 s here).
    """
    stack: list[tuple[Any, int, Any]] = [(value, depth, None)]
    while stack:
        value, depth, link = stack.pop()
        cls = value.__class__
        if cls is dict:
            if depth > MAX_DEPTH:
                raise _too_deep(_spell(path, link))
            for key, item in value.items():
                if key.__class__ is not str:
                    raise EntryError(
                        "invalid_update", f"{_spell(path, link)}: object keys must be strings"
                    )
                stack.append((item, depth + 1, (link, key)))
        elif cls is list:
            if depth > MAX_DEPTH:
                raise _too_deep(_spell(path, link))
            stack.extend((item, depth + 1, (link, i)) for i, item in enumerate(value))
        elif cls is int:
            if not _INT_MIN <= value <= _INT_MAX:
                raise EntryError("invalid_update", f"{_spell(path, link)}: integer out of range")
        elif cls is msgspec.msgpack.Ext or cls is bytes:
            # msgpack input is "the same map" as JSON (contract section 3):
            # binary would come out as base64 text, silently changed.
            kind = "extension types" if cls is not bytes else "binary values"
            raise EntryError("invalid_update", f"{_spell(path, link)}: msgpack {kind} are not JSON")
        elif cls is float and not math.isfinite(value):
            # JSON has no NaN or infinity: it would be published as null.
            where = _spell(path, link)
            raise EntryError("invalid_update", f"{where}: {value} is not a JSON number")


#: Longest object key an error path spells out (a detail echoes a bounded prefix).
_PATH_KEY = 40


def _spell(path: str, link: Any) -> str:
    """The path of a linked item: ``$.a.b[3]``; long keys are cut."""
    parts: list[str] = []
    while link is not None:
        link, key = link
        if key.__class__ is int:
            parts.append(f"[{key}]")
        else:
            parts.append("." + (key if len(key) <= _PATH_KEY else key[:_PATH_KEY] + "..."))
    return path + "".join(reversed(parts))


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

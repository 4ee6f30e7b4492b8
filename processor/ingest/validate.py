"""What an update may hold: the checks between msgspec's decoding and the merge.

msgspec checks the shape (types, required fields) in C. What it cannot check
is left to this module: free-form values (results, arguments, extra
properties, ...) must be JSON-shaped and storable (string keys, integers
msgpack can hold, no msgpack extension types, at most ``MAX_DEPTH``
levels deep), nested contents get the same treatment as top-level ones, and
fields Agent Framework does not know move into ``additional_properties``.

Every failure is an ``EntryError`` naming the path and the reason.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import msgspec

from processor.ingest import dotnet
from processor.wire.models import CONTENT_FIELDS, MAX_USAGE_COUNT, UPDATE_FIELDS, Content, Update

#: Deepest nesting an update may have (the update object is level 1). Fixed,
#: so an update is accepted or refused the same way on every process: left to
#: the interpreter's recursion limit, one that decodes could still fail to be
#: stored (msgpack) or published (JSON) a few levels deeper, mid-turn.
MAX_DEPTH = 64
#: What msgpack (the turn state) can hold; JSON could carry more.
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
#: How much of a bad value an error detail may echo (never the whole payload).
DETAIL_PREFIX = 120


class EntryError(Exception):
    """An entry that cannot be merged. ``reason`` is the DLQ reason code."""

    def __init__(self, reason: str, detail: str, turn: Any = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.turn = turn


def clip(value: str | bytes) -> str:
    """A bounded, printable prefix of a bad value for error details."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return repr(text[:DETAIL_PREFIX]) + ("..." if len(text) > DETAIL_PREFIX else "")


def too_deep(path: str) -> EntryError:
    return EntryError("invalid_update", f"{path}: nested deeper than {MAX_DEPTH} levels")


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
        raise too_deep("$.update") from None
    return check_update(update)


# ---------------------------------------------------------------- free-form values

#: Content fields that may hold more than a string or a flag, in field order
#: (the order they are walked, so the first bad one is the one reported).
_FREE_FORM = tuple(
    field.name
    for field in msgspec.structs.fields(Content)
    if field.type not in (str | None, bool | None, str)
)
_free_form_values = operator.attrgetter(*_FREE_FORM)
#: Content fields that Agent Framework loads as nested contents (``from_dict``).
_NESTED_ONE = frozenset({"function_call", "screenshot"})
_NESTED_MANY = frozenset({"inputs", "outputs", "items"})


def check_update(update: Update) -> Update:
    """Refuse what the merge could not store or publish, and give nested
    contents the same treatment as top-level ones (unknown fields kept in
    ``additional_properties``) so that the output loads in Agent Framework.
    """
    i = -1
    for c in update.contents:
        i += 1
        # Idle (the usual delta): no free-form value but str ones (skipped by
        # the walk) and an empty ``additional_properties`` (what ``to_dict``
        # writes). Plain attribute reads: the cheapest test Python has. Keep
        # in step with _FREE_FORM (checked at import below).
        if (
            c.inputs is None
            and c.timeout_ms is None
            and c.max_output_length is None
            and c.actions is None
            and c.screenshot is None
            and c.pending_safety_checks is None
            and c.acknowledged_safety_checks is None
            and c.exit_code is None
            and c.function_call is None
            and c.annotations is None
            and (c.arguments is None or c.arguments.__class__ is str)
            and (c.result is None or c.result.__class__ is str)
            and (c.outputs is None or c.outputs.__class__ is str)
            and (c.output is None or c.output.__class__ is str)
            and not c.additional_properties
        ):
            # Idle but for a usage content's counters or a result's items
            # (each alone): what the walk would do for that one field.
            if c.usage_details is None:
                if c.items is None:
                    continue
                c.items = _nested_contents(c.items, f"$.update.contents[{i}].items", 4)
                continue
            if c.items is None and _counts_fit(c.usage_details):
                continue
        _walk_content(c, _free_form_values(c), f"$.update.contents[{i}]", 3)
    if update.additional_properties:
        _check_value(update.additional_properties, "$.update.additional_properties", 2)
    if update.continuation_token:
        _check_value(update.continuation_token, "$.update.continuation_token", 2)
    return update


def _counts_fit(counts: dict[str, int | None]) -> bool:
    """Usage counters the walk would accept: the decoder typed them (string
    keys, integer or null values), so only their range is left."""
    for count in counts.values():
        if count is not None and not 0 <= count <= MAX_USAGE_COUNT:
            return False
    return True


def _check_counts(counts: dict[str, int | None], path: str) -> None:
    """Each usage count an integer from 0 to ``MAX_USAGE_COUNT`` (or
    null), so that every JSON reader holds it, and the turn's sums, exactly."""
    for name, count in counts.items():
        if count is not None and not 0 <= count <= MAX_USAGE_COUNT:
            where = _spell(path, (None, name))
            raise EntryError(
                "invalid_update",
                f"{where}: a usage count must be an integer from 0 to {MAX_USAGE_COUNT}",
            )


#: What the idle test in check_update reads, or needs not: ``merge_mode`` is
#: always a str and ``commands`` a list of str (the decoder types them), which
#: the walk never refuses.
_IDLE_TESTED = frozenset(
    {
        *("usage_details", "items", "inputs", "commands", "timeout_ms", "max_output_length"),
        *("actions", "screenshot", "pending_safety_checks", "acknowledged_safety_checks"),
        *("exit_code", "function_call", "annotations", "arguments", "result", "outputs"),
        *("output", "additional_properties", "merge_mode"),
    }
)
assert set(_FREE_FORM) == _IDLE_TESTED, "check_update's idle test misses a free-form field"


def _walk_content(content: Content, values: tuple[Any, ...], path: str, depth: int) -> None:
    for name, value in zip(_FREE_FORM, values, strict=True):
        if value is None:
            continue
        cls = value.__class__
        if cls is str:
            continue
        if name == "usage_details" and cls is dict:
            _check_counts(value, f"{path}.usage_details")
        elif name in _NESTED_ONE and isinstance(value, dict):
            setattr(content, name, _nested_content(value, f"{path}.{name}", depth + 1))
        elif name in _NESTED_MANY and isinstance(value, list):
            setattr(content, name, _nested_contents(value, f"{path}.{name}", depth + 1))
        elif (cls is dict or cls is list) and not value and depth < MAX_DEPTH:
            continue  # empty, within the depth limit (``additional_properties: {}``)
        else:
            _check_value(value, f"{path}.{name}", depth + 1)


def _nested_contents(items: list[Any], path: str, depth: int) -> list[Any]:
    if depth > MAX_DEPTH:
        raise too_deep(path)
    out = []  # (a loop, not a comprehension: that is one more Python call)
    for i, item in enumerate(items):
        if isinstance(item, dict):
            out.append(_nested_content(item, f"{path}[{i}]", depth + 1))
        else:
            out.append(_checked(item, f"{path}[{i}]", depth + 1))
    return out


def _nested_content(obj: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
    """A content inside a content (a call in an approval request, the items of
    a result, ...): Agent Framework loads it as a ``Content`` too."""
    if not isinstance(obj.get("type"), str):
        raise EntryError("invalid_update", f"{path}.type: a nested content needs a string type")
    if depth < MAX_DEPTH and _plain_content(obj):
        # What the conversion below gives back for it (a result's text
        # items); within the depth limit, its empty properties are no error.
        return obj
    try:
        content = msgspec.convert(_fold_unknown(obj, CONTENT_FIELDS, path), Content)
    except msgspec.ValidationError as exc:
        raise EntryError("invalid_update", _anchored(str(exc), path)) from None
    except RecursionError:
        raise too_deep(path) from None
    _walk_content(content, _free_form_values(content), path, depth)
    plain: dict[str, Any] = msgspec.to_builtins(content)
    return plain


#: Content fields that hold a plain string, by position; then where
#: ``additional_properties`` sits.
_STRING_FIELDS = {
    field.name: i
    for i, field in enumerate(msgspec.structs.fields(Content))
    if field.type in (str | None, str)
}
_PROPERTIES_AT = Content.__struct_fields__.index("additional_properties")


def _plain_content(obj: dict[str, Any]) -> bool:
    """A nested content of string fields only, in field order, and at most an
    empty ``additional_properties``: converting it to a Content, checking and
    unstructuring that gives back the same keys, order and values."""
    at = -1
    for key, value in obj.items():
        position = _STRING_FIELDS.get(key)
        if position is None:
            if key != "additional_properties" or value.__class__ is not dict or value:
                return False
            position = _PROPERTIES_AT
        elif value.__class__ is not str:
            return False
        if position <= at:
            return False
        at = position
    return True


def _anchored(message: str, path: str) -> str:
    return message.replace("`$", f"`{path}")


def _checked(value: Any, path: str, depth: int) -> Any:
    _check_value(value, path, depth)
    return value


def _check_value(value: Any, path: str, depth: int) -> None:
    """Walk a free-form value without recursion (it may be deep).

    An item's path is only spelled out for an error: each stacked item links
    to its parent's link and its own key, so a wide value under long keys
    costs O(size), not O(size x path length), which a wide value under long
    keys would make gigabytes.
    """
    if value.__class__ is dict and depth <= MAX_DEPTH:
        # The usual value (usage counts, properties): string keys and plain
        # scalars, which the walk below would accept; checked without its
        # bookkeeping (a Python call or a tuple per item costs more than this).
        for key, item in value.items():
            cls = item.__class__
            if key.__class__ is not str or not (
                cls is str
                or item is None
                or cls is bool
                or (cls is int and _INT_MIN <= item <= _INT_MAX)
            ):
                break
        else:
            return
    stack: list[tuple[Any, int, Any]] = [(value, depth, None)]
    while stack:
        value, depth, link = stack.pop()
        cls = value.__class__
        if cls is dict:
            if depth > MAX_DEPTH:
                raise too_deep(_spell(path, link))
            for key, item in value.items():
                if key.__class__ is not str:
                    raise EntryError(
                        "invalid_update", f"{_spell(path, link)}: object keys must be strings"
                    )
                stack.append((item, depth + 1, (link, key)))
        elif cls is list:
            if depth > MAX_DEPTH:
                raise too_deep(_spell(path, link))
            stack.extend((item, depth + 1, (link, i)) for i, item in enumerate(value))
        elif cls is int:
            if not _INT_MIN <= value <= _INT_MAX:
                raise EntryError("invalid_update", f"{_spell(path, link)}: integer out of range")
        elif cls is msgspec.msgpack.Ext or cls is bytes:
            # msgpack input is "the same map" as JSON (docs/contract.md §3):
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
    if known.issuperset(obj):
        return obj  # the usual object: no unknown field (tested in C)
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

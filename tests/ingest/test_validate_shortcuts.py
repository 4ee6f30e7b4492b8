"""The shortcuts of processor.ingest.validate accept, refuse and rewrite exactly what
the full walk does: each is compared with the walk it skips (the shortcut
switched off) on the same generated input."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from processor.ingest import validate
from processor.ingest.decode import EntryError, decode_entry
from processor.wire.models import Content, Record, Update

_STRINGS = sorted(validate._STRING_FIELDS)
_SCALARS = st.one_of(
    st.text(max_size=5),
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 65), max_value=1 << 65),
    st.floats(allow_nan=False, allow_infinity=False),
)
_VALUES = st.one_of(
    _SCALARS,
    st.just({}),
    st.just([]),
    st.dictionaries(st.sampled_from(("a", "b")), _SCALARS, max_size=2),
)
#: Nested contents: mostly string fields (in field order or not), sometimes
#: an ``additional_properties``, another field or a non-string value.
_NESTED = st.lists(
    st.tuples(
        st.sampled_from([*_STRINGS, "additional_properties", "result", "unknown_field"]),
        st.one_of(st.text(max_size=5), _VALUES),
    ),
    max_size=5,
).map(lambda pairs: {"type": "text", **dict(pairs)})


def _outcome(run: Any) -> str:
    try:
        return json.dumps(run())  # key order included
    except EntryError as exc:
        return f"{exc.reason}: {exc.detail}"


def _without(name: str, monkeypatch: pytest.MonkeyPatch, run: Any) -> str:
    with monkeypatch.context() as patch:
        patch.setattr(validate, name, lambda *_: False)
        return _outcome(run)


@settings(max_examples=150, deadline=None)
@given(items=st.lists(_NESTED, min_size=1, max_size=3), depth=st.sampled_from((4, 63, 64)))
@example(items=[{"type": "text", "additional_properties": {}}], depth=63)  # too deep there
def test_plain_nested_contents_convert_as_the_full_path(
    items: list[dict[str, Any]], depth: int
) -> None:
    monkeypatch = pytest.MonkeyPatch()

    def run() -> Any:
        fresh = json.loads(json.dumps(items))
        return validate._nested_contents(fresh, "$.x", depth)

    assert _outcome(run) == _without("_plain_content", monkeypatch, run)


def test_a_result_with_text_items_takes_the_shortcut() -> None:
    item = {"type": "text", "text": "ok", "additional_properties": {}}
    assert validate._plain_content(item)
    assert not validate._plain_content({"text": "ok", "type": "text"})  # not in field order
    assert not validate._plain_content({"type": "text", "additional_properties": {"a": 1}})
    converted = msgspec.to_builtins(msgspec.convert(item, Content))
    assert json.dumps(converted) == json.dumps(item)


@settings(max_examples=150, deadline=None)
@given(
    counts=st.dictionaries(
        st.text(max_size=3),
        st.one_of(st.none(), st.integers(min_value=-(1 << 65), max_value=1 << 65)),
        max_size=4,
    ),
    extra=st.sampled_from(({}, {"items": [1]}, {"additional_properties": {"k": 1.5}})),
)
def test_usage_counts_are_checked_as_the_full_walk_does(
    counts: dict[str, int | None], extra: dict[str, Any]
) -> None:
    usage = {"type": "usage", "usage_details": counts, **extra}
    text = json.dumps({"contents": [usage]})
    monkeypatch = pytest.MonkeyPatch()

    def run() -> Any:
        _, record = decode_entry({"response_id": "r", "update": text})
        return msgspec.to_builtins(record)

    assert _outcome(run) == _without("_counts_fit", monkeypatch, run)


@settings(max_examples=150, deadline=None)
@given(
    items=st.lists(st.one_of(_NESTED, _VALUES), max_size=3),
    extra=st.sampled_from(
        ({}, {"result": "ok"}, {"result": {"a": 1}}, {"usage_details": {"n": 1}}, {"uri": "u"})
    ),
)
def test_result_items_are_checked_as_the_full_walk_does(
    items: list[Any], extra: dict[str, Any]
) -> None:
    content = {"type": "function_result", "call_id": "c", "items": items, **extra}
    text = json.dumps({"contents": [content]})

    def shortcut() -> Any:
        _, record = decode_entry({"response_id": "r", "update": text})
        return msgspec.to_builtins(record)

    def walk() -> Any:
        update = msgspec.json.decode(text, type=Update)
        for i, c in enumerate(update.contents):
            validate._walk_content(c, validate._free_form_values(c), f"$.update.contents[{i}]", 3)
        return msgspec.to_builtins(Record("update", update, {}))

    assert _outcome(shortcut) == _outcome(walk)

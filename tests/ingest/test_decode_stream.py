"""``decode_stream_entry`` (the worker's decoder for fields as Redis returns
them) gives exactly what ``decode_entry`` gives: the same record, or the same
error with the same detail and turn, so the DLQ output cannot change; and
the entry's size as ``entry_size`` measures it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.bad_entries import CASES

from processor.ingest.decode import EntryError, decode_entry, decode_stream_entry, entry_size


def outcome(decode: Any, fields: dict[Any, Any], **kwargs: Any) -> Any:
    try:
        return decode(fields, **kwargs)
    except EntryError as exc:
        return ("error", exc.reason, exc.detail, exc.turn)


def as_stream(fields: dict[str, Any]) -> dict[bytes, bytes]:
    return {k.encode(): v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass")
            for k, v in fields.items()}


def same(fields: dict[Any, Any], **kwargs: Any) -> Any:
    """decode_entry's outcome, after checking decode_stream_entry's is the same."""
    expected = outcome(decode_entry, fields, **kwargs)
    found = outcome(decode_stream_entry, fields, **kwargs)
    if expected[0] == "error":
        assert found == expected
    else:
        assert found == (*expected, entry_size(fields))
    return expected


TEXT = json.dumps({"contents": [{"type": "text", "text": "hi"}], "message_id": "m1"})


@pytest.mark.parametrize("fields", [
    {"response_id": "r1", "update": TEXT},
    {"response_id": "r1", "attempt_id": "a2", "update": TEXT},
    {"response_id": "r1", "update": TEXT, "x_unknown": "kept out"},
    {"response_id": "r1", "update": TEXT, "step_id": "s1"},
    {"response_id": "r1", "kind": "end"},
    {"response_id": "", "kind": "end"},
    {"response_id": "r" * 300, "kind": "end"},
    {"response_id": "r\u00e9", "kind": "end"},
    {"response_id": "r1", "kind": "End"},
    {"response_id": "r1", "kind": "error"},
    {"turn_id": "t1", "kind": "end"},
    {"turn_id": "t1", "update": TEXT},
    {"response_id": "r\u00e9", "update": TEXT},
    {"response_id": "r1", "update": TEXT.replace("hi", "h\u00e9")},
    {"response_id": "r1", "update": '{"contents": [{"type": "text", "text": 5}]}'},
    {"response_id": "r1", "update": '{"contents": [{"type": "text"'},
    {"response_id": "", "update": TEXT},
    {"response_id": "r" * 300, "update": TEXT},
])
def test_the_usual_and_the_unusual_entries_decode_the_same(fields: dict[str, Any]) -> None:
    result = same(as_stream(fields))
    if fields == {"response_id": "r1", "update": TEXT}:
        assert result[1].kind == "update"  # the fast path was exercised, not an error
    if fields == {"response_id": "r1", "kind": "end"}:
        assert result[1].kind == "end"


def test_a_turn_seen_before_decodes_the_same_from_bytes_and_from_str() -> None:
    # The fast paths remember recent turn keys, under the str id for str
    # fields and under the bytes id for Redis's: each must give the str key.
    fields = {"response_id": "r-cached", "update": TEXT}
    for _ in range(3):
        key, _record = same(as_stream(fields))
        assert key == ("r-cached", "") and type(key.response_id) is str
        assert same(dict(fields))[0] == key


@pytest.mark.parametrize("name,fields", [(c[0], c[1]) for c in CASES])
def test_every_refused_entry_is_refused_the_same(name: str, fields: dict[Any, Any]) -> None:
    assert same(fields)[0] == "error", name


def test_the_size_limit_applies_the_same() -> None:
    fields = as_stream({"response_id": "r1", "update": TEXT})
    assert same(fields, max_entry_bytes=10)[1] == "too_large"
    assert same(fields, max_entry_bytes=len(TEXT) + 19)[0] != "error"
    end = as_stream({"response_id": "r1", "kind": "end"})  # 11 + 2 + 4 + 3 bytes
    assert same(end, max_entry_bytes=19)[1] == "too_large"
    assert same(end, max_entry_bytes=20)[1].kind == "end"


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(
    st.sampled_from([b"response_id", b"turn_id", b"attempt_id", b"kind", b"update", b"enc",
                     b"step_id", b"x", b"\xff"]),
    st.binary(max_size=20) | st.sampled_from([TEXT.encode(), b"r1", b"end", b"msgpack"]),
    max_size=5))
def test_any_bytes_fields_decode_the_same(fields: dict[bytes, bytes]) -> None:
    same(fields)

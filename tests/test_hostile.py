"""Hostile input: malformed, oversized and adversarial entries.

- The decoder, fuzzed with raw bytes (Hypothesis): every input either decodes
  to a record the merge can store and publish, or is refused with a DLQ
  reason and a bounded detail; adversarial shapes cost memory linear in
  their size.
- Live workers: generated malformed entries of every kind, mixed into random
  valid turns, each land in the DLQ with the reason ``processor merge`` gives
  them; no worker crashes or stalls, the turns around them merge as
  ``processor merge`` does, and memory stays bounded.
- Limits, set with ``processor run`` flags: entry size (``too_large``),
  updates and bytes per turn (the turn ends with ``turn_limit``).
"""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.decode import EntryError, decode_entry
from processor.events import encode_response
from processor.merge import Turn


def test_a_wide_value_under_long_keys_costs_linear_memory() -> None:
    """A free-form value with long keys on the way down to a wide object:
    checking it once spelled out every item's full path (a 750 KB entry took
    9 GB and 20 s)."""
    obj: dict = {f"k{i}": 0 for i in range(2000)}
    for level in range(10):
        obj = {f"K{level}" * 1000: obj}
    raw = json.dumps({"contents": [{"type": "text", "text": "x"}], "additional_properties": obj})
    tracemalloc.start()
    try:
        decode_entry({"response_id": "r", "update": raw})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 30 * len(raw), f"{peak} bytes to check a {len(raw)}-byte entry"


def test_error_paths_echo_a_bounded_prefix_of_keys() -> None:
    key = "K" * 100_000
    raw = json.dumps({"contents": [{"type": "text", "text": "x",
                                    "additional_properties": {key: {key: 2**70}}}]})
    with pytest.raises(EntryError) as caught:
        decode_entry({"response_id": "r", "update": raw})
    assert caught.value.reason == "invalid_update"
    assert "integer out of range" in caught.value.detail
    assert len(caught.value.detail) < 300, caught.value.detail[:300]


# --------------------------------------------------------------------------- generated entries

TEXT_UPDATE = {"type": "agent_response_update", "role": "assistant",
               "contents": [{"type": "text", "text": "ok"}]}
MAX_ENTRY = 1 << 20
#: msgpack headers announcing ~4 GB of array, map, str, bin and ext data.
ABSURD = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
          b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01",
          b"\x81\xa8contents\xdd\x7f\xff\xff\xff"]


@dataclass
class Hostile:
    """One malformed entry: its fields, the reasons it may get, and whether a
    ``processor merge`` line can carry it (str values only)."""

    category: str
    fields: dict[str, Any]
    reasons: frozenset[str]

    @property
    def as_line(self) -> bool:
        return all(isinstance(v, str) for v in self.fields.values())


@st.composite
def hostile_entries(draw: Any, rid: str) -> Hostile:
    """A malformed entry of a random kind for turn ``rid``."""
    category = draw(st.sampled_from(CATEGORIES))
    js = json.dumps
    update = js(TEXT_UPDATE)
    fields: dict[str, Any] = {"response_id": rid}
    reasons = {"invalid_update"}
    if category == "bad_json":
        fields["update"] = draw(st.text(max_size=40)) + "}{"
        reasons = {"bad_encoding"}
    elif category == "not_an_object":
        fields["update"] = js(draw(st.integers() | st.text(max_size=8) | st.none()
                                   | st.lists(st.integers(), max_size=3) | st.booleans()))
    elif category == "wrong_types":
        bad = draw(st.integers() | st.lists(st.integers(), min_size=1, max_size=2)
                   | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
        where = draw(st.sampled_from(["contents", "text", "role", "message_id", "type"]))
        doc: dict[str, Any] = json.loads(update)
        if where == "contents":
            doc["contents"] = bad if not isinstance(bad, list) else [1, *bad]
        elif where in ("text", "type"):
            doc["contents"][0][where] = bad
        else:
            doc[where] = bad
        fields["update"] = js(doc)
    elif category == "missing_turn_key":
        fields = {"update": update, **draw(st.sampled_from([{}, {"response_id": ""},
                                                            {"turn_id": ""}]))}
        reasons = {"missing_turn_key"}
    elif category == "missing_update":
        fields["kind"] = draw(st.sampled_from(["update", ""]))
    elif category == "invalid_utf8":
        name = draw(st.sampled_from(["response_id", "kind", "enc", "update", "step_id",
                                     "attempt_id"]))
        value = {"response_id": rid, "kind": "update", "enc": "json", "update": update,
                 "step_id": "s1", "attempt_id": "a1"}[name].encode()
        cut = draw(st.integers(0, len(value)))
        fields["update"] = update
        fields[name] = value[:cut] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80",
                                                          b"\xfe\xfe"])) + value[cut:]
        reasons = {"bad_encoding"}
    elif category == "deep_nesting":
        depth = draw(st.integers(65, 20_000))
        if draw(st.booleans()):
            deep = "[" * depth + "1" + "]" * depth
        else:
            deep = '{"a":' * depth + "1" + "}" * depth
        if draw(st.booleans()):
            fields["update"] = f'{{"contents": [], "additional_properties": {deep}}}'
        else:
            fields["update"] = ('{"contents": [{"type": "function_result", "call_id": "c", '
                                f'"result": {deep}}}]}}')
    elif category == "huge_string":
        doc = json.loads(update)
        doc["contents"][0]["text"] = "x" * draw(st.integers(MAX_ENTRY, MAX_ENTRY + 300_000))
        fields["update"] = js(doc)
        reasons = {"too_large"}
    elif category == "huge_array":
        n = draw(st.integers(50_000, 300_000))
        fields["update"] = js({"contents": [0] * n})
    elif category == "msgpack_absurd_length":
        fields["enc"] = "msgpack"
        fields["update"] = draw(st.sampled_from(ABSURD)) + draw(st.binary(max_size=8))
        reasons = {"bad_encoding"}
    elif category == "msgpack_garbage":
        fields["enc"] = "msgpack"
        # Not a map (an empty one would be a valid update).
        raw = draw(st.binary(min_size=1, max_size=64).filter(
            lambda b: not (0x80 <= b[0] <= 0x8F or b[0] in (0xDE, 0xDF))))
        fields["update"] = raw
        reasons = {"bad_encoding", "invalid_update"}
    elif category == "msgpack_non_json":
        # Valid msgpack that JSON cannot carry: the contract's msgpack is "the
        # same map", so these are refused rather than silently changed.
        fields["enc"] = "msgpack"
        extra = draw(st.sampled_from([{1: 2}, {"n": msgspec.msgpack.Ext(1, b"x")},
                                      {"n": b"raw bytes"}, {"n": float("nan")},
                                      {"n": [float("-inf")]}]))
        content = {"type": "text", "text": "x", "additional_properties": extra}
        fields["update"] = msgspec.msgpack.encode({"contents": [content]})
    elif category == "unknown_kind":
        fields["kind"] = draw(st.text(min_size=1, max_size=30).filter(
            lambda k: k not in ("update", "end", "error")))
        fields["update"] = update
        reasons = {"invalid_entry"}
    elif category == "unknown_enc":
        fields["enc"] = draw(st.text(min_size=1, max_size=10).filter(
            lambda k: k not in ("json", "msgpack")))
        fields["update"] = update
        reasons = {"bad_encoding"}
    elif category == "long_id":
        name = draw(st.sampled_from(["attempt_id", "turn_id", "step_id", "session_id"]))
        fields[name] = "i" * draw(st.integers(513, 5000))
        fields["update"] = update
        reasons = {"invalid_entry"}
    else:  # "int_out_of_range"
        doc = json.loads(update)
        doc["additional_properties"] = {"n": draw(st.sampled_from([2**64, -(2**63) - 1, 10**30]))}
        fields["update"] = js(doc)
    return Hostile(category, fields, frozenset(reasons))


CATEGORIES = ["bad_json", "not_an_object", "wrong_types", "missing_turn_key", "missing_update",
              "invalid_utf8", "deep_nesting", "huge_string", "huge_array",
              "msgpack_absurd_length", "msgpack_garbage", "msgpack_non_json", "unknown_kind",
              "unknown_enc", "long_id", "int_out_of_range"]


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_every_generated_hostile_entry_is_refused_with_its_reason(data: Any) -> None:
    """The generator's oracle (the reasons each kind may get) agrees with
    the decoder, and the detail is bounded: it never echoes the payload."""
    entry = data.draw(hostile_entries(data.draw(RIDS)))
    with pytest.raises(EntryError) as caught:
        decode_entry(entry.fields)
    assert caught.value.reason in entry.reasons, (entry.category, caught.value)
    assert caught.value.detail and len(caught.value.detail) <= MAX_DETAIL, caught.value.detail


MAX_DETAIL = 400
#: Response ids, including the characters Redis keys and our own encodings use.
RIDS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1,
               max_size=12) | st.sampled_from(["{a}", "a:b", "line\nbreak", "{x:1}:y", "}{", ":"])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["json", "msgpack"]),
       st.sampled_from([b"", b"{", b"\x81\xa8contents", b'{"contents": [']))
def test_decoder_fuzz_raw_bytes(raw: bytes, enc: str, prefix: bytes) -> None:
    """Any bytes as the update: refused with a reason and a bounded detail, or
    a record the merge can store, resume and publish."""
    fields = {"response_id": "r", "enc": enc, "update": prefix + raw}
    try:
        key, record = decode_entry(fields)
    except EntryError as error:
        assert error.reason in {"bad_encoding", "invalid_update"}
        assert error.detail and len(error.detail) <= MAX_DETAIL
        return
    turn = Turn(key)
    turn.apply(record)
    encode_response(Turn.from_bytes(turn.to_bytes()).finish())

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

import pytest

from processor.decode import EntryError, decode_entry


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

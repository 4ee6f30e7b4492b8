"""processor.wire.stream_ids: which stream ids break a shard (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.wire.stream_ids import MAX_AHEAD_MS, parse, problem, redis_ms

NOW = 1_795_000_000_000
U64 = st.integers(0, 2**64 - 1)


def test_the_last_possible_id_is_exhausted() -> None:
    last = f"{2**64 - 1}-{2**64 - 1}"
    assert problem(last, NOW) == f"ids exhausted (last id {last}): every XADD fails"


def test_an_id_far_ahead_of_the_clock_is_bad_up_to_the_margin_not() -> None:
    assert problem(f"{NOW + MAX_AHEAD_MS}-{2**64 - 1}", NOW) is None
    assert problem(f"{NOW + MAX_AHEAD_MS + 1}-0", NOW) == (
        f"ids 1 h ahead of Redis's clock (last id {NOW + MAX_AHEAD_MS + 1}-0)")
    assert problem(f"{NOW + 48 * 3_600_000}-0", NOW, max_ahead_ms=10) is not None


@given(U64, U64)
def test_parse_reads_every_id_exactly(ms: int, seq: int) -> None:
    assert parse(f"{ms}-{seq}") == (ms, seq)


@given(st.integers(0, NOW + MAX_AHEAD_MS), U64)
def test_ids_up_to_the_margin_are_fine(ms: int, seq: int) -> None:
    assert problem(f"{ms}-{seq}", NOW) is None


@pytest.mark.parametrize("text", ["", "1", "1-", "-1", "a-1", "1-2-3", "$", ">"])
def test_parse_refuses_what_is_not_an_id(text: str) -> None:
    with pytest.raises(ValueError, match="not a stream id"):
        parse(text)


def test_redis_time_in_milliseconds() -> None:
    assert redis_ms((1_795_000_000, 123_999)) == 1_795_000_000_123

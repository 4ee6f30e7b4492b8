"""A held turn's plain updates wait undecoded (processor/worker/held/holds.py ``Held``),
then are decoded together (``decode_plain``) and fed in one go
(``TurnLife.feed_updates``). Whatever the entries, the result must be what
feeding each entry as ``apply_entries`` decodes it gives, and an entry that
``apply_entries`` dead-letters must break the turn (it then spills, and the
stored path dead-letters it)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.strategies import turns
from support.turn_reference import as_read, delta, stream_fields

from processor.engine.lifecycle import Limits, TurnLife
from processor.engine.replay import Replay, render
from processor.ingest.decode import (
    MAX_DEPTH,
    EntryError,
    decode_plain,
    decode_stream_entry,
    peek_plain,
)
from processor.ingest.validate import check_update
from processor.redis_io.replies import entry_of
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace
from processor.wire.models import MAX_USAGE_COUNT, Record, Update
from processor.worker.config import WorkerConfig
from processor.worker.held.batch import Run, decode_batch
from processor.worker.held.holds import Holds

SHARD = next(iter(Namespace("deferred", 1).all()))
NOW = 1_700_000_000_000


def plain(response_id: str, text: bytes | str) -> dict[bytes, bytes]:
    raw = text.encode() if isinstance(text, str) else text
    return {b"response_id": response_id.encode(), b"update": raw}


# --------------------------------------------------------------------------- decode_plain


_typed = msgspec.json.Decoder(Update)


def _typed_ok(text: bytes) -> bool:
    """Whether the typed decoder alone takes it (no general path)."""
    try:
        check_update(_typed.decode(text))
    except (msgspec.MsgspecError, EntryError):
        return False
    return True


@settings(max_examples=80, deadline=None)
@given(turn=turns("t"))
def test_decode_plain_gives_what_decode_stream_entry_gives_each(turn: list[dict[str, Any]]) -> None:
    fields = [stream_fields(e) for e in turn]
    peeked = [(f, p) for f in fields if (p := peek_plain(f)) is not None]
    one_by_one = [decode_stream_entry(f)[1].update for f, _p in peeked]
    texts = [p[1] for _f, p in peeked]
    if not texts:  # (no plain update in the turn: nothing to decode together)
        return
    together = decode_plain(texts)
    if all(_typed_ok(t) for t in texts):
        assert together == one_by_one
    else:
        assert together is None  # (unknown fields: the general path, one by one)
    for f, (key, _text, size) in peeked:
        found_key, _record, found_size = decode_stream_entry(f)
        assert (key, size) == (found_key, found_size)


def test_decode_plain_declines_what_only_decodes_joined_or_needs_more() -> None:
    good = delta("a").encode()
    split = [b'{"contents": [{"type": "text", "text": "a', b'b"}]}']  # each invalid alone
    assert decode_plain(split) is None
    assert decode_plain([good, b'{"contents":\n []}']) is None  # a newline inside a text
    assert decode_plain([good, b""]) is None  # a blank line (decode_lines skips it)
    assert decode_plain([good + b"\n" + good, b""]) is None  # two lines, one of them blank
    assert decode_plain([good, b"{not json"]) is None
    assert decode_plain([good, b'{"contents": [], "Contents": []}']) is None  # unknown field
    dotnet = json.dumps({"Contents": [{"$type": "text", "Text": "x"}]}).encode()
    assert decode_plain([good, dotnet]) is None  # the .NET shape: the general path's
    deep = (b'{"contents": [{"type": "text", "text": "x", "additional_properties": {"a": '
            + b"[" * MAX_DEPTH + b"1" + b"]" * MAX_DEPTH + b"}}]}")
    with pytest.raises(EntryError, match="deep"):
        decode_stream_entry(plain("t", deep))
    assert decode_plain([good, deep]) is None
    (update,) = decode_plain([good]) or []
    assert update == decode_stream_entry(plain("t", good))[1].update


def test_peek_plain_takes_only_the_two_field_ascii_update() -> None:
    assert peek_plain(plain("t", delta("a"))) is not None
    assert peek_plain({**plain("t", delta("a")), b"kind": b"update"}) is None
    assert peek_plain(plain("t", delta("é").encode("utf-8").replace(b"\\u00e9", "é".encode()))) \
        is None
    assert peek_plain({b"response_id": b"t", b"kind": b"end"}) is None
    assert peek_plain(plain("", delta("a"))) is None
    assert peek_plain(plain("t", delta("a")), max_entry_bytes=20) is None


# --------------------------------------------------------------------------- feed_updates


def _no_prefix(k: int) -> tuple[int, str]:
    raise AssertionError("only a usage that does not fit asks for a prefix")


def test_feed_updates_feeds_nothing_past_a_limit_or_the_end() -> None:
    update = decode_stream_entry(plain("t", delta("a")))[1].update
    assert update is not None
    life = TurnLife(TurnKey("t"), Limits(max_turn_updates=2))
    assert life.feed_updates([update] * 3, "1-0", "3-0", 30, _no_prefix) == 0
    assert life.counts.updates == 0 and life.first_id is None
    assert life.feed_updates([update] * 2, "1-0", "2-0", 30, _no_prefix) == 2
    assert (life.counts.updates, life.bytes, life.first_id, life.last_id) == (2, 30, "1-0", "2-0")
    ended = TurnLife(TurnKey("t"))
    ended.feed("1-0", Record("end"))
    assert ended.feed_updates([update], "2-0", "2-0", 10, _no_prefix) == 0
    assert ended.counts.updates == 0
    sized = TurnLife(TurnKey("t"), Limits(max_turn_bytes=100))
    assert sized.feed_updates([update], "1-0", "1-0", 101, _no_prefix) == 0


# --------------------------------------------------------------------------- held turns


def _bad(draw: Any) -> dict[str, Any]:
    """A plain entry apply_entries dead-letters, or one it needs its general path for."""
    return draw(st.sampled_from([
        {"response_id": "t", "update": "{not json"},
        {"response_id": "t", "update": '{"contents": [{"type": "text", "text": "a'},
        {"response_id": "t", "update": '{"contents": 7}'},
        {"response_id": "t", "update": json.dumps({"Contents": [{"$type": "text", "Text": "x"}]})},
        {"response_id": "t", "update": '{"contents":\n [{"type": "text", "text": "nl"}]}'},
        {"response_id": "t", "update": "{not json", "attempt_id": ""},
    ]))


def _huge_usage(draw: Any) -> dict[str, Any]:
    """A plain update whose usage, twice, passes the turn's bound on sums."""
    n = MAX_USAGE_COUNT - draw(st.integers(0, 60))
    content = {"type": "usage", "usage_details": {"input_token_count": n}}
    return {"response_id": "t", "update": json.dumps({"contents": [content]})}


@st.composite
def held_turn(draw: Any) -> tuple[list[dict[bytes, bytes]], Limits, list[int]]:
    """A random turn's entries (some made bad or odd, some with a usage that
    the turn's sum cannot take), limits that it may cross, and the batch
    sizes it is read in."""
    entries = draw(turns("t"))
    for _ in range(draw(st.integers(0, 2))):
        entries.insert(draw(st.integers(0, len(entries))), _bad(draw))
    if draw(st.booleans()):
        for _ in range(2):
            entries.insert(draw(st.integers(0, len(entries) - 1)), _huge_usage(draw))
    if draw(st.booleans()):
        entries.append({"response_id": "t", "update": delta("late")})  # after the end
    limits = Limits(max_turn_updates=draw(st.integers(1, 60)),
                    max_turn_bytes=draw(st.sampled_from([300, 2_000, 64 << 20])))
    cuts = draw(st.lists(st.integers(1, 12), min_size=1, max_size=8))
    return [stream_fields(e) for e in entries], limits, cuts


def _batches(entries: list[Any], cuts: list[int]) -> list[list[Any]]:
    out, i, c = [], 0, 0
    while i < len(entries):
        n = cuts[c % len(cuts)]
        out.append(entries[i:i + n])
        i, c = i + n, c + 1
    return out


class Reference:
    """Each entry fed as apply_entries decodes it (the old, eager way), and
    whether a plain one was dead-lettered (the held turn must break)."""

    def __init__(self, limits: Limits) -> None:
        self.replay = Replay(TurnLife(TurnKey("t"), limits))
        self.limits = limits
        self.breaks = False

    def feed(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        for entry_id, fields in entries:
            try:
                _key, record, size = decode_stream_entry(
                    fields, max_entry_bytes=self.limits.max_entry_bytes)
            except EntryError:
                plain = peek_plain(fields, self.limits.max_entry_bytes) is not None
                self.breaks = self.breaks or plain
                continue
            if not self.breaks:
                self.replay.feed(entry_id.decode(), record, size)


@settings(max_examples=150, deadline=None)
@given(case=held_turn())
def test_a_held_turn_with_waiting_updates_is_the_turn_fed_entry_by_entry(
    case: tuple[list[dict[bytes, bytes]], Limits, list[int]],
) -> None:
    fields, limits, cuts = case
    key = TurnKey("t")
    entries = as_read([(f"{i}-0".encode(), f) for i, f in enumerate(fields, 1)])
    holds = Holds(limits, max_turns=10, max_bytes=1 << 30)
    holds.opened({key: True}, "5", 0.0)  # open_turns: held from its first entry
    options = WorkerConfig(group="g", limits=limits)
    kept = []  # what decode_batch does not leave to apply_entries
    reference = Reference(limits)
    for batch in _batches(entries, cuts):
        grouped = decode_batch(SHARD, batch, options, NOW).held
        assert grouped is not None
        kept += [raw for raw in batch if entry_of(raw) not in grouped.failed]
        routed = holds.route(batch, grouped)
        reference.feed([entry_of(raw) for raw in batch])
        held = holds.turns[key]
        assert (key in routed.broken) == (held.broken and key in routed.held)
        if not held.broken:  # it ends (is published) in the batch it would have
            outcome = reference.replay.life.outcome
            if held.ended != (outcome is not None):
                # But a usage sum past the bound, which only folding finds:
                # its waiting updates are fed later (an entry, the end, a spill).
                assert held.pending and not held.ended and outcome is not None
                assert outcome.error is not None and "usage" in outcome.error.message
    held = holds.turns[key]
    caught_up = held.catch_up()
    assert held.broken == reference.breaks and caught_up == (not reference.breaks)
    assert held.entries == kept  # all of them, as read, for a spill
    if reference.breaks:
        return  # spilled: the stored path takes every entry, as before
    assert not held.pending
    mine = render(key, held.replay, held.turn_hash(), "closing", NOW)
    theirs = render(key, reference.replay, held.turn_hash(), "closing", NOW)
    assert mine == theirs
    assert held.replay.late == reference.replay.late
    assert held.replay.ending == reference.replay.ending


def test_updates_wait_until_the_end_and_are_fed_then() -> None:
    holds = Holds(Limits(), max_turns=10, max_bytes=1 << 20)
    batch = as_read([(f"{i}-0".encode(), plain("t", delta(str(i)))) for i in range(1, 4)])
    grouped = decode_batch(SHARD, batch, WorkerConfig(group="g"), NOW).held
    assert grouped is not None
    (run,) = grouped.turns[TurnKey("t")]  # one run of three plain updates
    assert isinstance(run, Run) and run.ids == ["1-0", "2-0", "3-0"]
    holds.opened(dict.fromkeys(holds.to_open(grouped), True), "5", 0.0)
    holds.route(batch, grouped)
    held = holds.turns[TurnKey("t")]
    assert len(held.pending) == 3 and held.replay.life.counts.updates == 0
    end = as_read([(b"4-0", {b"response_id": b"t", b"kind": b"end"})])
    ending = decode_batch(SHARD, end, WorkerConfig(group="g"), NOW).held
    assert ending is not None
    holds.route(end, ending)
    assert held.pending == [] and held.ended
    assert held.replay.life.counts.updates == 3 and held.replay.ending == "4-0"
    assert held.replay.life.response().messages[0].contents[0].text == "123"

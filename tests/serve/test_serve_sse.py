"""Event-stream framing (processor/serve/sse.py): what the server frames, a
reader that follows the HTML standard's rules reads back, however the bytes
are cut into chunks; and the seq order a stream keeps (processor/client/turns.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.client.turns import Cursor, LiveEvent, parse_after
from processor.serve import sse

PROPERTY = settings(max_examples=150, deadline=None)
ids = st.text(alphabet=st.characters(codec="utf-8", blacklist_characters="\r\n\0"), max_size=12)


def _read(stream: bytes, cuts: list[int]) -> list[sse.Event | sse.Comment]:
    parser = sse.Parser()
    out: list[sse.Event | sse.Comment] = []
    start = 0
    for cut in [*sorted(set(cuts)), len(stream)]:
        out += parser.feed(stream[start:cut])
        start = cut
    return out


@PROPERTY
@given(st.lists(st.tuples(st.text(min_size=0, max_size=40), st.one_of(st.none(), ids),
                          st.booleans(), st.booleans()), max_size=8), st.data())
def test_framed_events_read_back_whatever_the_chunks(events, data) -> None:
    stream = b"".join(
        sse.comment(text) if is_comment
        else sse.frame(text.encode() if as_bytes else text, id=event_id)
        for text, event_id, is_comment, as_bytes in events)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=10))
    got = _read(stream, cuts)
    expected: list[sse.Event | sse.Comment] = []
    last = ""
    for text, event_id, is_comment, _as_bytes in events:
        lines = re.split(r"\r\n|\r|\n", text)
        if is_comment:
            expected += [sse.Comment(line) for line in lines]
            continue
        if event_id is not None:
            last = event_id
        expected.append(sse.Event("\n".join(lines), "message", event_id, last))
    assert got == expected


def test_a_crlf_cut_between_chunks_is_one_line_break() -> None:
    parser = sse.Parser()
    assert parser.feed(b"id: 4\r") == []
    assert parser.feed(b"\ndata: x\r") == []
    assert parser.feed(b"\n\r\n") == [sse.Event("x", "message", "4", "4")]


def test_fields_follow_the_standard() -> None:
    parser = sse.Parser()
    got = parser.feed(b"\xef\xbb\xbfretry: 250\nevent: e\ndata\ndata:no space\nid: a\0b\n\n"
                      b"data: two\n\n")
    assert got == [sse.Event("\nno space", "e", None, ""), sse.Event("two", "message", None, "")]
    assert parser.retry_ms == 250
    assert sse.retry(1000) == b"retry: 1000\n"
    # neither a retry nor a comment dispatches an event, also for a reader
    # that dispatches on every blank line (@microsoft/fetch-event-source)
    assert b"\n\n" not in sse.retry(1000) + sse.comment("ping") + sse.comment("a\nb")


def test_text_utf8_cannot_hold_is_replaced() -> None:
    assert sse.frame("a\ud800b", id="\udfff") == "id: \ufffd\ndata: a\ufffdb\n\n".encode()


def test_ids_and_names_cannot_break_the_framing() -> None:
    for bad in ("1\n2", "1\r", "a\0"):
        with pytest.raises(ValueError):
            sse.frame("x", id=bad)
        with pytest.raises(ValueError):
            sse.frame("x", event=bad)


def _event(seq: int, kind: str = "synthesis.chunk") -> LiveEvent:
    return LiveEvent(seq, kind, b"{}")


@PROPERTY
@given(st.integers(min_value=-1, max_value=20),
       st.lists(st.tuples(st.integers(min_value=0, max_value=30), st.booleans()), max_size=40))
def test_a_cursor_sends_each_seq_once_in_order_and_nothing_after_the_end(after, arrivals) -> None:
    cursor = Cursor(after)
    sent = [seq for seq, terminal in arrivals
            if cursor.take(_event(seq, "synthesis" if terminal else "synthesis.chunk"))]
    assert sent == sorted(set(sent)) and all(seq > after for seq in sent)
    terminals = [seq for seq, terminal in arrivals if terminal]
    if cursor.ended:
        assert sent[-1] in terminals
    assert cursor.last == (sent[-1] if sent else after)
    assert cursor.resume_id == (None if cursor.last < 0 else str(cursor.last))


def test_a_snapshot_moves_the_cursor() -> None:
    cursor = Cursor()
    cursor.jump(7)
    assert not cursor.take(_event(7)) and cursor.take(_event(8)) and cursor.resume_id == "8"


def test_resume_ids_are_whole_numbers() -> None:
    assert parse_after(None) is None and parse_after("") is None
    assert parse_after("0") == 0 and parse_after("42") == 42
    for bad in ("-1", "x", "1.5", " 3", "٣", "9" * 19):
        with pytest.raises(ValueError):
            parse_after(bad)

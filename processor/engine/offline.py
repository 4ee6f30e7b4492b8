"""``processor merge``: the merge of a file of input entries, without Redis.

The same decoding, lifecycle and merge code as the worker; the file's line
order is the arrival order. A turn still open at the end of the file ends as
``turn_timeout`` (docs/contract.md §8).

The output is a function of the file alone, so the same file always prints
the same bytes: event ``ts`` and ``meta`` timings come from the entry ids
(``<ms>-<seq>``, as a stream entry id). A line without one takes the time of
the last entry that had one (0 before any); the wall clock is never read
unless the caller passes ``clock_ms``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from processor.engine import events as ev
from processor.engine.lifecycle import LATE, MERGED, Limits, TurnLife, finish, late_detail
from processor.ingest.decode import EntryError, decode_entry, entry_size, turn_key
from processor.wire.cancels import reason_of
from processor.wire.ids import TurnKey
from processor.wire.outputs import Event, TurnResult

# Fields stay raw JSON: ``update`` then travels to the decoder as JSON text,
# exactly as over Redis, and one bad field cannot break reading the others.
_line_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_value_decoder = msgspec.json.Decoder()


class DeadLetter(msgspec.Struct):
    """An entry ``processor merge`` could not merge (the worker's DLQ entry)."""

    line: int
    source_id: str
    reason: str
    detail: str
    response_id: str | None = None


class _Open(msgspec.Struct):
    life: TurnLife
    events: list[Event]
    started_ms: int
    finished_ms: int | None = None


class OfflineMerge:
    """Feed entries in arrival order, then ``results``."""

    def __init__(
        self, *, limits: Limits | None = None, progress: bool = False, clock_ms: Any = None
    ) -> None:
        self.limits = limits or Limits()
        self.progress = progress
        self._clock_ms = clock_ms
        self._last_ms = 0
        self.turns: dict[TurnKey, _Open] = {}
        self.cancelled: dict[str, str | None] = {}  # response id -> its cancel's reason
        self.dead: list[DeadLetter] = []
        # Dead letters of turns not started yet: counted once they start.
        self._early_dlq: dict[TurnKey, int] = {}

    def feed_line(self, line_no: int, text: str | bytes) -> None:
        """One JSONL line: an entry object, or a ``cancel`` line."""
        source_id = f"line-{line_no}"
        try:
            raw = _line_decoder.decode(text)
        except msgspec.ValidationError:
            self._dead(line_no, source_id, "invalid_entry", "line is not a JSON object")
            return
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            self._dead(line_no, source_id, "bad_encoding", f"line is not valid JSON: {exc}")
            return
        except RecursionError:
            self._dead(line_no, source_id, "invalid_entry", "line is nested too deeply to read")
            return
        fields: dict[str, Any] = {}
        for name, value in raw.items():
            try:
                fields[name] = _line_field(name, value)
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                detail = f"field {name!r} is not valid UTF-8 JSON: {exc}"
                self._dead(line_no, source_id, "bad_encoding", detail)
                return
            except RecursionError:
                detail = f"field {name!r} is nested too deeply"
                self._dead(line_no, source_id, "invalid_entry", detail)
                return
        self.feed(line_no, fields)

    def feed(self, line_no: int, fields: dict[str, Any]) -> None:
        source_id = str(fields.pop("id", None) or f"0-{line_no}")
        if fields.get("kind") == "cancel":
            self._cancel(line_no, source_id, fields)
            return
        try:
            key, record = decode_entry(fields, max_entry_bytes=self.limits.max_entry_bytes)
        except EntryError as exc:
            rid = exc.turn.response_id if exc.turn else None
            self._dead(line_no, source_id, exc.reason, exc.detail, rid)
            if exc.turn in self.turns:
                self.turns[exc.turn].life.counts.dlq += 1
            elif exc.turn is not None:
                self._early_dlq[exc.turn] = self._early_dlq.get(exc.turn, 0) + 1
            return
        ts = self._ts(source_id)
        turn = self._turn(key, ts)
        life = turn.life
        was_open = life.outcome is None
        verdict = life.feed(source_id, record, entry_size(fields))
        if verdict in LATE:
            detail = late_detail(verdict, life.outcome)
            self._dead(line_no, source_id, verdict.value, detail, key.response_id)
        if verdict is MERGED and self.progress:
            turn.events.extend(ev.progress(key, life.turn.state.ids, record, ts))
        if was_open and life.outcome is not None:
            turn.finished_ms = ts

    def _turn(self, key: TurnKey, ts: int) -> _Open:
        turn = self.turns.get(key)
        if turn is None:
            life = TurnLife(key, self.limits)
            life.counts.dlq += self._early_dlq.pop(key, 0)
            turn = self.turns[key] = _Open(life, [], ts)
            if key.response_id in self.cancelled:
                life.cancel(self.cancelled[key.response_id])  # a cancel that arrives first wins
                turn.finished_ms = ts
        return turn

    def _cancel(self, line_no: int, source_id: str, fields: dict[str, Any]) -> None:
        try:
            response_id = turn_key(fields).response_id
        except EntryError as exc:
            self._dead(line_no, source_id, exc.reason, exc.detail)
            return
        reason = fields.get("reason")
        if reason is not None and not isinstance(reason, str):
            self._dead(line_no, source_id, "invalid_entry",
                       f"a cancel's reason is text, not {type(reason).__name__}", response_id)
            return
        # (as a worker reads a cancel key: its first 1 KiB, as text)
        self.cancelled.setdefault(response_id, reason_of(reason))
        ts = self._ts(source_id)
        for key, turn in self.turns.items():
            if key.response_id == response_id and turn.life.cancel(self.cancelled[response_id]):
                turn.finished_ms = ts

    def _ts(self, source_id: str) -> int:
        head = source_id.partition("-")[0]
        if head.isdigit() and int(head) > 0:
            self._last_ms = int(head)
            return self._last_ms
        return self._now()

    def _now(self) -> int:
        return self._clock_ms() if self._clock_ms else self._last_ms

    def _dead(
        self, line_no: int, source_id: str, reason: str, detail: str, rid: str | None = None
    ) -> None:
        self.dead.append(DeadLetter(line_no, source_id, reason, detail, rid))

    def results(self) -> Iterator[TurnResult]:
        """One result per started turn, in order of first appearance."""
        for turn in self.turns.values():
            life = turn.life
            if life.expire():
                turn.finished_ms = self._now()
            yield _result(turn)


def _line_field(name: str, raw: msgspec.Raw) -> Any:
    """A field of a ``processor merge`` line. ``update`` stays JSON text (an
    object's own text, or the text a JSON string holds) for the decoder."""
    if name != "update":
        return _value_decoder.decode(raw)
    text = bytes(raw)
    if text.startswith(b'"'):
        return _value_decoder.decode(text)
    return text


def _result(turn: _Open) -> TurnResult:
    life = turn.life
    key = life.key
    # (the terminal event's seq: after the started event and the progress events)
    done = finish(life, turn.started_ms, turn.finished_ms, 1 + len(turn.events))
    events: list[Event] = [ev.started(key, life.turn.state.ids, turn.started_ms)]
    for seq, event in enumerate(turn.events, start=1):
        event.seq = seq
        events.append(event)
    events.append(done.terminal)
    return TurnResult(
        response_id=key.response_id,
        attempt_id=key.attempt_id or None,
        status=done.outcome.status,
        response=done.response,
        meta=done.meta,
        events=events,
    )


def merge_lines(
    lines: Iterable[str | bytes], *, limits: Limits | None = None, progress: bool = False
) -> OfflineMerge:
    """Merge JSONL lines (blank lines are skipped)."""
    merge = OfflineMerge(limits=limits, progress=progress)
    for line_no, line in enumerate(lines, start=1):
        if line.strip():
            merge.feed_line(line_no, line)
    return merge

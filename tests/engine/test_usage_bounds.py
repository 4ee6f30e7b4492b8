"""Usage counts stay integers every JSON reader holds (models.MAX_USAGE_COUNT):
an update past the bound is ``invalid_update`` (tests/support/bad_entries.py), and
an update that would take a turn's sum of a counter past it is refused by
the merge, changing nothing, and ends the turn as ``turn_limit``, the same
whichever way the turn is fed: one entry at a time, waiting plain updates
fed together, resumed from a compacted snapshot, or ``processor merge``."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from support.merging import decoded, merged, update_entry

from processor.engine.compaction import plan_compaction
from processor.engine.lifecycle import TURN_LIMIT, Limits, TurnLife
from processor.engine.merge import Turn, UsageOverflow
from processor.engine.offline import merge_lines
from processor.engine.records import encode_stored
from processor.engine.replay import replay
from processor.ingest.decode import decode_stream_entry
from processor.wire.ids import TurnKey
from processor.wire.models import MAX_USAGE_COUNT

RID = "turn-usage"


def usage(n: int, *, text: str | None = None, replace: bool = False, inner: str | None = None,
          name: str = "input_token_count") -> dict[str, Any]:
    """An update entry with a usage content of ``n`` (and a text delta)."""
    content: dict[str, Any] = {"type": "usage", "usage_details": {name: n}}
    if replace:
        content["merge_mode"] = "replace"
    contents = [content] if text is None else [{"type": "text", "text": text}, content]
    fields: dict[str, Any] = {"contents": contents, "message_id": "m1"}
    if inner is not None:
        fields["response_id"] = inner
    return update_entry(RID, **fields)


def test_the_bound_is_what_every_json_reader_holds() -> None:
    assert MAX_USAGE_COUNT == 2**53 - 1
    assert float(MAX_USAGE_COUNT) == MAX_USAGE_COUNT
    assert float(MAX_USAGE_COUNT + 1) == float(MAX_USAGE_COUNT + 2)  # no longer exact


def test_a_sum_past_the_bound_is_refused_and_changes_nothing() -> None:
    key, records = decoded([
        usage(MAX_USAGE_COUNT - 5, text="a", inner="A"),
        usage(5, inner="B"),  # exactly the bound: fine
        usage(1, text="b", inner="C"),  # one more, in a third agent: refused
    ])
    turn = merged(key, records[:2])
    before = msgspec.msgpack.encode(turn.state)
    with pytest.raises(UsageOverflow) as info:
        turn.apply(records[2])
    assert (info.value.counter, info.value.total) == ("input_token_count", MAX_USAGE_COUNT + 1)
    assert msgspec.msgpack.encode(turn.state) == before
    assert turn.finish().usage_details == {"input_token_count": MAX_USAGE_COUNT}


def test_a_replace_correction_counts_what_it_leaves() -> None:
    # A replace lowers its agent's total: room for more afterwards.
    key, records = decoded([
        usage(MAX_USAGE_COUNT, inner="A"),
        usage(10, replace=True, inner="A"),
        usage(MAX_USAGE_COUNT - 10, inner="B"),
    ])
    assert merged(key, records).finish().usage_details == {"input_token_count": MAX_USAGE_COUNT}
    # A replace that itself takes the sum past the bound is refused.
    key, records = decoded([usage(MAX_USAGE_COUNT, inner="A"), usage(1, replace=True, inner="B")])
    turn = merged(key, records[:1])
    assert turn.usage_overflow(records[1].update) is not None  # type: ignore[arg-type]
    with pytest.raises(UsageOverflow):
        turn.apply(records[1])


def test_other_counters_and_turns_are_unaffected() -> None:
    key, records = decoded([usage(MAX_USAGE_COUNT), usage(MAX_USAGE_COUNT, name="output")])
    assert merged(key, records).finish().usage_details == {
        "input_token_count": MAX_USAGE_COUNT, "output": MAX_USAGE_COUNT}


def _overflowing_turn() -> list[dict[str, Any]]:
    return [
        usage(MAX_USAGE_COUNT, text="a"),
        usage(1, text="b"),  # crosses: the turn ends here
        update_entry(RID, contents=[{"type": "text", "text": "c"}], message_id="m1"),
        {"response_id": RID, "kind": "end"},
    ]


def test_processor_merge_ends_the_turn_as_turn_limit_and_dead_letters_the_entry() -> None:
    merge = merge_lines([json.dumps(e) for e in _overflowing_turn()])
    (result,) = merge.results()
    assert result.status == "error"
    assert result.meta.error is not None and result.meta.error.code == "turn_limit"
    message = result.meta.error.message
    assert message == ("turn exceeds its limits (usage 'input_token_count' would sum to "
                       f"{MAX_USAGE_COUNT + 1}, above {MAX_USAGE_COUNT})")
    assert result.response.usage_details == {"input_token_count": MAX_USAGE_COUNT}
    assert [c.text for m in result.response.messages for c in m.contents] == ["a"]
    assert (result.meta.counts.updates, result.meta.counts.dlq) == (1, 3)
    assert [(d.line, d.reason, d.detail) for d in merge.dead] == [
        (2, "turn_limit", message),
        (3, "turn_closed", "the turn had already ended"),
        (4, "turn_closed", "the turn had already ended"),
    ]


def _plain(entry: dict[str, Any]) -> dict[bytes, bytes]:
    return {b"response_id": RID.encode(), b"update": json.dumps(entry["update"]).encode()}


@pytest.mark.parametrize("cut", [0, 1, 2, 3])
def test_waiting_updates_fed_together_stop_where_the_usage_does_not_fit(cut: int) -> None:
    # feed_updates of plain updates, one of which crosses the usage bound:
    # the ones before it are fed (with their bytes and ids), the rest are
    # left to feed one by one; the turn then is the turn fed entry by entry.
    entries = [update_entry(RID, contents=[{"type": "text", "text": str(i)}], message_id="m1")
               for i in range(4)]
    entries.insert(cut, usage(MAX_USAGE_COUNT))
    entries.insert(cut + 1, usage(1, text="x"))
    fields = [_plain(e) for e in entries]
    decoded_entries = [decode_stream_entry(f) for f in fields]
    ids = [f"{i}-0" for i in range(1, len(fields) + 1)]
    one_by_one = TurnLife(TurnKey(RID))
    verdicts = [one_by_one.feed(i, record, size)
                for i, (_key, record, size) in zip(ids, decoded_entries, strict=True)]
    assert verdicts.count(TURN_LIMIT) == 1

    together = TurnLife(TurnKey(RID))
    updates = [record.update for _key, record, _size in decoded_entries]
    sizes = [size for _key, _record, size in decoded_entries]
    asked: list[int] = []

    def prefix(k: int) -> tuple[int, str]:
        asked.append(k)
        return sum(sizes[:k]), ids[k - 1]

    fed = together.feed_updates(updates, ids[0], ids[-1], sum(sizes), prefix)  # type: ignore[arg-type]
    assert fed == cut + 1 and asked == ([cut + 1] if fed else [])
    for i in range(fed, len(ids)):
        together.feed(ids[i], decoded_entries[i][1], sizes[i])
    assert together.counts == one_by_one.counts
    assert (together.bytes, together.first_id, together.last_id) == (
        one_by_one.bytes, one_by_one.first_id, one_by_one.last_id)
    assert together.outcome == one_by_one.outcome
    assert together.response() == one_by_one.response()


def test_a_compaction_stops_before_the_update_that_crosses() -> None:
    # A snapshot never holds an outcome: the crossing update stays a record,
    # and the replay of snapshot + records is the replay of every record.
    entries = _overflowing_turn()
    fields = [_plain(e) if "update" in e else {k.encode(): v.encode() for k, v in e.items()}
              for e in entries]
    recs: dict[Any, Any] = {}
    for i, f in enumerate(fields, start=1):
        _key, record, size = decode_stream_entry(f)
        recs[f"{i}-0"] = encode_stored(size, record)
    key, limits = TurnKey(RID), Limits()
    plan = plan_compaction(key, recs, None, limits)
    assert plan is not None and plan.folded == ["1-0"]
    compacted = {k: v for k, v in recs.items() if k not in plan.folded}
    compacted["state"] = plan.state
    whole, resumed = replay(key, dict(recs), limits), replay(key, compacted, limits)
    assert resumed.life.outcome == whole.life.outcome
    assert resumed.life.outcome is not None and resumed.life.outcome.error is not None
    assert resumed.life.outcome.error.code == "turn_limit"
    assert resumed.late == whole.late and resumed.ending == whole.ending == "2-0"
    assert resumed.life.response() == whole.life.response()


def test_a_state_summed_before_the_bound_existed_still_loads_and_is_checked() -> None:
    # A stored state whose usage went past the bound (written before it):
    # it renders as it was; more usage of that agent, or of that counter, is
    # refused; another agent's other counters are not.
    turn = Turn(TurnKey(RID))
    turn.state.block_usage[""] = {"input_token_count": MAX_USAGE_COUNT + 7}
    resumed = Turn.from_bytes(turn.to_bytes())
    assert resumed.finish().usage_details == {"input_token_count": MAX_USAGE_COUNT + 7}
    _key, records = decoded([usage(0, name="other"), usage(0, inner="B"),
                             usage(0, name="other", inner="B")])
    for refused in records[:2]:
        with pytest.raises(UsageOverflow):
            resumed.apply(refused)
    resumed.apply(records[2])

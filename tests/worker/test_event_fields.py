"""The worker's cheap ways of making the events it sends to its scripts
(built from a blank event, packed without decoding the JSON) give the same
bytes as the plain way (an event built from keywords, ``events.event_fields``):
what reaches Redis is unchanged, only cheaper to make."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from processor.engine import events as ev
from processor.engine.events import event_fields
from processor.engine.live import _BLANK
from processor.engine.replay import Settled
from processor.scripts.held_calls import HeldOutcome, build_finalise_held
from processor.scripts.live_calls import LiveTurn, build_publish_live
from processor.scripts.stored_calls import _started_fields
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace
from processor.wire.outputs import SynthesisChunk, SynthesisStarted
from processor.worker.config import WorkerConfig

_pack = msgspec.msgpack.Encoder()
_ids = st.text(min_size=1, max_size=40)
_keys = st.builds(TurnKey, _ids, st.one_of(st.just(""), _ids))


@given(_keys, st.integers(min_value=0, max_value=2**53))
def test_started_from_the_blank_is_the_keyword_built_event(key: TurnKey, ts: int) -> None:
    made = ev.started(key, {}, ts)
    built = SynthesisStarted(**ev._base(key, {}, 0, ts))
    assert made == built
    assert msgspec.json.encode(made) == msgspec.json.encode(built)
    assert _pack.encode(_started_fields(key, made)) == _pack.encode(event_fields(key, built))


@given(_keys, st.lists(st.text(max_size=30), max_size=4))
def test_finalise_held_rows_spell_each_events_fields(key: TurnKey, deltas: list[str]) -> None:
    """A held turn's last events reach ``finalise_held`` as ``cut_events``
    parts and the turn's ids, from which ``includes/xadd_events`` makes the
    fields ``event_fields`` gives each event (type, response_id,
    synthesis_id, attempt_id if any, event), in that order."""
    chunks = [msgspec.structs.replace(
        _BLANK[SynthesisChunk], synthesis_id=key.synthesis_id(), response_id=key.response_id,
        message_id="m", delta=delta) for delta in deltas]
    outcome = HeldOutcome(key, ["1-0"], [], Settled("completed", b"", b""), "", chunks, 2, 0)
    call = build_finalise_held(Namespace("n", 1).shard(0), [outcome], WorkerConfig(), "c", "s")
    [row] = msgspec.msgpack.decode(call.args[8])
    parts, spoken, rid, sid, attempt = row[9:]
    assert spoken == 2 and len(parts) == 3 * len(chunks)
    for i, chunk in enumerate(chunks):
        kind, head, tail = parts[3 * i: 3 * i + 3]
        made = ["type", kind, "response_id", rid, "synthesis_id", sid,
                *(["attempt_id", attempt] if attempt else []), "event", head + "0" + tail]
        assert made == event_fields(key, chunk)


@given(_keys, st.lists(st.text(max_size=30), max_size=4))
def test_publish_live_arguments_spell_each_event_whole(key: TurnKey, deltas: list[str]) -> None:
    """``build_publish_live`` hands each event over cut around its seq (the
    script joins the parts with the seq it takes): the cut parts and a 0 are
    the event's JSON, even when its text holds what the cut looks for."""
    chunks = [msgspec.structs.replace(
        _BLANK[SynthesisChunk], synthesis_id=key.synthesis_id(), response_id=key.response_id,
        message_id='"seq":0,', delta=delta) for delta in deltas]
    call = build_publish_live(Namespace("n", 1).shard(0), [LiveTurn(key, chunks, b"[]", 2, True)],
                              WorkerConfig(), "s")
    turn = msgspec.msgpack.decode(call.args[4])
    assert turn[:9] == [key.encode(), "s 2", "s 3", 1, "[]", key.response_id,
                        key.synthesis_id(), key.attempt_id, len(chunks)]
    parts = turn[9:]
    assert len(parts) == 3 * len(chunks)
    for i, chunk in enumerate(chunks):
        kind, head, tail = parts[3 * i: 3 * i + 3]
        assert kind == ev.event_type(chunk)
        assert (head + "0" + tail).encode() == ev.encode_event(chunk)


def test_publish_live_cuts_every_kind_of_live_event() -> None:
    """Every kind of event live progress says has the seq the cut looks for."""
    key = TurnKey("r", "a")
    events = [msgspec.structs.replace(blank, synthesis_id=key.synthesis_id(),
                                      response_id=key.response_id) for blank in _BLANK.values()]
    call = build_publish_live(Namespace("n", 1).shard(0), [LiveTurn(key, events, b"[]", 0, False)],
                              WorkerConfig(), "s")
    parts = msgspec.msgpack.decode(call.args[4])[9:]
    assert len(parts) == 3 * len(events) == 15
    for i, event in enumerate(events):
        kind, head, tail = parts[3 * i: 3 * i + 3]
        assert (kind, (head + "0" + tail).encode()) == (ev.event_type(event),
                                                         ev.encode_event(event))

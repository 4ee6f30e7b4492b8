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
from processor.scripts.calls import live_fields
from processor.scripts.live_calls import _pack
from processor.scripts.stored_calls import _started_fields
from processor.wire.ids import TurnKey
from processor.wire.outputs import SynthesisChunk, SynthesisStarted

_ids = st.text(min_size=1, max_size=40)
_keys = st.builds(TurnKey, _ids, st.one_of(st.just(""), _ids))


@given(_keys, st.integers(min_value=0, max_value=2**53))
def test_started_from_the_blank_is_the_keyword_built_event(key: TurnKey, ts: int) -> None:
    made = ev.started(key, {}, ts)
    built = SynthesisStarted(**ev._base(key, {}, 0, ts))
    assert made == built
    assert msgspec.json.encode(made) == msgspec.json.encode(built)
    assert _pack.encode(_started_fields(key, made)) == _pack.encode(event_fields(key, built))


@given(_keys, st.text(max_size=30))
def test_live_fields_pack_as_event_fields(key: TurnKey, delta: str) -> None:
    chunk = msgspec.structs.replace(
        _BLANK[SynthesisChunk], synthesis_id=key.synthesis_id(), response_id=key.response_id,
        message_id="m", delta=delta)
    assert _pack.encode(live_fields(key, [chunk])) == _pack.encode([event_fields(key, chunk)])

"""Live progress of a running turn, rendered only when it must be.

Pure. ``live_progress`` gives what ``live_events`` gives for the turn's
merge (``processor.engine.merge.Turn.finish``): the same events, and a
``Shown`` equal to its own but for ``layout``. ``live_events`` renders the
whole merge and walks every message, so a turn's publish costs as much as
its size: a long turn of many messages (agents handing off, tool calls and
results) pays that again at every publish, most of which only appended a
few words to one message.

So after each render the turn tracks what only grows it (``Turn.track``):
the text, reasoning and call argument pieces that ``Turn.fold``'s usual
path appends to a keyed message's last content. Anything else (a new
message or content, a snapshot, a message named late, an id-less run)
sets ``Turn.mark`` to 0. While the mark is the one of the render that made
``shown`` (``Layout``), the merge differs from that render's only by those
pieces, each at the end of its message's text, reasoning or last call's
arguments: a message's last content is last in the merged message too (an
id-less run folds in *before* it). Its events are one chunk per grown
message, in merged order, with what that render found of it (``Placed``),
when what the reader was told of that text is not empty (an empty one
would become a message with events, which moves other messages'
``previous_message_id``). Nothing else is said: no message came, went or
changed its calls' places, results, names or last kind of content (the
step). Any doubt renders.

``tests/engine/test_live_growth.py`` checks the two ways against each
other over random turns cut into random batches.
"""

from __future__ import annotations

import itertools
from operator import itemgetter

import msgspec

from processor.engine.live import Made, live_events
from processor.engine.merge import Turn
from processor.engine.shown import Layout, Placed, Shown
from processor.wire.ids import TurnKey
from processor.wire.models import Content
from processor.wire.outputs import Event, ReasoningChunk, SynthesisChunk, ToolCallChunk

#: A render's mark (``Turn.track``): unique in the process, so that a
#: ``Shown`` handed to another ``Turn`` never matches its mark.
_marks = itertools.count(1)


def live_progress(
    key: TurnKey, ids: dict[str, str], shown: Shown, turn: Turn, ts: int
) -> tuple[list[Event], Shown]:
    """``live_events(key, ids, shown, turn.finish(), ts)``, without the
    render while the turn only grew since ``shown`` was made; the turn then
    tracks what grows it until the next call."""
    grown = _grown(key, ids, shown, turn, ts)
    mark = next(_marks)
    if grown is not None:
        events, after = grown
        turn.compact()  # (its pending pieces joined, as a render joins them: memory stays flat)
        layout = shown.layout
        assert layout is not None  # (_grown needs it)
        after.layout = Layout(mark, layout.placed, False)
    else:
        events, after = live_events(key, ids, shown, turn.finish(), ts, mark)
    turn.track(mark)
    return events, after


def _grown(
    key: TurnKey, ids: dict[str, str], shown: Shown, turn: Turn, ts: int
) -> tuple[list[Event], Shown] | None:
    """The events and ``Shown`` of a turn that only grew since ``shown``'s
    render, or None (render it)."""
    layout, grown = shown.layout, turn.grown
    if layout is None or grown is None or layout.gone or turn.mark != layout.mark:
        return None
    segments, placed = turn.state.segments, layout.placed
    texts, reasoning, calls = shown.texts, shown.reasoning, shown.calls
    # (place, id, its grown content, delta, what the render found of it)
    found: list[tuple[int, str, Content, str, Placed]] = []
    for index, pieces in grown.items():
        segment = segments[index]
        mid = segment.message_id
        where = placed.get(mid) if mid is not None else None
        if mid is None or where is None:
            return None
        content = segment.contents[-1]  # (text, text_reasoning or function_call)
        if content.type == "function_call":
            # (Its last call, whose arguments a render always records; never
            # stale after one: it says every call in the merge anew there.)
            if (mid, where.calls - 1) not in calls:
                return None
        elif not (texts if content.type == "text" else reasoning).get(mid):
            return None
        found.append((where.position, mid, content, "".join(pieces), where))
    if not found:
        return [], msgspec.structs.replace(shown)
    found.sort(key=itemgetter(0))  # (by place in the merged order)
    made = Made(key, ids, ts)
    events: list[Event] = []
    texts, reasoning, calls = dict(texts), dict(reasoning), dict(calls)
    for _, mid, content, delta, where in found:
        if not delta:
            continue
        chunk: SynthesisChunk | ReasoningChunk | ToolCallChunk
        if content.type == "text":
            texts[mid] += delta
            chunk = made.proto(SynthesisChunk)
        elif content.type == "text_reasoning":
            reasoning[mid] += delta
            chunk = made.proto(ReasoningChunk)
        else:
            call = (mid, where.calls - 1)
            calls[call] += delta
            chunk = msgspec.structs.replace(made.proto(ToolCallChunk), index=call[1],
                                            call_id=content.call_id, name=content.name)
        events.append(msgspec.structs.replace(
            chunk, message_id=mid, agent_id=where.agent_id, author_name=where.author_name,
            delta=delta, replace=False, role=where.role, previous_message_id=where.previous))
    return events, msgspec.structs.replace(shown, texts=texts, reasoning=reasoning, calls=calls)

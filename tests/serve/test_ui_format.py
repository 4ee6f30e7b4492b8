"""The AI SDK stream's SSE framing (``processor.serve.ui_format``): one
``data:`` JSON line per chunk, the seq as the id of each event's last
frame, ``data: [DONE]`` after the outcome; the outcome read from the
terminal event (``cancel_reason`` when it has one, else the merged meta's),
and a finished turn whose terminal event is gone."""

from __future__ import annotations

import json
from typing import Any

from support.ui_messages import read_sse

from processor.client.turns import LiveEvent, MergedOutput, TurnRef
from processor.serve import sse
from processor.serve.ui_format import DONE, UiMessages

TURN = TurnRef("r1")
RESPONSE = {"type": "agent_response", "response_id": "r1", "finish_reason": "stop", "messages": [
    {"type": "message", "role": "assistant", "message_id": "m1", "author_name": "bob",
     "contents": [{"type": "text", "text": "Hello"}]}]}


def _event(body: dict[str, Any]) -> LiveEvent:
    return LiveEvent.decode(json.dumps({"response_id": "r1", "synthesis_id": "r1:synthesis",
                                        "ts": 1, **body}).encode())


def _merged(status: str, meta: dict[str, Any] | None = None) -> MergedOutput:
    return MergedOutput(TURN, status, json.dumps(RESPONSE).encode(),
                        json.dumps(meta or {}).encode())


def _parse(frames: list[bytes]) -> list[Any]:
    parser = sse.Parser()
    return [e for e in parser.feed(b"".join(frames)) if isinstance(e, sse.Event)]


def test_each_event_s_last_frame_carries_its_seq_and_done_comes_last() -> None:
    fmt = UiMessages(TURN)
    frames = fmt.event(_event({"type": "synthesis.started", "seq": 0}), None)
    frames += fmt.event(_event({"type": "synthesis.chunk", "seq": 1, "message_id": "m1",
                                "author_name": "bob", "agent_id": None, "delta": "Hel"}), None)
    frames += fmt.event(_event({"type": "synthesis", "seq": 2, "status": "completed",
                                "error": None}), _merged("completed"))
    assert frames[-1] == DONE
    events = _parse(frames)
    assert [e.id for e in events] == [None, "0", None, "1", None, None, None, "2", None]
    chunks = read_sse(b"".join(frames))
    assert [c["type"] for c in chunks] == ["start", "start-step", "text-start", "text-delta",
                                           "text-delta", "text-end", "finish-step", "finish"]
    assert [c.get("delta") for c in chunks if c["type"] == "text-delta"] == ["Hel", "lo"]
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}


def test_a_cancel_s_reason_comes_from_the_terminal_event_else_the_merged_meta() -> None:
    terminal = {"type": "synthesis", "seq": 3, "status": "cancelled", "error": None}
    with_reason = UiMessages(TURN).event(_event({**terminal, "cancel_reason": "stop it"}),
                                         _merged("cancelled"))
    assert read_sse(b"".join(with_reason))[-1] == {"type": "abort", "reason": "stop it"}
    from_meta = UiMessages(TURN).event(_event(terminal),
                                       _merged("cancelled", {"cancel_reason": "from meta"}))
    assert read_sse(b"".join(from_meta))[-1] == {"type": "abort", "reason": "from meta"}
    without = UiMessages(TURN).event(_event(terminal), None)
    assert read_sse(b"".join(without))[-1] == {"type": "abort"}


def test_a_finished_turn_whose_terminal_event_is_gone() -> None:
    gone = read_sse(b"".join(UiMessages(TURN).gone(TURN, _merged(
        "error", {"error": {"code": "turn_timeout", "message": "no entry for 60 s"}}), "error")))
    assert [c["type"] for c in gone] == ["start", "start-step", "text-start", "text-delta",
                                         "text-end", "finish-step", "error"]
    assert gone[-1]["errorText"] == "no entry for 60 s"
    bare = read_sse(b"".join(UiMessages(TURN).gone(TURN, None, "completed")))
    assert bare == [{"type": "start", "messageId": "r1:synthesis"}, {"type": "start-step"},
                    {"type": "finish-step"}, {"type": "finish"}]


def test_a_server_notice_is_a_transient_data_chunk() -> None:
    notice = UiMessages(TURN).notice({"type": "dropped", "last_event_id": "7"})
    [event] = _parse([notice])
    assert json.loads(event.data) == {"type": "data-processor-notice", "transient": True,
                                      "data": {"type": "dropped", "last_event_id": "7"}}

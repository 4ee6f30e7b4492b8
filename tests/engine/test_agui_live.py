"""The live AG-UI projection (``processor.engine.agui_live.LiveRun``), pure:
over random turns cut into random batches, a client that applies the
events as ``@ag-ui/client`` 1.0 does (``ClientState``)
holds, at the end, exactly the merged response's ``MESSAGES_SNAPSHOT``
(``messages`` of ``--agui``'s run): followed from
the start, joined late (by a snapshot), or cut anywhere (inside a group too)
and resumed from its last id; and every connection is a run the
``ag-ui-protocol`` models and ``ag-ui-validate`` accept."""

from __future__ import annotations

from typing import Any

import msgspec
from ag_ui_validate.pytest_plugin import assert_valid_agui
from hypothesis import given, settings
from hypothesis import strategies as st
from support.agui_checks import check_models, distinct_reopens
from support.merging import decoded, live_batches
from support.strategies import turns

from processor.engine import agui, agui_client, agui_live
from processor.engine.merge import Turn
from processor.wire.outputs import Counts, Meta, Response

_json = msgspec.json.Encoder()


def _live(entries: list[dict[str, Any]], cuts: list[int]) -> tuple[
        list[dict[str, Any]], list[tuple[int, Response]], Response]:
    """A turn's worker events (seq-numbered, from ``synthesis.started`` to
    the terminal one), its merge after each batch, and its final merge."""
    key, records = decoded(entries)
    base = {"response_id": key.response_id, "synthesis_id": key.synthesis_id(), "ts": 1}
    events: list[dict[str, Any]] = [{"type": "synthesis.started", **base}]
    merges: list[tuple[int, Response]] = []
    turn = Turn(key)
    for found, turn in live_batches(key, records, cuts, 2):
        events += [msgspec.json.decode(_json.encode(e)) for e in found]
        merges.append((len(events) - 1, turn.finish()))
    events.append({"type": "synthesis", **base, "status": "completed", "error": None})
    for seq, event in enumerate(events):
        event["seq"] = seq
    return events, merges, turn.finish()


def _meta(response: Response) -> Meta:
    rid = response.response_id or "R"
    return Meta(rid, None, f"{rid}:synthesis", {}, Counts(), None, None, None, None)


def _connection(events: list[dict[str, Any]], after: int, final: Response,
                join: tuple[int, Response] | None = None,
                given: list[dict[str, Any]] | None = None) -> list[tuple[int | None, dict]]:
    """What one connection gets, as (SSE id, event): the groups after
    ``after`` (a new client: -1), as processor serve's Agui format frames
    them; ``given``: the messages the client posts (HttpAgent), else None (GET)."""
    live = agui_live.LiveRun()
    out: list[tuple[int | None, dict[str, Any]]] = []
    cut = join[0] if join else after
    for event in events[:cut + 1]:
        live.fold(event)
    live.attach(given, resumed=after >= 0 and join is None)
    if cut >= 0:
        if join:
            live.forget_open()
        thread, run = agui.thread_and_run(_meta(final))
        out.append((None, {"type": "RUN_STARTED", "threadId": thread, "runId": run}))
        out += [(None, e) for e in live.reopen()]
        if join:
            out += [(join[0], e) for e in live.join(join[1], _meta(final))]
    for event in events[cut + 1:]:
        if event["type"] == "synthesis":
            group = live.finish(final, _meta(final), "completed")
        else:
            group = live.event(event)
        out += [(event["seq"] if i == len(group) - 1 else None, e) for i, e in enumerate(group)]
    return out


def _after_the_end(final: Response, given: list[dict[str, Any]] | None
                   ) -> list[tuple[int | None, dict[str, Any]]]:
    """A client that resumes a finished turn: RUN_STARTED, then the end."""
    live = agui_live.LiveRun()
    live.attach(given, resumed=True)
    thread, run = agui.thread_and_run(_meta(final))
    return [(None, {"type": "RUN_STARTED", "threadId": thread, "runId": run}),
            *((None, e) for e in live.finish(final, _meta(final), "completed"))]


def _held(*connections: list[tuple[int | None, dict[str, Any]]]) -> list[dict[str, Any]]:
    state = agui_client.ClientState()
    for connection in connections:
        for _id, event in connection:
            state.apply(event)
    return state.messages


def _valid(connection: list[tuple[int | None, dict[str, Any]]]) -> None:
    events = [e for _, e in connection]
    check_models(events)
    assert_valid_agui(distinct_reopens(events), severity_overrides={"AGUI204": "off",
                                                                    "AGUI207": "off"},
                      max_warnings=0)


@settings(max_examples=100, deadline=None)
@given(turns(), st.lists(st.integers(0, 60), max_size=6), st.data())
def test_a_client_ends_holding_the_merged_response_live_late_or_resumed(
    entries: list[dict[str, Any]], cuts: list[int], data: st.DataObject
) -> None:
    events, merges, final = _live(entries, cuts)
    want = agui_client.messages(agui.project(final, _meta(final), "completed")[1:-1])
    assert len({m["id"] for m in want}) == len(want)  # a client keys its messages by id
    whole = _connection(events, -1, final)
    _valid(whole)
    assert _held(whole) == want
    assert whole[-2][1] == {"type": "MESSAGES_SNAPSHOT", "timestamp": whole[-2][1].get(
        "timestamp"), "messages": want} or whole[-2][1]["messages"] == want
    # Cut after any frame, resumed from the last id it had.
    at = data.draw(st.integers(1, len(whole) - 1), label="cut after frame")
    head = whole[:at]
    ids = [i for i, _ in head if i is not None]
    again = _connection(events, ids[-1] if ids else -1, final)
    _valid(again)
    assert _held(head, again) == want
    # ... the same, posting what it holds (HttpAgent's RunAgentInput.messages).
    posted = _connection(events, ids[-1] if ids else -1, final, given=_held(head))
    _valid(posted)
    assert _held(head, posted) == want
    # ... or after the turn ended: serve reads no history then (the merged
    # response replaces it), only the end.
    for posted_messages in (None, _held(head)):
        ended = _after_the_end(final, posted_messages)
        _valid(ended)
        assert _held(head, ended) == want
    # Joined late, by the snapshot of the merge after some batch.
    seq, so_far = data.draw(st.sampled_from(merges), label="join at")
    late = _connection(events, -1, final, (seq, so_far))
    _valid(late)
    assert _held(late) == want


def test_a_cancel_reason_rides_on_run_finished_metadata() -> None:
    """The cancel's reason (the terminal event's ``cancel_reason``) where
    AG-UI 1.0 has room for it: ``RUN_FINISHED.metadata.cancelReason``."""
    base = {"response_id": "c", "synthesis_id": "c:synthesis", "ts": 5, "seq": 3}
    live = agui_live.LiveRun()
    [end] = live.event({**base, "type": "synthesis", "status": "cancelled", "error": None,
                        "cancel_reason": "user pressed stop"})
    assert end["outcome"] == {"type": "cancelled"}
    assert end["metadata"] == {"cancelReason": "user pressed stop"}
    check_models([end])
    final = Response(messages=[], response_id="c")
    *_, finished = agui_live.LiveRun().finish(final, _meta(final), "cancelled", "user pressed stop")
    assert finished["metadata"] == {"cancelReason": "user pressed stop"}
    [plain] = agui_live.LiveRun().event({**base, "type": "synthesis", "status": "cancelled",
                                    "error": None, "cancel_reason": None})
    assert "metadata" not in plain


def test_a_result_in_a_message_that_also_streams_a_call_takes_an_id_of_its_own() -> None:
    """A message whose role turned to ``tool`` mid-call (an id-less run: a
    new message) holds the rest of a call's arguments and then a result:
    ``TOOL_CALL_START`` names the message as ``parentMessageId``, so the
    result's ``TOOL_CALL_RESULT`` must not take the same id. It did, and the
    live client and the merged snapshot then disagreed on the order."""
    def update(contents: list[dict[str, Any]], role: str) -> dict[str, Any]:
        return {"response_id": "turn-1", "kind": "update", "update": {
            "type": "agent_response_update", "contents": contents, "role": role,
            "author_name": "alice", "agent_id": "agent-0"}}

    def call(call_id: str, args: str, name: str | None = "search") -> dict[str, Any]:
        return {"type": "function_call", "call_id": call_id, "arguments": args,
                **({"name": name} if name else {})}

    entries = [update([call("call-0", '{"q": "<0>"}'), call("call-2", '{"q": "<2>')],
                      "assistant"),
               update([call("call-2", '<4>"}', None)], "tool"),
               update([{"type": "function_result", "call_id": "call-0",
                        "result": {"value": "<5>"}}], "tool"),
               {"response_id": "turn-1", "kind": "end"}]
    events, _, final = _live(entries, [])
    want = agui_client.messages(agui.project(final, _meta(final), "completed")[1:-1])
    ids = [m["id"] for m in want]
    assert len(ids) == len(set(ids)), ids
    # (the result goes right after the message holding its call, as the client puts it)
    assert [(m["role"], m["id"].split("-")[0]) for m in want] == [
        ("assistant", "msg"), ("tool", "msg"), ("assistant", "msg")]
    assert want[1]["id"] == want[2]["id"] + ":result"
    whole = _connection(events, -1, final)
    _valid(whole)
    assert _held(whole) == want

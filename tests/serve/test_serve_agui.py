"""``GET /v1/turns/{id}/events?format=agui`` over real HTTP, against real
workers (``--progress``) and a private Redis: every connection a client reads
(live, a late join, a join by snapshot, resumed after a cut anywhere) is an
AG-UI 1.0 run that the ``ag-ui-protocol`` models and ``ag-ui-validate``
accept (each reopened id as a span of its own, ``agui_checks.distinct_reopens``),
ends on the turn's outcome (cancelled included), and holds the merged
response in its last ``MESSAGES_SNAPSHOT``; a client applying the events
(``processor.engine.agui_client.ClientState``, @ag-ui/client's rules) ends with
exactly its messages, however it was cut. tests/serve/test_agui_clients.py runs
the real ``HttpAgent``."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import msgspec
from ag_ui_validate.pytest_plugin import assert_valid_agui
from support.agui_checks import check_models, distinct_reopens
from support.serve_harness import (
    bearer,
    config,
    merged_text,
    open_stream,
    served,
    start_local,
    text_update,
    wait_logged,
)
from support.worker_harness import Harness

from processor.client import Producer, Subscriber
from processor.engine import agui, agui_client, agui_live
from processor.serve import sse
from processor.wire.outputs import Meta, Response

AGUI = "?format=agui"


def _updates() -> list[dict[str, Any]]:
    """Two agents interleaving their messages, reasoning, a call whose
    arguments come in pieces (not JSON until joined), and its result."""
    return [
        text_update("Hello ", "m1", "alice"),
        text_update("Hi ", "m2", "bob"),
        text_update("there. ", "m1", "alice"),
        {"role": "assistant", "author_name": "alice", "message_id": "m1",
         "contents": [{"type": "text_reasoning", "text": "look it up"}]},
        {"role": "assistant", "author_name": "alice", "message_id": "m1",
         "contents": [{"type": "function_call", "call_id": "c1", "name": "find",
                       "arguments": "{\"q\": "}]},
        {"role": "assistant", "author_name": "alice", "message_id": "m1",
         "contents": [{"type": "function_call", "call_id": "c1", "arguments": "\"x\"}"}]},
        {"role": "tool", "message_id": "t1",
         "contents": [{"type": "function_result", "call_id": "c1", "result": "42"}]},
        text_update("more from bob", "m2", "bob"),
        text_update("It is 42.", "m1", "alice"),
    ]


def _data(events: list[sse.Event]) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in events]


def _final_messages(item: Any) -> list[dict[str, Any]]:
    response = msgspec.json.decode(json.dumps(item.response), type=Response)
    meta = msgspec.json.decode(json.dumps(item.meta), type=Meta)
    return agui_client.messages(agui.project(response, meta, item.status)[1:-1])


def _held(connections: list[list[sse.Event]]) -> list[dict[str, Any]]:
    """What a client holds after reading these connections one after the other."""
    state = agui_client.ClientState()
    for events in connections:
        for event in _data(events):
            state.apply(event)
    return state.messages


def _check_run(events: list[sse.Event], item: Any, outcome: str = "success") -> None:
    """A whole AG-UI run, as one client read it on one connection."""
    data = _data(events)
    check_models([{k: v for k, v in d.items() if k != "rawEvent"} for d in data])
    # Every rule on but AGUI204 (arguments closed as streamed so far); an id
    # reopened after its END (AG-UI 1.0) is checked as a span of its own.
    assert_valid_agui(distinct_reopens(data), severity_overrides={"AGUI204": "off"},
                      max_warnings=0)
    types = [d["type"] for d in data]
    assert types[0] == "RUN_STARTED" and types.count("RUN_STARTED") == 1, types
    assert types[-2:] == ["MESSAGES_SNAPSHOT", "RUN_FINISHED"], types
    assert data[-1]["outcome"] == {"type": outcome}
    assert data[0]["threadId"] == data[-1]["threadId"] and data[0]["runId"] == data[-1]["runId"]
    # The last snapshot is the merged response, as --agui's run of it says it,
    # and what the client holds.
    assert data[-2]["messages"] == _final_messages(item) == _held([events])
    # ids are seqs, increasing, also as rawEvent.seq; the snapshot before the end has none.
    ids = [int(e.id) for e in events if e.id is not None]
    assert ids == sorted(set(ids)), ids
    assert [d["rawEvent"]["seq"] for d in data if "rawEvent" in d] == ids
    assert events[-2].id is None and events[-1].id is not None


async def test_a_turn_streams_as_a_valid_agui_run_ending_with_the_merged_response(
    redis_url, namespace
) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        async with aiohttp.ClientSession() as session:
            url = f"{serve.url}/v1/turns/a1/events{AGUI}"
            stream = await open_stream(session, url, bearer("a1"))
            for update in _updates():
                await producer.send("a1", update)
            await producer.end("a1")
            events = await stream.rest()
            # A late joiner of the finished turn: the start, snapshot and end.
            late = await (await open_stream(session, url, bearer("a1"))).rest()
            async with session.get(f"{serve.url}/v1/turns/a1/events?format=xml",
                                   headers=bearer("a1")) as response:
                assert response.status == 400
        item = await Subscriber(harness.client, namespace).wait_for("a1", 30)
        _check_run(events, item)
        data = _data(events)
        # Each message's text once, in order, in its deltas (coalesced per publish:
        # a batch, or several within --live-interval-ms), under the message's own id.
        told: dict[str, str] = {}
        for d in data:
            if d["type"] == "TEXT_MESSAGE_CONTENT":
                told[d["messageId"]] = told.get(d["messageId"], "") + d["delta"]
        assert told == {"m1": "Hello there. It is 42.", "m2": "Hi more from bob"}
        assert {d["messageId"] for d in data if d["type"] == "TEXT_MESSAGE_CONTENT"} == {
            "m1", "m2"}
        assert not [d for d in data if d["type"] in ("CUSTOM", "TEXT_MESSAGE_CHUNK")]
        types = {d["type"] for d in data}
        assert {"REASONING_MESSAGE_CONTENT", "TOOL_CALL_START", "TOOL_CALL_ARGS",
                "TOOL_CALL_RESULT", "STEP_STARTED"} <= types, types
        args = "".join(d["delta"] for d in data if d["type"] == "TOOL_CALL_ARGS")
        assert args == '{"q": "x"}'  # the call's argument pieces, as the worker streamed them
        _check_run(late, item)
        # ... as --agui's run of it (a client that reads only TEXT_MESSAGE_* gets the
        # text too), then the snapshot and the end.
        late_types = [d["type"] for d in _data(late)]
        assert late_types[0] == "RUN_STARTED" and "TEXT_MESSAGE_CONTENT" in late_types
        assert late_types[-2:] == ["MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        assert merged_text(item.response) == "Hello there. It is 42.Hi more from bob"


async def test_a_cancelled_turn_finishes_its_run_cancelled(redis_url, namespace) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, f"{serve.url}/v1/turns/c1/events{AGUI}",
                                       bearer("c1"))
            await producer.send("c1", text_update("half an answer"))
            while json.loads((await stream.event()).data)["type"] != "TEXT_MESSAGE_CONTENT":
                pass
            async with session.post(f"{serve.url}/v1/turns/c1/cancel",
                                    headers=bearer("c1")) as response:
                assert response.status == 202
            rest = await stream.rest()
        item = await Subscriber(harness.client, namespace).wait_for("c1", 30)
        assert item.status == "cancelled"
        seen = [e for e in stream.items if isinstance(e, sse.Event)]
        assert seen[-len(rest):] == rest
        _check_run(seen, item, outcome="cancelled")


async def test_a_stream_cut_anywhere_resumes_to_exactly_the_uncut_run(
    redis_url, namespace
) -> None:
    """Clients cut after each number of events (inside a group too) and
    resumed with their last id (header or ?after=) hold what a client never
    cut holds; each resumed connection is a valid run of its own, from a
    RUN_STARTED without an id, then the events after that id."""
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        url = f"{serve.url}/v1/turns/cut/events{AGUI}"
        async with aiohttp.ClientSession() as session:
            whole = await open_stream(session, url, bearer("cut"))
            cuts = [await open_stream(session, url, bearer("cut")) for _ in range(10)]
            updates = _updates()
            for update in updates[:6]:
                await producer.send("cut", update)
            await wait_logged(harness, "cut", 6)
            # As many cut points as AG-UI events there are now (batching decides).
            live = agui_live.LiveRun()
            published = [json.loads(f[b"event"]) for _, f in
                         await harness.client.xrange(harness.ns.shard_for("cut").events)]
            there = sum(len(live.event(e)) for e in published)
            cut_points = range(1, min(there, len(cuts)) + 1)
            for extra in cuts[len(cut_points):]:
                extra.close()
            resumed = []
            for n, cut in zip(cut_points, cuts, strict=False):
                head = await cut.events(n)
                cut.close()
                last = [e.id for e in head if e.id is not None][-1]
                if n % 2:
                    again = await open_stream(session, url,
                                              {**bearer("cut"), "Last-Event-ID": last})
                else:
                    again = await open_stream(session, f"{url}&after={last}", bearer("cut"))
                resumed.append((head, again))
            for update in updates[6:]:
                await producer.send("cut", update)
            await producer.end("cut")
            reference = await whole.rest()
            runs = [head + await again.rest() for head, again in resumed]
        item = await Subscriber(harness.client, namespace).wait_for("cut", 30)
        _check_run(reference, item)
        assert json.loads(reference[0].data)["type"] == "RUN_STARTED" and reference[0].id == "0"
        for n, ((head, _again), run) in zip(cut_points, zip(resumed, runs, strict=True),
                                            strict=True):
            again = run[len(head):]
            _check_run(again, item)
            assert again[0].id is None and json.loads(again[0].data)["type"] == "RUN_STARTED"
            last = int([e.id for e in head if e.id is not None][-1])
            assert [e.id for e in again if e.id is not None] == [
                e.id for e in reference if e.id is not None and int(e.id) > last], n
            assert _held([head, again]) == _held([reference]) == _final_messages(item), (
                n, [json.loads(e.data) for e in head], [json.loads(e.data) for e in again])


async def test_a_late_join_gets_a_messages_snapshot_then_the_rest_and_resumes(
    redis_url, namespace
) -> None:
    """A client joining a running turn gets RUN_STARTED (no id: a client with
    no id yet starts over) and the merge so far (a MESSAGES_SNAPSHOT of its
    own messages, then --agui's run of the merge; the last event's id: its
    seq), then the live events; cut and resumed, its run is still valid."""
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        url = f"{serve.url}/v1/turns/snap/events{AGUI}"
        updates = _updates()
        async with aiohttp.ClientSession() as session:
            for update in updates[:3]:
                await producer.send("snap", update)
            await wait_logged(harness, "snap", 3)
            late = await open_stream(session, url, bearer("snap"))
            head = [await late.event()]
            while head[-1].id is None:
                head.append(await late.event())
            assert json.loads(head[0].data)["type"] == "RUN_STARTED"
            assert "MESSAGES_SNAPSHOT" in [json.loads(e.data)["type"] for e in head]
            texts = {m["id"]: m["content"] for m in _held([head])}
            joined = len(head)
            assert texts == {"m1": "Hello there. ", "m2": "Hi "}
            for update in updates[3:8]:
                await producer.send("snap", update)
            await wait_logged(harness, "snap", 8)
            head += await late.events(4)
            late.close()
            last = [e.id for e in head if e.id is not None][-1]
            again = await open_stream(session, url, {**bearer("snap"), "Last-Event-ID": last})
            await producer.send("snap", updates[8])
            await producer.end("snap")
            run = head + await again.rest()
        item = await Subscriber(harness.client, namespace).wait_for("snap", 30)
        cut = len(head)
        _check_run(again_events := run[cut:], item)
        assert json.loads(again_events[0].data)["type"] == "RUN_STARTED"
        assert _held([head, again_events]) == _final_messages(item)
        deltas = sorted(d["delta"] for d in _data(run[joined:])
                        if d["type"] == "TEXT_MESSAGE_CONTENT")
        assert deltas == ["It is 42.", "more from bob"]


async def test_a_posted_run_agent_input_attaches_and_bad_ones_get_clear_errors(
    redis_url, namespace
) -> None:
    """``POST ...?format=agui`` (what ``HttpAgent`` sends) answers the same
    run as GET and never starts a turn; the client's own messages stay first
    in the snapshots; a body that is not a RunAgentInput, too large, names
    another turn's run, or wants another media type is refused in JSON."""
    app_origin = "https://app.example.com"
    async with Harness(redis_url, namespace) as harness:
        await harness.start_worker()
        serve = await start_local(config(redis_url, namespace, cors_origins=(app_origin,)))
        producer = Producer(harness.client, namespace)
        url = f"{serve.url}/v1/turns/p1/events?format=agui"
        user = {"id": "u1", "role": "user", "content": "What about my invoice?"}
        body = {"threadId": "t-any", "runId": "r-any", "messages": [user], "tools": [],
                "state": {}, "context": [], "forwardedProps": {}}
        try:
            async with aiohttp.ClientSession() as session:
                async def refused(status: int, code: str, data: bytes | str = b"",
                                  headers: dict[str, str] | None = None,
                                  target: str = url) -> None:
                    async with session.post(target, data=data, headers={
                            **bearer("p1"), **(headers or {})}) as response:
                        assert response.status == status, (status, await response.text())
                        assert response.content_type == "application/json"
                        assert (await response.json())["error"] == code

                await refused(400, "bad_request", b"{not json")
                await refused(400, "bad_request", b"[1, 2]")
                await refused(400, "bad_request", b"[" * 100_000)  # too deep for a parser
                await refused(400, "bad_request", json.dumps({"messages": {"id": 1}}))
                await refused(400, "bad_request", json.dumps({"messages": [7]}))
                await refused(400, "bad_request", json.dumps({"runId": 7}))
                await refused(413, "too_large", b" " * (4 * 1024 * 1024 + 1))
                await refused(409, "other_turn", json.dumps({**body, "runId": "p2:synthesis"}))
                await refused(406, "not_acceptable", json.dumps(body),
                              {"Accept": "application/vnd.ag-ui.event+proto"})
                await refused(400, "bad_request", json.dumps(body),
                              target=url.replace("agui", "native"))
                async with session.post(url, json=body) as response:
                    assert response.status == 401  # the token is checked first
                preflight = {"Origin": app_origin, "Access-Control-Request-Method": "POST",
                             "Access-Control-Request-Headers":
                                 "authorization, content-type, last-event-id"}
                async with session.options(url, headers=preflight) as response:
                    assert response.status == 204
                    assert "POST" in response.headers["Access-Control-Allow-Methods"]
                    allowed = response.headers["Access-Control-Allow-Headers"]
                    assert {"Authorization", "Content-Type", "Last-Event-ID"} <= {
                        h.strip() for h in allowed.split(",")}
                # The turn does not exist yet: the POST waits for it, it starts nothing.
                posted = await session.post(url, json={**body, "runId": "p1:synthesis"},
                                            headers={**bearer("p1"), "Origin": app_origin,
                                                     "Accept": "text/event-stream"})
                assert posted.status == 200
                assert posted.headers["Content-Type"] == "text/event-stream"
                assert posted.headers["Access-Control-Allow-Origin"] == app_origin
                assert await harness.merged_count() == 0
                for update in _updates()[:4]:
                    await producer.send("p1", update)
                await producer.end("p1")
                parser, events = sse.Parser(), []
                async for chunk in posted.content.iter_any():
                    events += [e for e in parser.feed(chunk) if isinstance(e, sse.Event)]
                posted.release()
        finally:
            await serve.close()
        item = await Subscriber(harness.client, namespace).wait_for("p1", 30)
    data = _data(events)
    assert data[0]["type"] == "RUN_STARTED" and events[0].id == "0"
    assert data[-1]["type"] == "RUN_FINISHED"
    merged = _final_messages(item)
    assert data[-2]["messages"] == [user, *merged]
    state = agui_client.ClientState([user])
    for event in data:
        state.apply(event)
    assert state.messages == [user, *merged]

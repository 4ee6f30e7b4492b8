"""``GET /v1/turns/{id}/stream``, the AI SDK's UI message stream, with the
real ``ai`` package (tests/js/ai_sdk_client.mjs: ``DefaultChatTransport
.reconnectToStream`` and ``readUIMessageStream``, what ``useChat({ resume:
true })`` does) against real workers and a private Redis: the UIMessage a
client ends with has the merged response's text, reasoning and tool parts
(input and output), whether it followed the turn live from before its
first entry, joined it running, came after its end, or saw it cancelled;
a turn the server does not know is 204, nothing to resume."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from support import node_clients
from support.serve_harness import (
    bearer,
    config,
    served,
    start_local,
    text_update,
    token,
    wait_logged,
)
from support.ui_messages import comparable, expected_parts, read_sse
from support.worker_harness import Harness

from processor.client import Producer, Subscriber


def _updates() -> list[dict[str, Any]]:
    """Two agents interleaving their messages, reasoning, a call whose
    arguments come in pieces (not JSON until joined), and its result."""
    return [
        {"role": "assistant", "author_name": "alice", "message_id": "m1",
         "contents": [{"type": "text_reasoning", "text": "look it up"}]},
        text_update("Hello ", "m1", "alice"),
        text_update("Hi ", "m2", "bob"),
        text_update("there. ", "m1", "alice"),
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


async def _client(api: str, chat_id: str, *auth: str) -> dict[str, Any]:
    out: dict[str, Any] = await node_clients.run("ai_sdk_client.mjs", api, chat_id, *auth)
    assert out["errors"] == [], out["errors"]
    return out


async def _merged(harness: Harness, rid: str) -> Any:
    return await Subscriber(harness.client, harness.ns.name).wait_for(rid, 30)


def _check(out: dict[str, Any], item: Any, rid: str) -> list[str]:
    """The client's one UIMessage holds the merged response; the chunk types."""
    assert out["resumed"]
    message = out["message"]
    assert message["id"] == f"{rid}:synthesis" and message["role"] == "assistant"
    assert comparable(message["parts"]) == comparable(expected_parts(item.response))
    types = [c["type"] for c in out["chunks"]]
    assert types[:2] == ["start", "start-step"] and types[-2] == "finish-step"
    return types


async def test_a_client_started_before_the_turn_follows_it_live_to_the_merged_response(
    redis_url, namespace
) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        client = asyncio.ensure_future(_client(f"{serve.url}/v1/turns?wait=30", "live",
                                               token("live")))
        while not serve.server.hub.followers("live"):  # it waits for the turn to start
            assert not client.done(), client.result()
            await asyncio.sleep(0.02)
        for n, update in enumerate(_updates(), 1):
            await producer.send("live", update)
            await wait_logged(harness, "live", n)  # one batch each: deltas, live
        await producer.end("live")
        out = await client
        item = await _merged(harness, "live")
        types = _check(out, item, "live")
        assert types[-1] == "finish"
        # Live: each message's text came as it was written, not at once. Alice's
        # call joins her message m1 after bob's m2 began: the AI SDK cannot put a
        # part before another, so the step is reset and the message sent again in
        # the merged order (m1's text again in one delta), once.
        deltas = [c["delta"] for c in out["chunks"] if c["type"] == "text-delta"
                  and c["id"] == "m1"]
        assert deltas == ["Hello ", "there. ", "Hello there. ", "It is 42."]
        assert types.count("reset-step") == 1
        reset = types.index("reset-step")
        assert out["chunks"][reset + 5:reset + 7] == [
            {"type": "tool-input-start", "toolCallId": "c1", "toolName": "find", "dynamic": True,
             "providerExecuted": True,
             "providerMetadata": {"processor": {"messageId": "m1", "authorName": "alice"}}},
            {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "{\"q\": "}]
        parts = out["message"]["parts"]
        assert [p["type"] for p in parts] == ["step-start", "reasoning", "text", "dynamic-tool",
                                             "text"]
        assert parts[3]["input"] == {"q": "x"} and parts[3]["output"] == "42"
        assert parts[4]["providerMetadata"] == {
            "processor": {"messageId": "m2", "authorName": "bob"}}


async def test_a_client_joining_a_running_turn_or_after_its_end_gets_the_same_message(
    redis_url, namespace
) -> None:
    """Joined mid-turn (the snapshot first, then the live chunks), and after
    the end (the merged response alone), with the token as ``?token=``."""
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        api = f"{serve.url}/v1/turns"
        updates = _updates()
        for update in updates[:4]:
            await producer.send("mid", update)
        await wait_logged(harness, "mid", 4)
        joined = asyncio.ensure_future(_client(api, "mid", token("mid")))
        while not serve.server.hub.followers("mid"):
            await asyncio.sleep(0.02)
        for update in updates[4:]:
            await producer.send("mid", update)
        await producer.end("mid")
        during = await joined
        after = await _client(f"{api}?token={token('mid')}", "mid")
        chat = await node_clients.run("ai_sdk_client.mjs", api, "mid", token("mid"),
                                      "--chat", "2")
        item = await _merged(harness, "mid")
        assert _check(during, item, "mid")[-1] == "finish"
        types = _check(after, item, "mid")
        assert types[-1] == "finish" and "reset-step" not in types
        assert during["message"]["parts"] == after["message"]["parts"]
        # useChat's own resume (its Chat, resumeStream() on mount and again when the
        # page comes back): one assistant message, replayed in place, not twice.
        assert chat["status"] == "ready" and chat["error"] is None
        [message] = chat["messages"]
        assert message["id"] == "mid:synthesis" and message["role"] == "assistant"
        assert message["parts"] == after["message"]["parts"]


async def test_a_cancelled_turn_ends_aborted_with_its_partial_message(
    redis_url, namespace
) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        client = asyncio.ensure_future(_client(f"{serve.url}/v1/turns?wait=30", "stop",
                                               token("stop")))
        while not serve.server.hub.followers("stop"):
            await asyncio.sleep(0.02)
        # The call's arguments cut half-way; one batch each, so that the
        # call, which goes before bob's earlier text, is a rewrite of the
        # past (one reset-step) whatever the machine's speed.
        for n, update in enumerate(_updates()[:5], 1):
            await producer.send("stop", update)
            await wait_logged(harness, "stop", n)
        async with aiohttp.ClientSession() as session, session.post(
                f"{serve.url}/v1/turns/stop/cancel", headers=bearer("stop"),
                json={"reason": "user pressed stop"}) as response:
            assert response.status == 202
        out = await client
        item = await _merged(harness, "stop")
        assert item.status == "cancelled"
        types = _check(out, item, "stop")
        end = out["chunks"][-1]
        assert end["type"] == "abort"
        assert end.get("reason") == "user pressed stop"  # the terminal event's cancel_reason
        [call] = [p for p in out["message"]["parts"] if p["type"] == "dynamic-tool"]
        assert call["state"] == "input-streaming"  # its arguments never became JSON
        assert call["rawInput"] == "{\"q\": " and types.count("reset-step") == 1


async def test_nothing_to_resume_is_204_and_the_stream_needs_the_turns_token(
    redis_url, namespace
) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        out = await node_clients.run("ai_sdk_client.mjs", f"{serve.url}/v1/turns", "nope",
                                     token("nope"))
        assert out == {"resumed": False, "message": None, "chunks": [], "errors": []}
        chat = await node_clients.run("ai_sdk_client.mjs", f"{serve.url}/v1/turns", "nope",
                                      token("nope"), "--chat", "1")
        assert chat == {"status": "ready", "error": None, "messages": []}
        # A failed turn: the message as merged, then useChat's status is 'error'.
        await producer.send("bad", text_update("half"))
        await producer.error("bad", "model down")
        failed = await _merged(harness, "bad")
        out = await node_clients.run("ai_sdk_client.mjs", f"{serve.url}/v1/turns", "bad",
                                     token("bad"))
        assert _check(out, failed, "bad")[-1] == "error"
        assert out["chunks"][-1] == {"type": "error", "errorText": "model down"}
        assert out["errors"] == ["Error: model down"]  # readUIMessageStream's onError
        chat = await node_clients.run("ai_sdk_client.mjs", f"{serve.url}/v1/turns", "bad",
                                      token("bad"), "--chat", "1")
        assert chat["status"] == "error" and "model down" in chat["error"]
        assert chat["messages"][0]["parts"] == out["message"]["parts"]
        await producer.send("done", text_update("finished"))
        await producer.end("done")
        await _merged(harness, "done")
        async with aiohttp.ClientSession() as session:
            url = f"{serve.url}/v1/turns/done/stream"
            async with session.get(url) as response:
                assert response.status == 401
            async with session.get(url, headers=bearer("nope")) as response:
                assert response.status == 403
            async with session.get(f"{url}?wait=61", headers=bearer("done")) as response:
                assert response.status == 400
            async with session.get(f"{serve.url}/v1/turns/nope/stream?wait=0.2",
                                   headers=bearer("nope")) as response:
                assert response.status == 204  # waited, never started
            async with session.get(url, headers=bearer("done")) as response:
                assert response.status == 200
                assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
                assert response.headers["Content-Type"].startswith("text/event-stream")
                body = await response.read()
        chunks = read_sse(body)  # data: [DONE] last
        assert [c["type"] for c in chunks] == [
            "start", "start-step", "text-start", "text-delta", "text-end", "finish-step",
            "finish"]
        assert chunks[3]["delta"] == "finished"
        assert json.loads(json.dumps(chunks[0])) == {"type": "start",
                                                     "messageId": "done:synthesis"}


async def test_a_stream_cut_by_a_stopping_server_breaks_rather_than_ends(
    redis_url, namespace
) -> None:
    """A server that stops mid-turn breaks the connection: the client sees a
    failed read (useChat: a disconnect, resumable), not a clean end that
    would look like a finished message with its text cut short."""
    async with Harness(redis_url, namespace) as harness:
        await harness.start_worker()
        serve = await start_local(config(redis_url, namespace))
        producer = Producer(harness.client, namespace)
        closed = False
        try:
            await producer.send("cut", text_update("the first half"))
            await wait_logged(harness, "cut", 1)
            client = asyncio.ensure_future(node_clients.run(
                "ai_sdk_client.mjs", f"{serve.url}/v1/turns", "cut", token("cut")))
            while not serve.server.hub.followers("cut"):
                await asyncio.sleep(0.02)
            sent = "processor_serve_events_sent_total"
            while not serve.server.metrics.registry.get_sample_value(sent):  # the snapshot is out
                await asyncio.sleep(0.02)
            await serve.close()
            closed = True
            out = await client
        finally:
            if not closed:
                await serve.close()
        assert out["resumed"] and out["errors"], out
        types = [c["type"] for c in out["chunks"]]
        assert types[:2] == ["start", "start-step"] and "finish" not in types
        assert out["message"]["parts"][1]["text"] == "the first half"

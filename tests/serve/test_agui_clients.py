"""The stock AG-UI clients against a real ``processor serve`` and worker:
``@ag-ui/client`` 1.0's ``HttpAgent`` with its default settings (it POSTs a
``RunAgentInput``), run by Node.js (tests/js/agui_client.mjs). Whether it
follows a turn from its start, joins it late, is cut and resumes with
``Last-Event-ID``, or the turn is cancelled or fails, the agent's
``messages`` at the end are exactly the ``MESSAGES_SNAPSHOT`` of the merged
response: the same messages, in the same order, with the same ids."""

from __future__ import annotations

import asyncio
import fcntl
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from support import node_clients
from support.serve_harness import (
    LocalServe,
    bearer,
    served,
    text_update,
    token,
    wait_logged,
)
from support.worker_harness import Harness

from processor.client import Producer, Subscriber
from processor.engine import agui, agui_client
from processor.wire.outputs import Meta, Response

#: Agent Framework's AG-UI client, run in its own venv (never imported).
CHAT_CLIENT = Path(node_clients.__file__).resolve().parent / "agui_chat_client.py"


def _handoff() -> list[dict[str, Any]]:
    """The demo's shape: reasoning (id-less, then folded into its message), a
    call in pieces, its result, two agents interleaving (the merge puts
    alice's last message before bob's, which came first)."""
    alice = {"role": "assistant", "author_name": "alice", "agent_id": "triage",
             "response_id": "run-alice"}
    bob = {"role": "assistant", "author_name": "bob", "agent_id": "billing",
           "response_id": "run-bob", "message_id": "bob-1"}
    return [
        {**alice, "contents": [{"type": "text_reasoning", "text": "The user asks about "}]},
        {**alice, "contents": [{"type": "text_reasoning", "text": "an invoice."}]},
        {**alice, "message_id": "al-1", "contents": [
            {"type": "function_call", "call_id": "c1", "name": "handoff",
             "arguments": "{\"to\": "}]},
        {**alice, "message_id": "al-1", "contents": [
            {"type": "function_call", "call_id": "c1", "arguments": "\"billing\"}"}]},
        {**alice, "role": "tool", "author_name": None, "message_id": "al-2", "contents": [
            {"type": "function_result", "call_id": "c1", "result": "transferred"}]},
        {**bob, "contents": [{"type": "text", "text": "Hi, I'm Bob. "}]},
        {**alice, "message_id": "al-3", "contents": [{"type": "text", "text": "Handing over."}]},
        {**bob, "contents": [{"type": "text", "text": "Your invoice was paid."}]},
    ]


async def _client(serve: LocalServe, rid: str, **spec: Any) -> Any:
    url = f"{serve.url}/v1/turns/{rid}/events?format=agui"
    return await node_clients.run("agui_client.mjs", json.dumps(
        {"url": url, "token": token(rid), **spec}), timeout=90)


async def _streams(serve: LocalServe, count: int) -> None:
    """Until ``count`` streams are open (the client is attached)."""
    for _ in range(600):
        if serve.server.metrics.open_streams._value.get() >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the client did not attach")


async def _final(harness: Harness, namespace: str, rid: str) -> tuple[list[dict[str, Any]], str]:
    item = await Subscriber(harness.client, namespace).wait_for(rid, 30)
    response = msgspec.json.decode(json.dumps(item.response), type=Response)
    meta = msgspec.json.decode(json.dumps(item.meta), type=Meta)
    return agui_client.messages(agui.project(response, meta, item.status)[1:-1]), item.status


async def _produce(producer: Producer, rid: str, updates: list[dict[str, Any]],
                   pause: float = 0.15) -> None:
    for update in updates:
        await producer.send(rid, update)
        await asyncio.sleep(pause)


def _check(result: Any, merged: list[dict[str, Any]]) -> None:
    assert result["errors"] == [], result
    assert result["messages"] == merged, json.dumps(result, indent=1)
    for types in result["runs"]:
        assert types[0] == "RUN_STARTED", types
        assert "TEXT_MESSAGE_CHUNK" not in types and "CUSTOM" not in types, types


async def test_httpagent_live_from_the_start_holds_the_merged_response(
    redis_url, namespace
) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        client = asyncio.create_task(_client(serve, "h1"))
        await _streams(serve, 1)
        await _produce(producer, "h1", _handoff())
        await producer.end("h1")
        result = await client
        merged, status = await _final(harness, namespace, "h1")
    assert status == "completed"
    _check(result, merged)
    [types] = result["runs"]
    for kind in ("TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
                 "REASONING_START", "REASONING_MESSAGE_CONTENT", "REASONING_END",
                 "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
                 "STEP_STARTED", "STEP_FINISHED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"):
        assert kind in types, (kind, types)
    assert [m["id"] for m in merged] == ["al-1:reasoning", "al-1", "al-2", "al-3", "bob-1"]
    assert result["outcomes"] == ["success"]


async def test_httpagent_joined_late_holds_the_merged_response(redis_url, namespace) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        updates = _handoff()
        await _produce(producer, "h2", updates[:5], 0)
        await wait_logged(harness, "h2", 5)
        client = asyncio.create_task(_client(serve, "h2"))
        await _streams(serve, 1)
        await _produce(producer, "h2", updates[5:])
        await producer.end("h2")
        result = await client
        merged, _ = await _final(harness, namespace, "h2")
    _check(result, merged)
    types = result["runs"][0]
    assert types[0] == "RUN_STARTED" and "MESSAGES_SNAPSHOT" in types[1:3], types


async def test_httpagent_cut_and_resumed_with_last_event_id_holds_the_merged_response(
    redis_url, namespace
) -> None:
    """Cut after each of several numbers of events, then run again with
    ``Last-Event-ID`` (while the turn runs, and once after it ended): the
    same messages as the merged response."""
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        cuts = (3, 7, 12, 20, 5)  # the last one resumes after the turn ended
        clients = [asyncio.create_task(_client(
            serve, "h3", cutAfter=n, resumeDelayMs=300 if i < 4 else 6000))
            for i, n in enumerate(cuts)]
        await _streams(serve, len(cuts))
        await _produce(producer, "h3", _handoff(), 0.3)
        await producer.end("h3")
        results = await asyncio.gather(*clients)
        merged, _ = await _final(harness, namespace, "h3")
    for n, result in zip(cuts, results, strict=True):
        _check(result, merged)
        assert len(result["runs"]) == 2 and result["lastSeq"] is not None, (n, result)


async def test_httpagent_of_a_cancelled_turn_holds_its_partial_merge(
    redis_url, namespace
) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        client = asyncio.create_task(_client(serve, "h4"))
        await _streams(serve, 1)
        await _produce(producer, "h4", _handoff()[:6])
        await wait_logged(harness, "h4", 6)
        async with aiohttp.ClientSession() as session, session.post(
                f"{serve.url}/v1/turns/h4/cancel", headers=bearer("h4")) as response:
            assert response.status == 202
        result = await client
        merged, status = await _final(harness, namespace, "h4")
    assert status == "cancelled"
    _check(result, merged)
    assert result["outcomes"][-1] == "cancelled", result["outcomes"]


async def test_httpagent_of_a_failed_turn_holds_its_partial_merge(redis_url, namespace) -> None:
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        client = asyncio.create_task(_client(serve, "h5"))
        await _streams(serve, 1)
        await _produce(producer, "h5", [text_update("Thinking about ", "m1", "alice")])
        await wait_logged(harness, "h5", 1)
        await producer.error("h5", "model quota exceeded", code="429")
        result = await client
        merged, status = await _final(harness, namespace, "h5")
    assert status == "error"
    _check(result, merged)
    assert result["runs"][0][-1] == "RUN_ERROR"
    assert result["outcomes"][-1]["error"] == "producer_error"


# --------------------------------------------------------------------------- AGUIChatClient


@pytest.fixture(scope="session")
def agui_chat_client(request: pytest.FixtureRequest) -> Path:
    """A venv with ``agent-framework-ag-ui`` 1.7.0 (which pins
    ``ag-ui-protocol`` < 0.2, so it cannot share the suite's venv), made once
    under the pytest cache; its python."""
    where = Path(request.config.cache.mkdir("agui-chat-client-venv"))
    python = where / "bin" / "python"
    stamp = where / "installed-1.7.0"
    with open(where.parent / "agui-chat-client-venv.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not stamp.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(where)], check=True)
            done = subprocess.run([str(python), "-m", "pip", "install", "-q",
                                   "agent-framework-ag-ui==1.7.0"],
                                  capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"pip install agent-framework-ag-ui==1.7.0 failed: "
                            f"{done.stderr.strip()[-2000:]}")
            stamp.touch()
    return python


async def _chat_client(python: Path, serve: LocalServe, rid: str) -> Any:
    url = f"{serve.url}/v1/turns/{rid}/events?format=agui"
    proc = await asyncio.create_subprocess_exec(
        str(python), str(CHAT_CLIENT), url, token(rid),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-4000:]
    return json.loads(out.decode().strip().splitlines()[-1])


async def test_agent_frameworks_aguichatclient_gets_the_text_calls_and_results(
    redis_url, namespace, agui_chat_client: Path
) -> None:
    """``AGUIChatClient`` (it POSTs, reads TEXT_MESSAGE_*, TOOL_CALL_* and
    RUN_*, and ignores reasoning, steps and MESSAGES_SNAPSHOT) gets each
    message's text, the call with its arguments and the result, live, and
    the same for a finished turn; a cancelled turn's text; a failed turn's
    text and error."""
    async with served(redis_url, namespace) as (harness, serve):
        producer = Producer(harness.client, namespace)
        client = asyncio.create_task(_chat_client(agui_chat_client, serve, "af1"))
        await _streams(serve, 1)
        await _produce(producer, "af1", _handoff())
        await producer.end("af1")
        live = await client
        after = await _chat_client(agui_chat_client, serve, "af1")
        await _produce(producer, "af2", [text_update("half an ", "m1", "alice")], 0)
        await wait_logged(harness, "af2", 1)
        cancelled = asyncio.create_task(_chat_client(agui_chat_client, serve, "af2"))
        await _streams(serve, 1)
        async with aiohttp.ClientSession() as session, session.post(
                f"{serve.url}/v1/turns/af2/cancel", headers=bearer("af2")) as response:
            assert response.status == 202
        cut = await cancelled
        await _produce(producer, "af3", [text_update("Thinking about ", "m1", "alice")], 0)
        await wait_logged(harness, "af3", 1)
        failing = asyncio.create_task(_chat_client(agui_chat_client, serve, "af3"))
        await _streams(serve, 1)
        await producer.error("af3", "model quota exceeded", code="429")
        failed = await failing
    for got in (live, after):
        # Per message id, its text: a message that goes on after another one
        # (bob's, after alice's handoff line) is a second message of the same id.
        texts: dict[str, str] = {}
        for m in got["messages"]:
            if m["text"]:
                texts[m["message_id"]] = texts.get(m["message_id"], "") + m["text"]
        assert texts == {"al-3": "Handing over.",
                         "bob-1": "Hi, I'm Bob. Your invoice was paid."}, got
        calls = [c for m in got["messages"] for c in m["calls"]]
        assert calls == [["c1", "handoff", '{"to": "billing"}']], got
        results = [r for m in got["messages"] for r in m["results"]]
        assert results == [["c1", "transferred"]], got
    assert [m["text"] for m in cut["messages"]] == ["half an "], cut
    # A failed turn: its text, then RUN_ERROR's message as an error content.
    assert failed["messages"][0]["text"] == "Thinking about ", failed
    errors = [e for m in failed["messages"] for e in m["errors"]]
    assert len(errors) == 1 and "model quota exceeded" in errors[0], failed

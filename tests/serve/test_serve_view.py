"""The page that watches a turn (``GET /v1/turns/{id}/view``), in a real
browser: Debian's headless Chromium driven by Playwright, against a real
``processor serve``, a real ``processor run --progress`` and a private
Redis. What it renders is the merged response, also when the test kills
the server mid-turn and starts it again (the page resumes by itself); its
live view is already the merged one when the turn ends (a handoff with a
tool call and result); a cancelled turn's reason is shown; markup in a
turn is shown as text, and the token goes to the stream in a header. A
refused token is tests/serve/test_serve_view_tokens.py's.

``PROCESSOR_SCREENSHOTS=docs`` (a directory) makes the tests save the
screenshots docs/serve.md shows there: ``serve-view.png`` (the demo's
handoff), ``serve-view-cancelled.png``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from playwright.async_api import Browser, Route, async_playwright
from support.serve_harness import (
    LocalServe,
    bearer,
    config,
    served,
    spawn_serve,
    start_local,
    token,
)
from support.view_pages import browser, screenshot, shows
from support.worker_harness import Harness

from processor.cli.demo import HANDOFF
from processor.client import Producer, Subscriber

#: What the page shows, as the test reads it back: per message its author,
#: role and parts (text, reasoning, tool call name and arguments, result).
READ_VIEW = """() => [...document.querySelectorAll('.message')].map(m => ({
  author: m.dataset.author || null,
  role: m.dataset.role,
  label: m.querySelector('.author').textContent,
  parts: [...m.children].slice(1).map(p =>
    p.classList.contains('call')
      ? ['call', p.querySelector('.name').textContent, p.querySelector('.args').textContent]
    : p.classList.contains('result') ? ['result', p.querySelector('.value').textContent]
    : [p.className, p.textContent]),
}))"""


def rendered(response: dict[str, Any]) -> list[dict[str, Any]]:
    """What the page must show for a merged response (its rendering rules):
    per message, labelled with its author (else its role), its reasoning,
    its text, its calls, its results (the order live progress can say), and
    no message that shows nothing."""
    out = []
    for message in response["messages"]:
        contents = message["contents"]
        parts: list[list[str]] = []
        for kind, name in (("text_reasoning", "reasoning"), ("text", "text")):
            joined = "".join(c.get("text") or "" for c in contents if c["type"] == kind)
            if joined:
                parts.append([name, joined])
        for content in contents:
            if content["type"] == "function_call":
                arguments = content.get("arguments")
                parts.append(["call", content.get("name") or "", arguments
                              if isinstance(arguments, str) else json.dumps(arguments)])
        parts += [["result", str(c.get("result"))] for c in contents
                  if c["type"] == "function_result"]
        parts += [["other", f"[{c['type']}]"] for c in contents if c["type"] not in (
            "text", "text_reasoning", "function_call", "function_result", "usage")]
        if parts:
            out.append({"author": message.get("author_name"), "role": message["role"],
                        "label": message.get("author_name") or message["role"],
                        "parts": parts})
    return out


@contextlib.asynccontextmanager
async def _watched(redis_url: str, namespace: str
                   ) -> AsyncIterator[tuple[Harness, LocalServe, Browser]]:
    """A worker, ``processor serve`` in this process and Chromium, all closed after."""
    async with served(redis_url, namespace) as (harness, serve), \
            async_playwright() as playwright:
        chromium = await browser(playwright)
        try:
            yield harness, serve, chromium
        finally:
            await chromium.close()


def update(contents: list[dict[str, Any]], author: str | None, message_id: str | None = None,
           role: str = "assistant") -> dict[str, Any]:
    out: dict[str, Any] = {"contents": contents, "role": role}
    if author:
        out["author_name"] = author
    if message_id:
        out["message_id"] = message_id
    return out


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


BEFORE_THE_CUT = [
    update([{"type": "text_reasoning", "text": "a billing "}], "alice"),
    update([{"type": "text_reasoning", "text": "question"}], "alice"),
    update([text("Over to Bob.")], "alice", "a1"),
    update([{"type": "function_call", "call_id": "c1", "name": "lookup_invoice",
             "arguments": '{"invoice": '}], "bob", "b0"),
    update([{"type": "function_call", "call_id": "c1", "arguments": '"INV-7"}'}], "bob", "b0"),
    update([{"type": "function_result", "call_id": "c1", "result": "paid on 3 May"}], None,
           "t1", role="tool"),
    update([text("Hi, I'm ")], "bob", "b1"),
]
AFTER_THE_CUT = [
    update([text("Bob. Your invoice ")], "bob", "b1"),
    update([text("INV-7 was paid ")], "bob", "b1"),
    update([text("on 3 May.")], "bob", "b1"),
    update([{"type": "usage", "usage_details": {"input_token_count": 9,
                                                "output_token_count": 21}}], None),
]


async def test_the_page_renders_the_merged_response_across_a_server_restart(
    redis_url, namespace, tmp_path: Path
) -> None:
    rid = "turn-view-1"
    async with Harness(redis_url, namespace, log_dir=tmp_path) as harness, \
            async_playwright() as playwright:
        worker = harness.spawn(progress=True, log_level="info")
        await harness.wait_started([worker])  # the namespace's record, which serve reads
        serve = spawn_serve(redis_url, namespace, tmp_path)
        producer = Producer(harness.client, namespace)
        chromium = await browser(playwright)
        try:
            await harness.wait_started([worker])
            await serve.wait_serving()
            page = await chromium.new_page()
            await page.goto(f"{serve.url}/v1/turns/{rid}/view?token={token(rid)}")
            for entry in BEFORE_THE_CUT:
                await producer.send(rid, entry)
            await shows(page, "Hi, I'm ")
            assert await page.get_attribute("#connection", "data-connections") == "1"

            serve.kill()  # mid-turn: the page loses its stream
            for entry in AFTER_THE_CUT:
                await producer.send(rid, entry)
            await harness.wait_applied()
            serve = spawn_serve(redis_url, namespace, tmp_path, port=serve.port)
            await serve.wait_serving()

            # Resumed from its last id: the deltas it missed, none twice.
            await shows(page, "Hi, I'm Bob. Your invoice INV-7 was paid on 3 May.")
            assert await page.get_attribute("#connection", "data-connections") == "2"
            assert await page.get_attribute("body", "data-state") == "running"

            await producer.end(rid)
            merged = (await Subscriber(harness.client, namespace).wait_for(rid, 30)).response
            await page.wait_for_selector("body[data-state=completed]", timeout=30_000)
            assert await page.evaluate(READ_VIEW) == rendered(merged)
            assert await page.inner_text("#usage") == (
                "usage: input_token_count 9 · output_token_count 21")
            await page.screenshot(path=str(tmp_path / "view.png"), full_page=True)
        finally:
            await chromium.close()
            serve.kill()


async def test_the_live_view_of_a_handoff_is_already_the_merged_view(
    redis_url, namespace, tmp_path: Path
) -> None:
    """The demo's handoff (alice reasons, calls a tool, its result comes,
    bob speaks, alice's last line, bob again), one update per batch: what
    the page shows from the live deltas, just before the merged response
    arrives, is what it shows after (no jump at the end): the tool result a
    tool's, no empty author block for alice's id-less reasoning (folded into
    her call's message), alice's last line above bob's message, as merged."""
    rid = "turn-view-handoff"
    async with Harness(redis_url, namespace, log_dir=tmp_path) as harness, \
            async_playwright() as playwright:
        # (--hold-ms 100: a held update is checkpointed, so acked, soon after
        # it is read, and wait_applied() waits for that, not for 5 s.)
        worker = harness.spawn(progress=True, log_level="info", hold_ms=100)
        await harness.wait_started([worker])
        serve = await start_local(config(redis_url, namespace))
        producer = Producer(harness.client, namespace)
        chromium = await browser(playwright)
        try:
            page = await chromium.new_page()
            await page.goto(f"{serve.url}/v1/turns/{rid}/view?token={token(rid)}")
            await page.wait_for_function(
                "document.getElementById('connection').textContent === 'live'")
            for update in HANDOFF:
                await producer.send(rid, update, ids={"thread_id": "thread-1"})
                await harness.wait_applied()  # each update its own batch of live deltas
            await shows(page, "Hi, I'm Bob from billing. Your invoice #42 was paid on May 3.")
            live = await page.evaluate(READ_VIEW)
            assert await page.get_attribute("body", "data-state") == "running"

            await producer.end(rid)
            merged = (await Subscriber(harness.client, namespace).wait_for(rid, 30)).response
            await page.wait_for_selector("body[data-state=completed]", timeout=30_000)
            final = await page.evaluate(READ_VIEW)
            assert live == final
            assert final == rendered(merged)
            assert [m["label"] for m in final] == ["alice", "tool", "alice", "bob"]
            await screenshot(page, tmp_path, "serve-view.png")
        finally:
            await chromium.close()
            await serve.close()


def _sse(*events: tuple[int | None, dict[str, Any]]) -> str:
    return "retry: 1000\n\n" + "".join(
        (f"id: {seq}\n" if seq is not None else "") + f"data: {json.dumps(event)}\n\n"
        for seq, event in events)


def _cancelled_stream(rid: str, reason_in: str) -> str:
    """A cancelled turn's stream with a cancel reason where the worker puts
    it (the terminal event, the merged entry's meta) or only in meta."""
    reason = "user pressed stop"
    common = {"response_id": rid, "synthesis_id": f"{rid}:", "ts": 0}
    message = {"type": "message", "role": "assistant", "author_name": "writer",
               "message_id": "m1", "contents": [{"type": "text", "text": "Let me write a "}]}
    terminal = {**common, "type": "synthesis", "seq": 2, "status": "cancelled",
                "content": "Let me write a ", "error": None, "agents": [],
                "counts": {"entries": 2, "updates": 1, "dropped": 0, "dlq": 0, "messages": 1}}
    if reason_in == "event":
        terminal["cancel_reason"] = reason
    return _sse(
        (0, {**common, "type": "synthesis.started", "seq": 0}),
        (1, {**common, "type": "synthesis.chunk", "seq": 1, "message_id": "m1",
             "agent_id": None, "author_name": "writer", "delta": "Let me write a ",
             "replace": False, "role": "assistant", "previous_message_id": None}),
        (None, {"type": "merged", "response_id": rid, "synthesis_id": f"{rid}:",
                "status": "cancelled",
                "response": {"type": "agent_response", "response_id": rid,
                             "messages": [message]},
                "meta": {"response_id": rid, "cancel_reason": reason}}),
        (2, terminal),
    )


async def test_a_cancelled_turn_shows_its_reason(redis_url, namespace, tmp_path: Path) -> None:
    """The page given a cancelled turn's events with ``cancel_reason`` (on
    the terminal event, or only in the merged entry's meta): "cancelled:
    <reason>". The events are the test's (the route stubs the stream): the
    worker's side is tested where the worker writes the reason."""
    rid = "turn-view-cancelled"
    serve = await start_local(config(redis_url, namespace))
    async with async_playwright() as playwright:
        chromium = await browser(playwright)
        try:
            for reason_in in ("meta", "event"):
                page = await chromium.new_page()

                async def stream(route: Route, reason_in: str = reason_in) -> None:
                    await route.fulfill(status=200, content_type="text/event-stream",
                                        body=_cancelled_stream(rid, reason_in))

                await page.route("**/events*", stream)
                await page.goto(f"{serve.url}/v1/turns/{rid}/view?token={token(rid)}")
                await page.wait_for_selector("body[data-state=cancelled]", timeout=30_000)
                assert await page.inner_text("#outcome") == "cancelled: user pressed stop"
                assert await page.get_attribute("body", "data-connection") == "done"
                assert await page.evaluate(READ_VIEW) == [{
                    "author": "writer", "role": "assistant", "label": "writer",
                    "parts": [["text", "Let me write a "]]}]
            await screenshot(page, tmp_path, "serve-view-cancelled.png")
        finally:
            await chromium.close()
            await serve.close()


async def test_a_turn_cancelled_through_serve_shows_its_reason_end_to_end(
    redis_url, namespace
) -> None:
    """The same with a real worker: a turn cancelled with ``POST .../cancel``
    and a reason shows "cancelled: <reason>" and the partial merge."""
    rid = "turn-view-cancel-e2e"
    async with _watched(redis_url, namespace) as (harness, serve, chromium):
        page = await chromium.new_page()
        await page.goto(f"{serve.url}/v1/turns/{rid}/view?token={token(rid)}")
        await Producer(harness.client, namespace).send(rid, {
            "role": "assistant", "author_name": "writer", "message_id": "m1",
            "contents": [{"type": "text", "text": "Let me write a "}]})
        await shows(page, "Let me write a ")
        async with aiohttp.ClientSession() as session, session.post(
                f"{serve.url}/v1/turns/{rid}/cancel", headers=bearer(rid),
                json={"reason": "user pressed stop"}) as response:
            assert response.status == 202
        await page.wait_for_selector("body[data-state=cancelled]", timeout=30_000)
        assert await page.inner_text("#outcome") == "cancelled: user pressed stop"
        merged = (await Subscriber(harness.client, namespace).wait_for(rid, 30)).response
        assert await page.evaluate(READ_VIEW) == rendered(merged)


#: Markup a producer (or an agent echoing its user) may put in a turn.
HOSTILE = '<img src="x" onerror="window.pwned=1"><b>bold</b><script>window.pwned=2</script>'


async def test_turn_content_is_shown_as_text_and_the_token_travels_in_a_header(
    redis_url, namespace
) -> None:
    """docs/security.md, tokens in URLs: a turn whose text, author, tool
    call and result are HTML shows them as text (no element made from
    them, no script of theirs run), live and merged; and the page, opened
    with ``?token=``, asks for the event stream with the token in the
    ``Authorization`` header, not in the URL."""
    rid, given = "turn-view-hostile", ""
    async with _watched(redis_url, namespace) as (harness, serve, chromium):
        page = await chromium.new_page()
        streams: list[tuple[str, dict[str, str]]] = []
        page.on("request", lambda request: streams.append(
            (request.url, request.headers)) if "/events" in request.url else None)
        given = token(rid)
        await page.goto(f"{serve.url}/v1/turns/{rid}/view?token={given}")
        producer = Producer(harness.client, namespace)
        await producer.send(rid, update([text(HOSTILE)], HOSTILE, "m1"))
        await shows(page, HOSTILE)
        await producer.send(rid, update(
            [{"type": "function_call", "call_id": "c1", "name": HOSTILE,
              "arguments": HOSTILE}], HOSTILE, "m2"))
        await producer.send(rid, update(
            [{"type": "function_result", "call_id": "c1", "result": HOSTILE}], None,
            "t1", role="tool"))
        await producer.end(rid)
        await page.wait_for_selector("body[data-state=completed]", timeout=30_000)
        merged = (await Subscriber(harness.client, namespace).wait_for(rid, 30)).response
        view = await page.evaluate(READ_VIEW)
        assert view == rendered(merged)
        assert [m["label"] for m in view] == [HOSTILE, HOSTILE, "tool"]
        assert await page.evaluate("() => window.pwned") is None
        assert await page.evaluate(
            "() => document.querySelectorAll('#messages img, #messages b, "
            "#messages script, .message img, .message b, .message script').length") == 0
        assert streams, "the page never asked for the event stream"
        for url, headers in streams:
            assert "token=" not in url, url
            assert headers.get("authorization") == f"Bearer {given}"

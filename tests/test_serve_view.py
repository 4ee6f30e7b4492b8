"""The page that watches a turn (``GET /v1/turns/{id}/view``), in a real
browser: Debian's headless Chromium driven by Playwright, against a real
``processor serve``, a real ``processor run --progress`` and a private
Redis. What it renders is the merged response, also when the test kills
the server mid-turn and starts it again (the page resumes by itself)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright
from serve_harness import spawn_serve, token
from worker_harness import Harness

from processor.client import Producer, Subscriber

#: Debian's Chromium (.ci/run installs it); Playwright drives it, never downloads one.
CHROMIUM = "/usr/bin/chromium"

#: What the page shows, as the test reads it back: per message its author,
#: role and parts (text, reasoning, tool call name and arguments, result).
READ_VIEW = """() => [...document.querySelectorAll('.message')].map(m => ({
  author: m.dataset.author || null,
  role: m.dataset.role,
  parts: [...m.children].slice(1).map(p =>
    p.classList.contains('call')
      ? ['call', p.querySelector('.name').textContent, p.querySelector('.args').textContent]
    : p.classList.contains('result') ? ['result', p.querySelector('.value').textContent]
    : [p.className, p.textContent]),
}))"""


def rendered(response: dict[str, Any]) -> list[dict[str, Any]]:
    """What the page must show for a merged response (its rendering rules)."""
    out = []
    for message in response["messages"]:
        parts: list[list[str]] = []
        for content in message["contents"]:
            kind = content["type"]
            if kind in ("text", "text_reasoning"):
                name = "text" if kind == "text" else "reasoning"
                if parts and parts[-1][0] == name:
                    parts[-1][1] += content.get("text") or ""
                else:
                    parts.append([name, content.get("text") or ""])
            elif kind == "function_call":
                arguments = content.get("arguments")
                parts.append(["call", content.get("name") or "", arguments
                              if isinstance(arguments, str) else json.dumps(arguments)])
            elif kind == "function_result":
                parts.append(["result", str(content.get("result"))])
            elif kind != "usage":
                parts.append(["other", f"[{kind}]"])
        out.append({"author": message.get("author_name"), "role": message["role"],
                    "parts": parts})
    return out


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


async def _shows(page: Page, expected: str) -> None:
    """Until some message's text is ``expected`` (the live view, from deltas)."""
    await page.wait_for_function(
        "want => [...document.querySelectorAll('.message .text')].some("
        "t => t.textContent === want)", arg=expected, timeout=30_000)


async def test_the_page_renders_the_merged_response_across_a_server_restart(
    redis_url, namespace, tmp_path: Path
) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    rid = "turn-view-1"
    async with Harness(redis_url, namespace, log_dir=tmp_path) as harness, \
            async_playwright() as playwright:
        worker = harness.spawn(progress=True, log_level="info")
        await harness.wait_started([worker])  # the namespace's record, which serve reads
        serve = spawn_serve(redis_url, namespace, tmp_path)
        producer = Producer(harness.client, namespace)
        browser = await playwright.chromium.launch(executable_path=CHROMIUM,
                                                   args=["--no-sandbox", "--headless"])
        try:
            await harness.wait_started([worker])
            await serve.wait_serving()
            page = await browser.new_page()
            await page.goto(f"{serve.url}/v1/turns/{rid}/view?token={token(rid)}")
            for entry in BEFORE_THE_CUT:
                await producer.send(rid, entry)
            await _shows(page, "Hi, I'm ")
            assert await page.get_attribute("#connection", "data-connections") == "1"

            serve.kill()  # mid-turn: the page loses its stream
            for entry in AFTER_THE_CUT:
                await producer.send(rid, entry)
            await harness.wait_applied()
            serve = spawn_serve(redis_url, namespace, tmp_path, port=serve.port)
            await serve.wait_serving()

            # Resumed from its last id: the deltas it missed, none twice.
            await _shows(page, "Hi, I'm Bob. Your invoice INV-7 was paid on 3 May.")
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
            await browser.close()
            serve.kill()

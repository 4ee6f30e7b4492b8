"""The page that watches a turn (``GET /v1/turns/{id}/view``) given a
refused token, in a real browser (Debian's headless Chromium driven by
Playwright) against a real ``processor serve``: a bad, expired, another turn's
or missing token on the first load, and a token that expires while the page
reconnects (a real ``processor run --progress`` and a private Redis; no more
retries then), are said on the page in words.

``PROCESSOR_SCREENSHOTS=docs`` (a directory) makes the tests save the
screenshot docs/serve.md shows there: ``serve-view-expired.png``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from playwright.async_api import async_playwright
from support.serve_harness import SECRET, config, spawn_serve, start_local, token
from support.view_pages import browser, screenshot, shows
from support.worker_harness import Harness

from processor.cli.demo import HANDOFF
from processor.client import Producer, Subscriber
from processor.serve.tokens import issue

_REFUSALS = [  # (what the token is, HTTP status, the page's heading)
    ("nonsense", 401, "This link's token is not valid here"),
    ("expired", 401, "This link has expired"),
    ("another turn's", 403, "This link is for another turn"),
    ("missing", 401, "This link has no token for the turn"),
]


async def test_a_refused_token_on_first_load_is_said_on_the_page(
    redis_url, namespace, tmp_path: Path
) -> None:
    """A bad, expired, another turn's or no token: the page (with the
    refusal's status) says what happened and what to do, in words."""
    rid = "turn-view-refused"
    tokens = {"nonsense": "nonsense", "expired": issue(SECRET, rid, int(time.time()) - 5),
              "another turn's": token("another-turn"), "missing": None}
    serve = await start_local(config(redis_url, namespace))
    async with async_playwright() as playwright:
        chromium = await browser(playwright)
        try:
            for kind, status, heading in _REFUSALS:
                page = await chromium.new_page()
                given = tokens[kind]
                query = f"?token={given}" if given else ""
                response = await page.goto(f"{serve.url}/v1/turns/{rid}/view{query}")
                assert response is not None and response.status == status, kind
                await page.wait_for_selector("#problem:not([hidden])", timeout=30_000)
                assert await page.inner_text("#problem-title") == heading, kind
                assert "new one" in await page.inner_text("#problem-advice")
                assert '"error"' not in await page.inner_text("body")
                assert await page.get_attribute("body", "data-connection") == "stopped"
                await page.close()
        finally:
            await chromium.close()
            await serve.close()


async def test_a_token_that_expires_while_the_page_reconnects_stops_it_and_says_so(
    redis_url, namespace, tmp_path: Path
) -> None:
    """The server goes away mid-turn; the turn ends; the page's token
    expires before the server is back: its reconnect gets a 401, and the
    page stops (one 401, no retries after it) and says so, instead of
    "reconnecting" for good."""
    rid = "turn-view-expiring"
    async with Harness(redis_url, namespace, log_dir=tmp_path) as harness, \
            async_playwright() as playwright:
        worker = harness.spawn(progress=True, log_level="info")
        await harness.wait_started([worker])
        serve = spawn_serve(redis_url, namespace, tmp_path)
        producer = Producer(harness.client, namespace)
        chromium = await browser(playwright)
        refused: list[int] = []
        try:
            await serve.wait_serving()
            page = await chromium.new_page()
            page.on("response", lambda r: refused.append(r.status)
                    if "/events" in r.url and r.status == 401 else None)
            expires = int(time.time()) + 6
            await page.goto(f"{serve.url}/v1/turns/{rid}/view?token={issue(SECRET, rid, expires)}")
            await producer.send(rid, HANDOFF[5])
            await shows(page, "Hi, I'm Bob from billing. ")

            serve.kill()
            await producer.send(rid, HANDOFF[7])
            await producer.end(rid)
            await Subscriber(harness.client, namespace).wait_for(rid, 30)
            await asyncio.sleep(max(0.0, expires + 1 - time.time()))  # the token has expired
            serve = spawn_serve(redis_url, namespace, tmp_path, port=serve.port)
            await serve.wait_serving()

            await page.wait_for_selector("#problem:not([hidden])", timeout=30_000)
            assert await page.inner_text("#problem-title") == "This link has expired"
            assert "Stopped following" in await page.inner_text("#problem-advice")
            assert await page.get_attribute("body", "data-connection") == "stopped"
            assert await page.get_attribute("body", "data-state") == "unknown"
            await asyncio.sleep(3)  # three of the page's retry periods: it asks no more
            assert refused == [401]
            await screenshot(page, tmp_path, "serve-view-expired.png")
        finally:
            await chromium.close()
            serve.kill()

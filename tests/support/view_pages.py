"""The page of ``processor serve`` in a real browser, for the view tests
(tests/serve/test_serve_view*.py): Debian's headless Chromium launched by
Playwright, a screenshot of the page (``PROCESSOR_SCREENSHOTS=<dir>`` saves it
there too), and a wait until a message shows a text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, Playwright

#: Debian's Chromium (.ci/run installs it); Playwright drives it, never downloads one.
CHROMIUM = "/usr/bin/chromium"


async def browser(playwright: Playwright) -> Browser:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    return await playwright.chromium.launch(executable_path=CHROMIUM,
                                            args=["--no-sandbox", "--headless"])


async def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    """The page as a picture, in the test's directory and, with
    ``PROCESSOR_SCREENSHOTS=<dir>``, in that directory (docs/ for serve.md)."""
    await page.set_viewport_size({"width": 900, "height": 200})  # full_page grows to fit
    await page.screenshot(path=str(tmp_path / name), full_page=True)
    where = os.environ.get("PROCESSOR_SCREENSHOTS")
    if where:
        await page.screenshot(path=str(Path(where) / name), full_page=True)


async def shows(page: Page, expected: str) -> None:
    """Until some message's text is ``expected`` (the live view, from deltas)."""
    await page.wait_for_function(
        "want => [...document.querySelectorAll('.message .text')].some("
        "t => t.textContent === want)", arg=expected, timeout=30_000)

"""`processor demo` (the README's run command) works on an embedded Redis."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.request

import aiohttp
from support.serve_harness import SECRET, config, start_local


def test_demo_prints_three_turns_with_their_outcomes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "processor.cli", "demo", "--pace", "0.01"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "== demo-handoff: completed" in out
    assert "== demo-cancel: cancelled" in out
    assert "cancel reason: user pressed stop" in out
    assert "== demo-error: error" in out
    assert "producer_error: model quota exceeded" in out
    # The handoff streamed live: its text came in chunks before its end (the
    # workers read one shard each before the producer starts).
    handoff = out[out.index("== demo-handoff"):].split("\n== ")[0]
    assert "synthesis.chunk" in handoff and "tool_call.chunk" in handoff, handoff
    # Bob's two deltas joined in one message although Alice spoke between them.
    assert "Hi, I'm Bob from billing. Your invoice #42 was paid on May 3." in out
    assert "started an embedded redis-server" in proc.stderr
    assert re.search(r"\n  http://127\.0\.0\.1:\d+/v1/turns/demo-handoff/view\?token=v1\.", out)


def test_demo_serves_the_handoffs_page_and_stream_while_it_runs() -> None:
    """The demo prints the handoff's watch page URL before it streams the turn;
    that page and the turn's event stream are served (with the URL's token)
    while the demo runs, and the stream ends with the merged handoff."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "processor.cli", "demo", "--port", "0", "--pace", "0.2",
         "--linger", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        while not lines or "/view?token=" not in lines[-1]:
            line = proc.stdout.readline()
            assert line, f"the demo ended without a page URL: {lines} {proc.stderr.read()}"
            lines.append(line)
        url = lines[-1].strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1/turns/demo-handoff/view\?token=\S+",
                            url), url
        assert "watch the handoff live" in lines[-2]
        base, token = url.split("/v1/")[0], url.split("token=")[1]
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
        with urllib.request.urlopen(f"{base}/v1/turns/demo-handoff/events?token={token}",
                                    timeout=30) as stream:
            body = stream.read().decode()  # until the terminal event closes the stream
        data = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
        assert data[0]["type"] in ("synthesis.started", "snapshot")  # (a join mid-turn)
        assert [d["type"] for d in data[-2:]] == ["merged", "synthesis"]
        assert data[-1]["status"] == "completed"
        texts = [c.get("text") for m in data[-2]["response"]["messages"] for c in m["contents"]]
        assert "Hi, I'm Bob from billing. Your invoice #42 was paid on May 3." in texts
        rest = proc.stdout.read()
        assert "== demo-handoff: completed" in rest and "serving the pages for 5 s" in rest
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


async def test_demo_prints_the_page_on_a_server_already_running(redis_url: str) -> None:
    """With --serve-url (and that server's Redis and secret) the demo starts
    no server of its own and the page URL it prints opens the turn there."""
    serve = await start_local(config(redis_url, "demo"))
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "processor.cli", "demo", "--pace", "0.01", "--redis-url",
            redis_url, "--serve-url", serve.url, "--token-secret", SECRET,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        (url,) = [line.strip() for line in out.decode().splitlines() if "/view?token=" in line]
        assert url.startswith(f"{serve.url}/v1/turns/demo-handoff/view?token=")
        token = url.split("token=")[1]
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as page:
                assert page.status == 200
            async with session.get(f"{serve.url}/v1/turns/demo-handoff?token={token}") as turn:
                assert turn.status == 200 and (await turn.json())["status"] == "completed"
        assert "started an embedded redis-server" not in err.decode()
    finally:
        await serve.close()


def test_on_a_terminal_the_demo_serves_its_pages_until_ctrl_c() -> None:
    """On a terminal the watch page outlived the command by 30 s only (and
    not at all without a terminal): now the demo keeps serving after the
    turns end, says so, and stops cleanly on Ctrl-C (exit 0)."""
    import os
    import pty
    import select
    import signal
    import time

    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "processor.cli", "demo", "--pace", "0.01"],
                            stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    out = ""

    def read_until(text: str, timeout: float = 120) -> None:
        nonlocal out
        deadline = time.monotonic() + timeout
        while text not in out:
            assert time.monotonic() < deadline, out
            if select.select([controller], [], [], 0.2)[0]:
                try:
                    out += os.read(controller, 65536).decode(errors="replace")
                except OSError:  # EIO: the demo has exited, all it wrote was read
                    raise AssertionError(f"the demo ended (status {proc.wait()}): {out}") from None

    try:
        read_until("until Ctrl-C")
        assert "== demo-error: error" in out  # the turns have ended ...
        url = re.search(r"http://127\.0\.0\.1:\d+/v1/turns/demo-handoff/view\?token=\S+",
                        out).group(0)
        time.sleep(1)  # ... and a page opened later is still served
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        read_until("processor demo: stopped", timeout=30)
        assert proc.wait(30) == 0, out
        assert "Traceback" not in out
    finally:
        os.close(controller)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_linger_is_documented_in_help_and_readme() -> None:
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-m", "processor.cli", "demo", "--help"],
                          capture_output=True, text=True, timeout=60, check=True)
    text = " ".join(proc.stdout.split())
    assert "--linger SECONDS seconds to keep serving the pages after the turns end " \
        "(default: until Ctrl-C when stdout is a terminal, else 0" in text, text
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "until Ctrl-C" in readme and "`--linger SECONDS`" in readme

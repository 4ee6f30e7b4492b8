"""The real JavaScript clients (tests/js: ``@ag-ui/client``, the AI SDK's
``ai``, ``eventsource``, ``@microsoft/fetch-event-source``), pinned by
tests/js/package-lock.json and installed with ``npm ci`` the first time a
test needs them. A test runs one of the scripts in tests/js with Node.js
and reads the one JSON document it prints last."""

from __future__ import annotations

import asyncio
import fcntl
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

JS = Path(__file__).resolve().parents[1] / "js"


def node() -> str:
    """The ``node`` binary; fails the test (not skips it) when there is none."""
    found = shutil.which("node")
    if found is None or shutil.which("npm") is None:
        pytest.fail("no Node.js 20 and npm on PATH: apt-get install -y nodejs npm")
    return found


def install() -> None:
    """``npm ci`` in tests/js unless its node_modules matches the lockfile
    (one process at a time: the suite runs in several)."""
    node()
    stamp = JS / "node_modules" / ".package-lock.json"
    lock = JS / "package-lock.json"
    with open(JS / ".npm-ci.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if stamp.exists() and stamp.stat().st_mtime >= lock.stat().st_mtime:
            return
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=JS,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.fail(f"npm ci in {JS} failed: {done.stderr.strip()[-2000:]}")


async def run(script: str, *args: str, timeout: float = 60.0) -> Any:
    """Run ``tests/js/<script>`` with ``args``; its last stdout line, as JSON."""
    install()
    proc = await asyncio.create_subprocess_exec(
        node(), str(JS / script), *args, cwd=JS,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{script} {' '.join(args)} did not finish in {timeout:g}s") \
            from None
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"{script} exited {proc.returncode}:\n{err.decode()[-4000:]}")
    return json.loads(lines[-1])

"""Running the operator tools (``processor stats|tail|dlq``) as a user would:
``python -m processor.cli.main`` in a subprocess, its stdout a pipe (so tables
are plain lines: ``plain_rows``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)}


def command(url: str, namespace: str, shards: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "processor.cli", *args, "--redis-url", url,
            "--namespace", namespace, "--shards", str(shards)]


def run(url: str, namespace: str, shards: int, *args: str,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one tool to completion (blocking: no in-process worker moves meanwhile)."""
    return subprocess.run(command(url, namespace, shards, *args), capture_output=True,
                          text=True, timeout=60, check=False, env=ENV, input=stdin)


async def arun(url: str, namespace: str, shards: int, *args: str) -> tuple[int, str, str]:
    """Run one tool to completion while the event loop (in-process workers) keeps going."""
    proc = await asyncio.create_subprocess_exec(
        *command(url, namespace, shards, *args), env=ENV,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def plain_rows(text: str) -> list[list[str]]:
    """The header and body rows of the plain tables a tool prints when its
    stdout is not a terminal: columns apart by two spaces or more; ``#``
    lines are titles and notes."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()
            if line.strip() and not line.startswith("#")]


def call(capsys: Any, url: str, namespace: str, shards: int, *args: str) -> tuple[int, str, str]:
    """The same command in-process (``processor.cli.main.main``): for quick checks of
    arguments and messages, from sync tests only (the tool runs its own loop)."""
    from processor.cli.main import main

    capsys.readouterr()
    code = main(command(url, namespace, shards, *args)[3:])
    out, err = capsys.readouterr()
    return code, out, err

"""``processor stats`` and ``dlq list`` as a user at an 80-column terminal
and in a pipe sees them: headers whole, every id (DLQ id, source id, turn,
consumer) whole on one line so it can be copied; in a pipe, plain aligned
columns without any table drawing."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import termios
from typing import Any

from support.cli_tools import ENV, command, plain_rows
from support.worker_harness import Harness

SHARDS = 2
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TURN = "a-turn-whose-response-id-is-rather-long-0123456789"
CONSUMER = "worker-on-a-host-with-a-long-name-4242-deadbeef"


def _piped(url: str, namespace: str, *args: str) -> str:
    proc = subprocess.run(command(url, namespace, SHARDS, *args), capture_output=True,
                          text=True, timeout=60, check=False, env={**ENV, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _on_a_terminal(url: str, namespace: str, *args: str, columns: int = 80) -> str:
    """The output of a command whose stdout is a terminal ``columns`` wide."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**ENV, "COLUMNS": str(columns), "TERM": "xterm-256color"}
    proc = subprocess.Popen(command(url, namespace, SHARDS, *args), stdout=slave,
                            stderr=subprocess.PIPE, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


async def _dead_letters(harness: Harness) -> list[dict[str, Any]]:
    await harness.start_worker(consumer=CONSUMER)
    await harness.add([{"response_id": TURN, "update": "{not json"},
                       {"response_id": f"{TURN}-b", "update": "[1]"},
                       {"response_id": "short", "update": "{bad"}])
    await harness.wait_applied()
    return (await harness.outputs()).dlq


def _whole_on_one_line(text: str, value: str) -> None:
    assert any(value in line for line in text.splitlines()), (value, text)


async def test_dlq_list_ids_are_whole_in_a_pipe_and_on_a_terminal(
    redis_url: str, namespace: str
) -> None:
    async with Harness(redis_url, namespace, SHARDS) as harness:
        letters = await _dead_letters(harness)
    assert len(letters) == 3
    piped = _piped(redis_url, namespace, "dlq", "list")
    terminal = _on_a_terminal(redis_url, namespace, "dlq", "list")
    for text in (piped, terminal):
        for letter in letters:
            for value in (letter["_id"], letter["source_id"], letter["response_id"]):
                _whole_on_one_line(text, value)
    # In a pipe: no drawing, one line per dead letter, its fields in the header's columns.
    assert not set("│┃━─┏└") & set(piped)
    rows = plain_rows(piped)
    assert rows[0] == ["shard", "id", "reason", "source id", "turn", "deliveries", "detail",
                       "payload"]
    # (A DLQ id is per shard's stream: two shards can have the same one.)
    by_id = {(row[0], row[1]): row for row in rows[1:]}
    assert set(by_id) == {(letter["_shard"], letter["_id"]) for letter in letters}
    for letter in letters:
        row = by_id[(letter["_shard"], letter["_id"])]
        assert row[2:6] == [letter["reason"], letter["source_id"], letter["response_id"], "1"]


async def test_stats_headers_and_names_are_whole_in_a_pipe_and_on_a_terminal(
    redis_url: str, namespace: str
) -> None:
    async with Harness(redis_url, namespace, SHARDS) as harness:
        await _dead_letters(harness)
        piped = _piped(redis_url, namespace, "stats")
        terminal = _on_a_terminal(redis_url, namespace, "stats")
    headers = ["shard", "length", "lag", "pending", "consumers", "active", "closing", "dlq",
               "merged", "events"]
    for text in (piped, terminal):
        assert "…" not in text
        for header in headers:
            assert any(header in line.split() for line in text.splitlines()), (header, text)
        _whole_on_one_line(text, CONSUMER)
    assert all(len(line) <= 80 for line in terminal.splitlines()), terminal
    assert not set("│┃━─┏└") & set(piped)
    rows = plain_rows(piped)
    assert headers in rows
    shard_rows = [row for row in rows if len(row) == len(headers) and row[0] in ("0", "1")]
    assert sorted(row[0] for row in shard_rows) == ["0", "1"]
    assert sum(int(row[7]) for row in shard_rows) == 3  # the dead letters
    assert ["0", CONSUMER] in [row[:2] for row in rows]

"""What a user sees when something is wrong, running ``processor`` as a
subprocess: one line and an exit status, never a traceback. Bad arguments
and bad environment values exit 2, an unreachable Redis 1; the URL is named
with its password masked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from support.cli_tools import ROOT

from processor.host.config import OPTIONS
from processor.wire.keys import Namespace
from processor.wire.schema import SCHEMAS

#: Every command that talks to Redis, with the arguments it needs (after the
#: URL and the environment have been checked, none of them is used).
COMMANDS = [
    ["stats"],
    ["tail", "--no-follow"],
    ["dlq", "list"],
    ["dlq", "show", "1-0"],
    ["dlq", "replay", "1-0"],
    ["cancel", "turn-1"],
    ["capture", "--no-follow"],
]
UNREACHABLE = "redis://reader:s3cret@127.0.0.1:1"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PROCESSOR_") and k != "REDIS_URL"}
    return {**env, "PYTHONPATH": str(ROOT), "COLUMNS": "250", **extra}


def _run(*argv: str, env: dict[str, str] | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "processor.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, check=False, env=env or _env(), cwd=ROOT)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_a_bad_environment_value_is_one_line_for_every_command() -> None:
    env = _env(PROCESSOR_SHARDS="abc")
    version = _run("--version", env=env)
    assert version.returncode == 0 and version.stdout.startswith("processor "), version.stderr
    for argv in [*COMMANDS, ["run"], ["init"]]:
        proc = _run(*argv, "--redis-url", UNREACHABLE, env=env)
        name = " ".join(argv[:2] if argv[0] == "dlq" else argv[:1])
        assert proc.returncode == 2, (argv, proc.stderr)
        assert _one_line(proc) == (
            f"processor {name}: PROCESSOR_SHARDS: expected an integer, got 'abc'"), argv
    proc = _run("stats", "--redis-url", UNREACHABLE, env=_env(PROCESSOR_SHARDS="0"))
    assert proc.returncode == 2
    assert _one_line(proc) == "processor stats: PROCESSOR_SHARDS: must be at least 1, got '0'"
    proc = _run("tail", "--redis-url", UNREACHABLE,
                env=_env(PROCESSOR_SSL_CA_CERTS="/no/such/ca.pem"))
    assert proc.returncode == 2
    assert _one_line(proc) == "processor tail: --ssl-ca-certs: no such file '/no/such/ca.pem'"


def test_an_unreachable_redis_is_one_line_naming_the_url_for_every_command() -> None:
    for argv in COMMANDS:
        proc = _run(*argv, "--redis-url", UNREACHABLE)
        assert proc.returncode == 1, (argv, proc.stderr)
        line = _one_line(proc)
        assert "redis://reader:***@127.0.0.1:1" in line, line
        assert "s3cret" not in proc.stderr + proc.stdout
        assert re.search(r"127\.0\.0\.1:1: Error \d+ connecting", line), line  # the cause


@pytest.mark.parametrize("url", ["http://user:s3cret@example.org", "redis://user:s3cret@h:port"])
def test_a_malformed_url_is_one_line_for_every_command(url: str) -> None:
    for argv in COMMANDS:
        proc = _run(*argv, "--redis-url", url)
        assert proc.returncode == 2, (argv, proc.stderr)
        line = _one_line(proc)
        assert line.startswith(f"processor {argv[0]}"), line
        assert "s3cret" not in proc.stderr


def test_init_gives_up_on_an_unreachable_redis_and_says_why() -> None:
    proc = _run("init", "--redis-url", UNREACHABLE, "--connect-timeout", "1")
    assert proc.returncode == 1, proc.stderr
    assert "s3cret" not in proc.stderr
    *retries, last = proc.stderr.strip().splitlines()
    assert retries, "each failed attempt is logged"
    for line in retries:
        record = json.loads(line)
        assert record["url"] == "redis://reader:***@127.0.0.1:1"
        assert re.match(r"Error \d+ connecting to 127\.0\.0\.1:1", record["error"])
    assert last.startswith("processor init: cannot reach Redis at redis://reader:***@127.0.0.1:1")
    assert re.search(r"\): Error \d+ connecting to 127\.0\.0\.1:1", last), last


#: A retry as a person reads it on a terminal (--log-format auto).
HUMAN_RETRY = re.compile(
    r"\d\d:\d\d:\d\d warning redis unreachable, retrying \(url=redis://reader:\*\*\*@127\.0\.0\.1:1"
    r", error=Error \d+ connecting to 127\.0\.0\.1:1\. .+, retry_in=\d+(\.\d)?\)")


def _on_terminal(*argv: str, until: str | None = None,
                 timeout: float = 60) -> tuple[int, list[str]]:
    """Run a command with stdout and stderr on a pseudo-terminal, as a person
    at a shell would: its exit status and the lines it wrote. With ``until``,
    SIGTERM it once that text has appeared twice."""
    import pty
    import select
    import signal
    import time

    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "processor.cli", *argv],
                            stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal,
                            env=_env(), cwd=ROOT)
    os.close(terminal)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if until and out.decode(errors="replace").count(until) >= 2 and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                until = None
            if not select.select([controller], [], [], 0.2)[0]:
                continue
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's last writer has gone
                break
            if not chunk:
                break
            out += chunk
        return proc.wait(timeout), out.decode().replace("\r\n", "\n").strip().splitlines()
    finally:
        os.close(controller)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_init_on_a_terminal_says_each_attempt_in_one_human_line_then_gives_up() -> None:
    """It used to print JSON lines on a terminal too (17 of them over 60 s by
    default before its error); JSON stays the format off a terminal (above)."""
    status, lines = _on_terminal("init", "--redis-url", UNREACHABLE, "--connect-timeout", "1")
    assert status == 1, lines
    *retries, last = lines
    assert retries, lines
    for line in retries:
        assert HUMAN_RETRY.fullmatch(line), line
    assert last.startswith("processor init: cannot reach Redis at redis://reader:***@127.0.0.1:1 "
                           "(gave up after 1 s): Error "), last
    assert "s3cret" not in "\n".join(lines)
    # --log-format json keeps JSON on a terminal, --log-format text gives text off one.
    status, lines = _on_terminal("init", "--redis-url", UNREACHABLE, "--connect-timeout", "1",
                                 "--log-format", "json")
    assert status == 1 and json.loads(lines[0])["msg"] == "redis unreachable, retrying", lines
    proc = _run("init", "--redis-url", UNREACHABLE, "--connect-timeout", "1",
                "--log-format", "text")
    assert proc.returncode == 1 and HUMAN_RETRY.fullmatch(proc.stderr.splitlines()[0]), proc.stderr
    proc = _run("init", "--redis-url", UNREACHABLE, "--log-format", "yaml")
    assert proc.returncode == 2
    assert _one_line(proc) == "processor init: --log-format must be auto, json or text, got 'yaml'"


def test_run_on_a_terminal_retries_in_human_lines_until_stopped() -> None:
    """A worker waits for its Redis for ever (it may start later), one line
    per attempt; SIGTERM stops it cleanly."""
    status, lines = _on_terminal("run", "--redis-url", UNREACHABLE,
                                 until="redis unreachable, retrying")
    assert status == 0, lines
    retries = [line for line in lines if "redis unreachable" in line]
    assert len(retries) >= 2 and all(HUMAN_RETRY.fullmatch(line) for line in retries), lines
    assert not any(line.startswith("{") for line in lines), lines
    assert lines[-1].endswith(" info stopped cleanly"), lines


def _flags(help_text: str) -> set[str]:
    """The flags a --help lists (the lines that start with one)."""
    return set(re.findall(r"^\s+(?:-h, )?(--[a-z][a-z-]+)", help_text, re.M))


def test_help_names_the_variable_of_every_option() -> None:
    by_flag = {opt.flag: opt for opt in OPTIONS}
    for argv in [["stats"], ["tail"], ["dlq", "list"], ["cancel"], ["capture"], ["init"]]:
        proc = _run(*argv, "--help")
        assert proc.returncode == 0, proc.stderr
        text = " ".join(proc.stdout.split())
        for flag in ("--namespace", "--shards"):
            opt = by_flag[flag]
            assert f"{flag} {opt.name.upper()} {opt.help}" in text, (argv, flag)
            assert f"(env {opt.env}, default {opt.default})" in text, (argv, flag)


def test_init_lists_only_the_options_it_uses() -> None:
    proc = _run("init", "--help")
    assert proc.returncode == 0, proc.stderr
    assert _flags(proc.stdout) == {
        "--help", "--redis-url", "--namespace", "--shards", "--group", "--connect-timeout",
        "--log-level", "--log-format", "--ssl-ca-certs", "--ssl-certfile", "--ssl-keyfile",
        "--reshard"}
    # ... and a run option's variable does not stop it
    proc = _run("init", "--redis-url", "http://x", env=_env(PROCESSOR_BATCH="lots"))
    assert _one_line(proc) == (
        "processor init: redis URL http://x must start with redis://, rediss:// or unix://")


def test_schema_help_lists_the_schema_names() -> None:
    proc = _run("schema", "--help")
    assert proc.returncode == 0, proc.stderr
    for name in SCHEMAS:
        assert re.search(rf"\b{name}\b", proc.stdout), name


# --------------------------------------------------------------------------- usage of a command


@pytest.mark.parametrize("argv", [["run", "--redis-ulr", "redis://h"], ["init", "--bogus"],
                                  ["dlq", "list", "--bogus"], ["schema", "a", "b"]])
def test_a_bad_option_shows_the_usage_of_its_command(argv: list[str]) -> None:
    """argparse reports an unknown option of a command with the top-level
    usage by default (``usage: processor [-h] ...``), which does not show the
    option meant; the command's own usage does, and the error names it."""
    proc = _run(*argv)
    assert proc.returncode == 2, proc.stderr
    command = " ".join(argv[:2] if argv[0] == "dlq" else argv[:1])
    usage, *_, error = proc.stderr.strip().splitlines()
    assert usage.startswith(f"usage: processor {command} "), proc.stderr
    assert error.startswith(f"processor {command}: error: unrecognized arguments: "), error
    assert "Traceback" not in proc.stderr


def test_a_typo_of_an_option_names_the_option_meant() -> None:
    proc = _run("run", "--redis-ulr", "redis://h")
    assert proc.stderr.strip().splitlines()[-1] == (
        "processor run: error: unrecognized arguments: --redis-ulr redis://h "
        "(did you mean --redis-url?)")


# --------------------------------------------------------------------------- a closed stdout


def _closed_stdout(*argv: str, stdin: bytes = b"",
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run a command whose stdout is a pipe nobody reads any more (``| head``
    having exited): every write to it fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "processor.cli", *argv], stdout=write_end,
                              stderr=subprocess.PIPE, input=stdin, timeout=60, check=False,
                              env=env or _env(), cwd=ROOT)
    finally:
        os.close(write_end)


def test_a_closed_stdout_ends_a_command_quietly(redis_url: str, namespace: str,
                                                redis_client: Any) -> None:
    """``processor schema | head -c 300`` used to end in a BrokenPipeError
    traceback: every command that writes to stdout now stops quietly, exit 0,
    as the operator tools already did."""
    entry = json.dumps({"response_id": "t1", "update": json.dumps(
        {"contents": [{"type": "text", "text": "hi"}]})})
    for argv, stdin in [(["schema"], b""), (["schema", "merged_entry"], b""),
                        (["merge", "-"], f"{entry}\n{entry}\n".encode()),
                        (["token", "t1", "--secret", "x" * 32], b""),
                        (["--help"], b""), (["run", "--help"], b"")]:
        proc = _closed_stdout(*argv, stdin=stdin)
        assert (proc.returncode, proc.stderr.decode()) == (0, ""), argv
    tools = ["--redis-url", redis_url, "--namespace", namespace]
    init = _run("init", *tools)
    assert init.returncode == 0, init.stderr
    event = {"type": "synthesis.started", "seq": 0, "response_id": "t1",
             "synthesis_id": "t1:synthesis"}
    redis_client.xadd(Namespace(namespace).shard(0).events, {"event": json.dumps(event)})
    for argv in [["stats"], ["stats", "--json"], ["tail", "--no-follow"],
                 ["tail", "--no-follow", "--json"], ["dlq", "list"], ["init"]]:
        proc = _closed_stdout(*argv, *tools)
        assert proc.returncode == 0, (argv, proc.stderr)
        err = proc.stderr.decode()  # (tail's count and where to resume: a note)
        assert "Traceback" not in err and "rror" not in err, (argv, err)


#: Runs ``processor`` with its arguments, then says which redis-py modules it imported.
_IMPORTS_OF = ("import runpy, sys\n"
               "sys.argv = ['processor', *sys.argv[1:]]\n"
               "try:\n"
               "    runpy.run_module('processor.cli', run_name='__main__')\n"
               "except SystemExit:\n"
               "    pass\n"
               "found = sorted(m for m in sys.modules if m.split('.')[0] == 'redis')\n"
               "print('redis modules:', found, file=sys.stderr)\n")


@pytest.mark.parametrize("argv", [
    ["--version"], ["--help"], ["schema", "response"], ["run", "--redis-ulr", "x"],
    ["token", "r1", "--secret", "s" * 32], ["init"], ["stats"], ["run"], ["serve"],
], ids=lambda argv: "-".join(argv[:2]))
def test_what_needs_no_connection_starts_without_redis_py(argv: list[str]) -> None:
    """Help, versions, schemas, tokens and bad options or values (here
    PROCESSOR_SHARDS) need no connection: they do not import redis-py,
    which is most of a command's start-up (a third of a second here)."""
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_OF, *argv], capture_output=True,
                          text=True, timeout=60, check=False, cwd=ROOT,
                          env=_env(PROCESSOR_SHARDS="abc"))
    assert proc.stderr.strip().splitlines()[-1] == "redis modules: []", proc.stderr[-2000:]

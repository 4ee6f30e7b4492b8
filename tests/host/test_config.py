"""``processor run`` configuration: every option is a flag and an environment
variable, documented in ``--help``; bad values are reported one line each
before anything starts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from support.worker_harness import ROOT

from processor.cli.main import build_parser, main
from processor.host.config import OPTIONS, RUN_OPTIONS, resolve, unknown_env, worker_config


def _args(*argv: str):
    return build_parser().parse_args(["run", *argv])


def test_help_documents_every_option_with_its_variable(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--redis-url" in text and "REDIS_URL" in text
    for opt in OPTIONS:
        if opt.name in RUN_OPTIONS:
            assert opt.flag in text and opt.env in text, opt.name


def test_every_option_is_settable_by_environment_and_flags_win() -> None:
    env = dict(PROCESSOR_NAMESPACE="envns", PROCESSOR_PROGRESS="yes",
               PROCESSOR_TURN_TIMEOUT="2.5", PROCESSOR_LOG_LEVEL="debug",
               REDIS_URL="redis://:pw@h:1")
    values, problems = resolve(_args(), env)
    assert problems == []
    assert values["namespace"] == "envns" and values["progress"] is True
    assert values["turn_timeout"] == 2.5 and values["shards"] == 1
    assert values["redis_url"] == "redis://:pw@h:1" and values["log_level"] == "debug"
    values, _ = resolve(_args("--namespace", "flagns", "--shards", "3",
                              "--redis-url", "redis://x:2"), {**env, "PROCESSOR_SHARDS": "9"})
    assert (values["namespace"], values["shards"], values["redis_url"]) == (
        "flagns", 3, "redis://x:2")
    # Each option is read from its own variable.
    for opt in OPTIONS:
        if opt.kind is int:
            values, problems = resolve(_args(), {opt.env: "7"})
            assert values[opt.name] == 7 and not problems, opt.name


def test_holding_turns_is_on_by_default_and_can_be_turned_off() -> None:
    values, problems = resolve(_args(), {})
    assert values["hold_turns"] is True and not problems
    assert worker_config(values).hold_turns
    for argv, env in [(("--no-hold-turns",), {}), ((), {"PROCESSOR_HOLD_TURNS": "0"}),
                      (("--no-hold-turns",), {"PROCESSOR_HOLD_TURNS": "1"})]:  # the flag wins
        values, problems = resolve(_args(*argv), env)
        assert values["hold_turns"] is False and not problems, (argv, env)
        assert not worker_config(values).hold_turns
    values, _ = resolve(_args("--hold-turns"), {"PROCESSOR_HOLD_TURNS": "off"})
    assert values["hold_turns"] is True
    values, _ = resolve(_args("--progress"), {})  # live progress (the default) holds too
    assert worker_config(values).hold_turns and worker_config(values).progress
    values, _ = resolve(_args("--no-progress"), {})
    assert worker_config(values).hold_turns and not worker_config(values).progress


def test_bad_configuration_is_one_line_per_problem() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PROCESSOR_") and k != "REDIS_URL"}
    env.update(PROCESSOR_BATCH="lots", PROCESSOR_PROGRESS="maybe", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "processor.cli", "run", "--shards", "0", "--turn-timeout", "nan",
         "--metrics-port", "70000", "--log-level", "loud", "--ssl-ca-certs", "/no/such/ca.pem",
         "--redis-url", "http://user:hunter2@h"],
        capture_output=True, text=True, timeout=30, cwd=ROOT, env=env,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "processor run: --shards: must be at least 1, got '0'",
        "processor run: --turn-timeout: expected a number, got 'nan'",
        "processor run: PROCESSOR_PROGRESS: expected true or false, got 'maybe'",
        "processor run: PROCESSOR_BATCH: expected an integer, got 'lots'",
        "processor run: --metrics-port: must be at most 65535, got '70000'",
        "processor run: log level must be debug, info, warning or error, got 'loud'",
        "processor run: redis URL http://user:***@h must start with redis://, rediss:// or unix://",
        "processor run: --ssl-ca-certs: no such file '/no/such/ca.pem'",
    ]


def test_unknown_processor_variables_are_named() -> None:
    assert unknown_env({"PROCESSOR_SHARD": "4", "PROCESSOR_SHARDS": "4", "HOME": "/"}) == [
        "PROCESSOR_SHARD"]


def test_run_warns_of_an_unknown_variable_by_name() -> None:
    """The warning is logged (it once crashed: ``name`` is reserved in log records);
    the metrics port is taken, so the worker stops right after it, before Redis."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = {**os.environ, "PROCESSOR_SHARD": "4"}
        done = subprocess.run(
            [sys.executable, "-m", "processor.cli", "run", "--redis-url", "redis://127.0.0.1:1",
             "--metrics-host", "127.0.0.1", "--metrics-port", str(port)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    warning, refusal = done.stderr.splitlines()
    assert json.loads(warning)["msg"] == "unknown environment variable ignored"
    assert json.loads(warning)["variable"] == "PROCESSOR_SHARD"
    assert refusal.startswith(f"processor run: cannot serve metrics on 127.0.0.1:{port}")


def test_the_operations_table_lists_every_option() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page[page.index("## Configuration"):page.index("## Scaling")]
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip(" `")
            for line in section.splitlines() if line.startswith("| `--")}
    assert rows.pop("--redis-url") == "REDIS_URL"
    assert rows == {opt.flag: opt.env for opt in OPTIONS}


def test_the_option_table_and_the_worker_config_default_alike() -> None:
    """One place for each default (processor/wire/defaults.py): the flags'
    defaults are WorkerConfig's and Limits'."""
    from processor.engine.lifecycle import Limits
    from processor.host.config import OPTIONS
    from processor.worker.worker import WorkerConfig

    config, limits = WorkerConfig(consumer="c"), Limits()
    sources = (config, limits)
    checked = 0
    for option in OPTIONS:
        source = next((s for s in sources if hasattr(s, option.name)), None)
        if source is None or option.name == "consumer":
            continue
        assert getattr(source, option.name) == option.default, option.name
        checked += 1
    assert checked >= 20


def test_init_gives_up_on_an_unreachable_redis_after_10_s_by_default() -> None:
    """(It was 60 s: a person at a terminal waited a minute for one line.)"""
    values, problems = resolve(build_parser().parse_args(["init"]), {})
    assert values["connect_timeout"] == 10 and not problems
    values, _ = resolve(build_parser().parse_args(["init"]), {"PROCESSOR_CONNECT_TIMEOUT": "60"})
    assert values["connect_timeout"] == 60

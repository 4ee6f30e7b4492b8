"""Every scenario of tests/data/scenarios through the engine API and the CLI.

Both paths must print the same bytes, and the output must meet the
scenario's expectations and the contract's invariants (scenarios/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import msgspec
import pytest
from support.expectations import check_scenario, scenario_lines, scenario_names, scenario_path

from processor.engine.offline import merge_lines

NAMES = scenario_names()


def api_output(name: str) -> bytes:
    """What ``processor merge`` prints, computed in-process."""
    merge = merge_lines(scenario_lines(name))
    return b"".join(msgspec.json.encode(result) + b"\n" for result in merge.results())


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "processor.cli", *args],
        input=stdin, capture_output=True, check=False, timeout=60,
    )


def parse(output: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines()]


def test_every_scenario_is_present() -> None:
    # The copy in tests/data must not silently lose scenarios.
    assert len(NAMES) >= 22
    assert {n.split("_")[0] for n in NAMES} >= {f"net{i:02d}" for i in range(1, 14)}


@pytest.mark.parametrize("name", NAMES)
def test_scenario_through_api_and_cli(name: str) -> None:
    expected = api_output(name)
    run = cli("merge", str(scenario_path(name)))
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout == expected, f"{name}: CLI and API outputs differ"
    assert run.stderr == b"", f"{name}: unexpected dead letters {run.stderr.decode()}"
    check_scenario(name, parse(expected))


def test_cli_reads_stdin_like_a_file() -> None:
    name = "seed_two_turns_interleaved"
    run = cli("merge", "-", stdin=scenario_path(name).read_bytes())
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout == api_output(name)


@pytest.mark.parametrize("name", NAMES)
def test_scenario_output_is_stable_across_runs(name: str) -> None:
    # Same file, same bytes: offline timestamps come from the input, not the clock.
    assert api_output(name) == api_output(name)

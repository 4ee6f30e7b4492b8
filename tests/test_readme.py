"""The README's worked example is what `processor merge` prints today."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec

from processor.offline import merge_lines

README = (Path(__file__).parent.parent / "README.md").read_text()


def _block(lang: str) -> str:
    match = re.search(rf"```{lang}\n(.*?)```", README, re.S)
    assert match, f"README has no {lang} block"
    return match.group(1)


def test_worked_example_matches_the_merge() -> None:
    results = list(merge_lines(_block("jsonl").splitlines()).results())
    assert len(results) == 1
    got = json.loads(msgspec.json.encode(results[0].response))
    expected = json.loads(_block("json"))
    assert got == expected


def test_set_up_commands_are_the_ones_ci_runs() -> None:
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert "python -m pytest -q" in README
    assert "python -m pytest -q" in ci

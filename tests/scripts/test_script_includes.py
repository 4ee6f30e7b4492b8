"""Lua includes (processor/scripts/__init__.py): fragments name the fragments
they use, includes nest, each fragment is pulled in once per script, and a
cycle is an error."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from processor.scripts import NAMES, IncludeCycle, expand, include, source
from processor.scripts.library import FUNCTIONS

_DEFINED = re.compile(r"^local function (\w+)", re.MULTILINE)
_INCLUDES = resources.files("processor.scripts") / "includes"
PARTS = sorted(p.name.removesuffix(".lua") for p in _INCLUDES.iterdir()
               if p.name.endswith(".lua"))


def _defines(part: str) -> set[str]:
    return set(_DEFINED.findall(include(part)))


def test_nested_includes_expand_each_fragment_once() -> None:
    parts = {"a": "--- includes/b\nA\n", "b": "--- includes/c\nB\n", "c": "C\n"}
    text = "--- includes/a\n--- includes/c\n--- includes/b\nmain\n"
    lines = [line for line in expand(text, parts.__getitem__).splitlines() if line]
    assert lines == ["C", "B", "A", "main"]


def test_an_include_cycle_is_an_error() -> None:
    parts = {"a": "--- includes/b\n", "b": "--- includes/a\n"}
    with pytest.raises(IncludeCycle, match="a -> b -> a"):
        expand("--- includes/a\n", parts.__getitem__)


@pytest.mark.parametrize("part", PARTS)
def test_a_fragment_includes_what_it_calls(part: str) -> None:
    """A fragment that calls another fragment's function names it itself
    (no fragment relies on the including script's order)."""
    own = include(part)
    named = set(re.findall(r"^--- includes/(\w+)", own, re.MULTILINE))
    for other in PARTS:
        if other == part:
            continue
        called = {fn for fn in _defines(other) if re.search(rf"\b{fn}\(", own)}
        assert not called or other in named, (part, other, called)


@pytest.mark.parametrize("name", sorted({*NAMES, *FUNCTIONS, "repair_stream",
                                         "replay_dead_letter", "create_namespace",
                                         "reshard_namespace", "read_inputs"}))
def test_every_script_defines_each_function_once_before_it_is_called(name: str) -> None:
    text = source(name)
    assert "--- includes/" not in text
    defined = _DEFINED.findall(text)
    assert len(defined) == len(set(defined)), name
    fragments = set().union(*(_defines(p) for p in PARTS))
    for fn in fragments:
        calls = [m.start() for m in re.finditer(rf"(?<!function )\b{fn}\(", text)]
        if calls:
            definition = re.search(rf"^local function {fn}\(", text, re.MULTILINE)
            assert definition is not None and definition.start() < min(calls), (name, fn)


def test_apply_entries_reads_its_argv_where_the_worker_puts_it() -> None:
    """``apply_entries``' ARGV layout is defined once (batches.APPLY_HEAD,
    APPLY_SENT, APPLY_TURNS); the script reads each value at that index."""
    from processor.scripts.stored_calls import APPLY_HEAD, APPLY_SENT, APPLY_TURNS

    text = source("apply_entries")
    sent = re.search(r"^local consumer, floor, read_from = (.*)$", text, re.MULTILINE)
    assert sent is not None
    first = len(APPLY_HEAD) + 1
    assert sent.group(1) == ", ".join(f"ARGV[{first + i}]" for i in range(len(APPLY_SENT)))
    assert re.search(rf"^local TURNS = {APPLY_TURNS}\b", text, re.MULTILINE)
    assert re.search(rf"^local unstarted_ttl = ARGV\[{APPLY_HEAD.index('done_ttl') + 1}\]",
                     text, re.MULTILINE)
    assert re.search(rf"^local group = ARGV\[{APPLY_HEAD.index('group') + 1}\]",
                     text, re.MULTILINE)

"""Each script call's KEYS and ARGV, as its builder (processor.scripts.*_calls)
makes them, have the layout its file's header states: the fixed keys and
arguments, so many per turn, and the optional last one. A builder and its
script changed apart (a key added to one, not the other) fail here, not in
a script that reads the wrong key."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from importlib import resources

import msgspec
import pytest

from processor.engine.compaction import Compaction
from processor.engine.live import _BLANK
from processor.engine.replay import Settled
from processor.scripts import Scripts
from processor.scripts.calls import ScriptCall
from processor.scripts.held_calls import (
    HeldCheckpoint,
    HeldOutcome,
    build_checkpoint_held,
    build_finalise_held,
    build_open,
)
from processor.scripts.live_calls import LiveTurn, build_publish_live
from processor.scripts.lost_calls import (
    build_dead_letter_lost,
    build_publish_lost,
    build_recreate_group,
)
from processor.scripts.membership_calls import build_admit, build_beat
from processor.scripts.stored_calls import build_apply, build_compact, build_finalise
from processor.scripts.sweep_calls import SweepSlice, build_cancelled, build_sweep
from processor.wire.ids import TurnKey
from processor.wire.keys import Namespace
from processor.wire.outputs import Step
from processor.worker.config import WorkerConfig

_PER_TURN = re.compile(r"(KEYS|ARGV)\[(\d+) \+ (\d+)\*\(t-1\) \+ [01]\.\.\d+\]")
_TRAILING = re.compile(r"(KEYS|ARGV)\[(\d+) \+ (\d+)\*T( \+ 1)?\]")
_FIXED = re.compile(r"(KEYS|ARGV)\[(\d+)\]")
_REST = re.compile(r"(KEYS|ARGV)\[(\d+)\.\.[^]]*\]")  # from there on, as many as given


@dataclass
class Layout:
    """One side (KEYS or ARGV) of a header: ``fixed`` first, ``per_turn``
    per turn, then ``trailing`` (``optional``: may be absent)."""

    fixed: int = 0
    per_turn: int = 0
    trailing: int = 0
    optional: bool = False
    rest: bool = False  # any number after the fixed ones (``ARGV[5..]``)

    def allows(self, n: int, turns: int) -> bool:
        base = self.fixed + self.per_turn * turns
        if self.rest:
            return n >= base
        return n == base + self.trailing or (self.optional and n == base)


def header(script: str) -> dict[str, Layout]:
    text = (resources.files("processor.scripts") / f"{script}.lua").read_text()
    head = text[text.index("--[==[") : text.index("]==]")]
    out = {"KEYS": Layout(), "ARGV": Layout()}
    for side, base, per in _PER_TURN.findall(head):
        out[side].per_turn = int(per)
        assert out[side].fixed in (0, int(base)), (script, side, base)
    for side, *_ in _TRAILING.findall(head):
        out[side].trailing = 1
        out[side].optional = side == "KEYS"  # (the AG-UI stream, with --agui only)
    for side, index in _FIXED.findall(head):
        out[side].fixed = max(out[side].fixed, int(index))
    for side, index in _REST.findall(head):
        assert out[side].fixed == int(index) - 1, (script, side, index)
        out[side].rest = True
    return out


NS = Namespace("layout", 1)
SHARD = NS.shard(0)
OPTIONS = WorkerConfig(group="g", consumer="c")
SETTLED = Settled("completed", b"\x90", b"\x90")


def _step(key: TurnKey) -> Step:
    return msgspec.structs.replace(
        _BLANK[Step], synthesis_id=key.synthesis_id(), response_id=key.response_id, step="text")


def _keys(n: int) -> list[TurnKey]:
    return [TurnKey(f"t{i}") for i in range(n)]


def _calls(turns: int) -> dict[str, ScriptCall]:
    keys = _keys(turns)
    entries = [(f"{i + 1}-0", {b"response_id": k.response_id.encode(), b"kind": b"end"})
               for i, k in enumerate(keys)]
    apply = build_apply(SHARD, entries, {}, OPTIONS, 0)
    return {
        "apply_entries": ScriptCall(apply.keys, apply.argv()),
        "publish_live": build_publish_live(
            SHARD, [LiveTurn(k, [_step(k)] * i, b"[]", i, False) for i, k in enumerate(keys)],
            OPTIONS, "s"),
        "checkpoint_held": build_checkpoint_held(
            SHARD, [HeldCheckpoint(k, 0, 1, 1, 1, b"s", "1-0", ["1-0"], {}) for k in keys],
            OPTIONS, "c"),
        "finalise_held": build_finalise_held(
            SHARD, [HeldOutcome(k, ["1-0"], [], SETTLED, "", [], 0, 0) for k in keys],
            OPTIONS, "c", "s"),
        "finalise_turns": build_finalise(SHARD, [(k, "1", SETTLED) for k in keys], OPTIONS),
        "open_turns": build_open(SHARD, {k: {} for k in keys}, OPTIONS, 0, "c"),
        "sweep_shard": build_sweep(SHARD, SweepSlice("g", 1000, 10, 0, 100, "c", "")),
        "cancelled_turns": build_cancelled(SHARD, keys, "g", "c", ""),
        "compact_turn": build_compact(SHARD, keys[0], Compaction("", "2-0", ["1-0"], b"s"),
                                      OPTIONS),
        "publish_lost_turns": build_publish_lost(SHARD, [(k, ["1-0"], SETTLED) for k in keys],
                                                 OPTIONS),
        "dead_letter_lost": build_dead_letter_lost(SHARD, ["1-0"], ["2-0"], keys, "1-0",
                                                   OPTIONS),
        "recreate_group": build_recreate_group(SHARD, "g", "0", "c", ["1-0"]),
        "beat_worker": build_beat("workers", "c", 1000, "beat"),
        "admit_inbox": build_admit(SHARD, 10, 1000, "bad", 100),
    }


@pytest.mark.parametrize("turns", [1, 3])
@pytest.mark.parametrize("script", sorted(_calls(1)))
def test_a_builders_call_has_its_scripts_header_layout(script: str, turns: int) -> None:
    call = _calls(turns)[script]
    layout = header(script)
    assert layout["KEYS"].allows(len(call.keys), turns), (script, len(call.keys), layout)
    assert layout["ARGV"].allows(len(call.args), turns), (script, len(call.args), layout)


def test_the_header_parser_reads_each_kind_of_line() -> None:
    """(The parser itself, on finalise_held's header: 5 fixed keys, 5 per
    turn and the optional AG-UI stream; 10 arguments.)"""
    layout = header("finalise_held")
    assert layout["KEYS"] == Layout(5, 5, 1, True)
    assert layout["ARGV"] == Layout(10, 0, 0, False)
    assert header("apply_entries")["ARGV"] == Layout(13, 2, 1, False)
    assert header("compact_turn")["ARGV"] == Layout(4, 0, 0, False, rest=True)


def test_every_script_the_worker_calls_is_checked() -> None:
    """Each script ``Scripts`` registers has a builder checked above."""
    text = inspect.getsource(Scripts.__init__)
    registered = set(re.findall(r'register_script\(source\("(\w+)"\)\)', text))
    assert len(registered) == 14
    assert registered == set(_calls(1))

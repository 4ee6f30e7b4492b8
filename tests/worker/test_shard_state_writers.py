"""Each field of ``ShardState`` (processor/worker/shard_state.py) is written
by its own methods only: no other module of the worker assigns to one or
changes one in place, so what a shard's state may become is read in one
file (docs/design.md, "Layout")."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import processor.worker
from processor.worker.shard_state import ShardState

_WORKER = Path(processor.worker.__file__).parent
_CHANGES = {"pop", "add", "update", "discard", "clear", "append", "remove", "setdefault",
            "intersection_update", "difference_update", "extend"}
# Fields holding an object with methods of its own (it owns its state).
_OWNED_ELSEWHERE = {"shard", "holds", "mirrors", "floor_marks", "opening", "hold_turns"}


def _writes(tree: ast.AST, fields: set[str]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in fields and not (
                    isinstance(target.value, ast.Name) and target.value.id == "self"):
                found.append((target.lineno, f"{target.attr} assigned"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _CHANGES and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr in fields:
            found.append((node.lineno, f"{node.func.value.attr}.{node.func.attr}()"))
    return found


def test_only_shard_state_writes_its_fields() -> None:
    fields = {f.name for f in dataclasses.fields(ShardState)} - _OWNED_ELSEWHERE
    assert {"orphans", "waiting_cancels", "live_handed", "read_count"} <= fields
    offenders = []
    for path in sorted(_WORKER.rglob("*.py")):
        if path.name == "shard_state.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        offenders += [f"{path.relative_to(_WORKER)}:{line}: {what}"
                      for line, what in _writes(tree, fields)]
    assert offenders == []


def test_the_check_finds_a_write() -> None:
    """The scan sees the writes it forbids (so the test above can fail)."""
    tree = ast.parse("state.orphans = True\nstate.waiting_cancels.update(x)\n"
                     "self.orphans = 1\n")
    assert _writes(tree, {"orphans", "waiting_cancels"}) == [
        (1, "orphans assigned"), (2, "waiting_cancels.update()")]

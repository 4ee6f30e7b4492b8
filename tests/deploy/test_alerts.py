"""deploy/prometheus/alerts.yml: docs/operations.md's alerts as Prometheus rules.
Every metric they name is one a worker exports, and the page's table and the
file say the same (expressions and ``for`` durations)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from processor.worker.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def exported() -> set[str]:
    """Every series name a worker's /metrics can carry."""
    names = set()
    for family in Metrics().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


def documented_alerts() -> list[tuple[str, list[str], str | None]]:
    """(name, expressions, for) of each row of docs/operations.md's alerts table."""
    text = (ROOT / "docs" / "operations.md").read_text()
    lines = text[text.index("| alert | expression | why |"):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        name, expression, _why = (cell.strip() for cell in line.strip("|").split(" | "))
        duration = re.search(r"for (\d+[smh])$", expression)
        rows.append((name, re.findall(r"`([^`]+)`", expression),
                     duration.group(1) if duration else None))
    return rows


def _flat(expr: str) -> str:
    return " ".join(expr.split())


def test_every_rule_is_complete_and_named_once() -> None:
    found = rules()
    assert len({rule["alert"] for rule in found}) == len(found)
    for rule in found:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_a_rule_names_only_metrics_a_worker_exports(rule: dict[str, Any]) -> None:
    named = set(re.findall(r"\bprocessor_[a-z_]+", rule["expr"]))
    assert named, rule["expr"]
    assert named <= exported(), named - exported()


@pytest.mark.parametrize("row", documented_alerts(), ids=lambda row: row[0])
def test_the_page_says_what_the_rules_do(row: tuple[str, list[str], str | None]) -> None:
    name, expressions, duration = row
    matching = [rule for rule in rules()
                if all(_flat(e) in _flat(rule["expr"]) for e in expressions)]
    assert len(matching) == 1, f"{name}: {expressions} in {len(matching)} rules"
    assert matching[0].get("for") == duration, name


def test_every_rule_is_documented() -> None:
    assert len(documented_alerts()) == len(rules())

"""The documentation holds together: every ``docs/contract.md §N`` that code
cites is a section there, no comment cites the contract any other way, and
every relative link of the README and docs/ reaches a file (and a heading,
when it names one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "contract.md"
CODE_DIRS = ("processor", "bench", "tests", "deploy")
CODE_SUFFIXES = {".py", ".lua", ".html", ".yaml", ".yml", ".toml", ".sh"}
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "deploy" / "README.md",
                *(ROOT / "docs").glob("*.md")])


def code_files() -> list[Path]:
    return sorted(p for d in CODE_DIRS for p in (ROOT / d).rglob("*")
                  if p.suffix in CODE_SUFFIXES and p.is_file() and p.name != "test_docs.py")


def contract_sections() -> set[str]:
    """The numbers of docs/contract.md's sections: ``## 4. ...``, ``### 4.2 ...``."""
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", CONTRACT.read_text(), re.M))


def cited() -> list[tuple[str, str]]:
    """(file, section) of every ``docs/contract.md §N`` (``§1 and §5``, ``§4.3/§4.4``)."""
    found = []
    for path in code_files():
        text = path.read_text(errors="replace")
        for match in re.finditer(r"docs/contract\.md((?:(?:[ /,]|and|'s)*§\d+(?:\.\d+)?)+)", text):
            found += [(str(path.relative_to(ROOT)), n)
                      for n in re.findall(r"§(\d+(?:\.\d+)?)", match.group(1))]
    return found


def test_the_contract_has_every_section_code_cites() -> None:
    citations = cited()
    assert len(citations) > 20
    sections = contract_sections()
    missing = [(f, n) for f, n in citations if n not in sections]
    assert not missing, missing


def test_no_comment_cites_the_contract_by_an_old_name() -> None:
    old = re.compile(r"\bcontract(?:'s)?(?: sections?)? \d", re.I)
    stale = [(str(p.relative_to(ROOT)), m.group(0)) for p in code_files()
             for m in old.finditer(p.read_text(errors="replace"))]
    assert not stale, stale


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    out |= set(re.findall(r'<a id="([^"]+)"', text))
    return out


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", [p for p in PAGES if p.exists()],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_their_target(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md"
                                 and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, broken

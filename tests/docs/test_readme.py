"""The README runs as written: every fenced block is executed or checked,
found by its language (nothing here names a block or its text):

- ``python``: run as a script after the README's install command (the
  modules that only the test extras install are hidden), against a private
  redis-server with a worker running; ``redis://localhost:6379`` becomes that
  server's URL. A ``# prints: TEXT`` comment names a line it must print.
- ``bash``: each line is a command run in a shell from a scratch directory
  (the same for every block), with the URL replaced too; it must exit 0. A
  line ending in ``&`` runs in the background: the next line waits until it
  has said something on stderr (every long-running processor command does)
  and, at the end of the block, SIGTERM stops it: it must exit 0.
- ``jsonl``: input of ``processor merge``; the next ``json`` block is what
  it prints.
- ``text``, ``mermaid`` and unlabelled blocks are pictures and sample output.
- A block right after ``<!-- readme-test: skip (why) -->`` is not run
  (installing, placeholders for ids): few are allowed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.worker_harness import Harness

from processor.engine.offline import merge_lines

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
URL = "redis://localhost:6379"
RUN = {"python", "bash"}
CHECKED = {"jsonl", "json"}
NOT_CODE = {"text", "mermaid", ""}
MAX_SKIPPED = 3
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((.+?)\)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # of the opening fence
    skip: str | None  # why it is not run


def blocks(text: str = README) -> list[Block]:
    """Every fenced block, in order, with the skip marker right before it."""
    found = []
    for match in re.finditer(r"^```(\S*)[ \t]*\n(.*?)^```[ \t]*$", text, re.M | re.S):
        before = text[:match.start()].rstrip().splitlines()
        marker = SKIP.search(before[-1]) if before else None
        found.append(Block(match.group(1), match.group(2), text.count("\n", 0, match.start()) + 1,
                           marker.group(1) if marker else None))
    return found


def test_every_block_is_one_the_test_knows_and_few_are_skipped() -> None:
    found = blocks()
    unknown = [(b.line, b.lang) for b in found if b.lang not in RUN | CHECKED | NOT_CODE]
    assert not unknown, f"blocks in a language this test cannot run or check: {unknown}"
    skipped = [b for b in found if b.skip]
    assert len(skipped) <= MAX_SKIPPED, [(b.line, b.skip) for b in skipped]
    assert any(b.lang == "python" and not b.skip for b in found)
    assert any(b.lang == "bash" and not b.skip for b in found)


def test_worked_examples_match_the_merge() -> None:
    found = blocks()
    inputs = [i for i, b in enumerate(found) if b.lang == "jsonl"]
    assert inputs, "the README has no worked example"
    for i in inputs:
        expected = next(b for b in found[i + 1:] if b.lang == "json")
        results = list(merge_lines(found[i].text.splitlines()).results())
        got = [json.loads(msgspec.json.encode(r.response)) for r in results]
        want = json.loads(expected.text)
        assert got == (want if isinstance(want, list) else [want]), f"line {found[i].line}"


def _content_rows(text: str = README) -> list[list[str]]:
    """The cells of every table row that shows a content as JSON (a cell
    starting with `` `{"type": ``)."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]
    return [row for row in rows if any(cell.startswith('`{"type": ') for cell in row)]


def test_the_content_shapes_merge_as_the_table_says() -> None:
    """The table of what a producer sends: each JSON shape, sent in the row's
    order as one turn, is accepted (no dead letter) and merged as its row
    says; the failing row's call is ``Producer.error``'s."""
    import ast
    import inspect

    from processor.client import Producer

    rows = _content_rows()
    assert len(rows) >= 5, rows
    lines, shapes = [], []
    for row in rows:
        role = "tool" if '`"role": "tool"`' in row[1] else "assistant"
        for shape in re.findall(r"`(\{.*?\})`(?:\s|$)", row[1]):
            content = json.loads(shape)
            shapes.append(content)
            lines.append(json.dumps({"response_id": "shapes", "update": {
                "role": role, "contents": [content]}}))
    kinds = {c["type"] for c in shapes}
    assert kinds >= {"text", "text_reasoning", "function_call", "function_result", "usage"}
    merge = merge_lines([*lines, json.dumps({"response_id": "shapes", "kind": "end"})])
    [result] = list(merge.results())
    assert merge.dead == [] and result.status == "completed"
    response = json.loads(msgspec.json.encode(result.response))
    merged = [c for m in response["messages"] for c in m["contents"]]
    calls = [c for c in merged if c["type"] == "function_call"]
    assert len(calls) == 1 and json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    sent = [c for c in shapes if c["type"] == "function_call"]
    assert calls[0]["call_id"] == sent[0]["call_id"] and calls[0]["name"] == sent[0]["name"]
    tools = [m for m in response["messages"] if m["role"] == "tool"]
    assert [c["type"] for m in tools for c in m["contents"]] == ["function_result"]
    texts = {c["type"]: c["text"] for c in merged if "text" in c}
    assert texts == {c["type"]: c["text"] for c in shapes if "text" in c}
    answer = next(m for m in response["messages"]
                  if any(c["type"] == "text" for c in m["contents"]))
    assert [c["type"] for c in answer["contents"]][:2] == ["text_reasoning", "text"], answer
    usage = next(c["usage_details"] for c in shapes if c["type"] == "usage")
    assert response["usage_details"] == usage
    # The failing row: a call Producer.error takes, then the turn ends as it says.
    (call,) = re.findall(r"^\|.*`await (producer\.error\(.*?\))`", README, re.M)
    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call)
    args = [ast.literal_eval(a) if not isinstance(a, ast.Name) else a.id for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    inspect.signature(Producer.error).bind(None, *args, **kwargs)
    failed = merge_lines([lines[0], json.dumps({
        "response_id": "shapes", "kind": "error", "error": args[1], **kwargs})])
    [result] = list(failed.results())
    error = json.loads(msgspec.json.encode(result.meta))["error"]
    assert result.status == "error" and error["code"] == "producer_error", error
    assert kwargs["code"] in json.dumps(error), error  # (the producer's code is kept)
    partial = json.loads(msgspec.json.encode(result.response))  # what came before the error
    assert partial["messages"][0]["contents"] == [shapes[0]], partial


def test_set_up_commands_are_the_ones_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -q" in README
    assert "python -m pytest -q" in ci


# --------------------------------------------------------------------------- running


def _install_extra() -> str:
    """The extra of the README's (first) install command, ``pip install -e '.[X]'``."""
    match = re.search(r"pip install -e '\.\[([\w-]+)\]'", README)
    assert match, "the README says how to install"
    return match.group(1)


def _installed_by(extra: str) -> set[str]:
    """The distributions ``pip install -e '.[extra]'`` installs (with their own)."""
    todo, seen = [("processor", frozenset({extra}))], set()
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in extras | {""}):
                todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in seen}


def _hidden_modules() -> list[str]:
    """Top-level modules of distributions the README's install does not install."""
    installed = _installed_by(_install_extra())
    return sorted(module for module, dists in importlib.metadata.packages_distributions().items()
                  if not any(canonicalize_name(d) in installed for d in dists)
                  and module.isidentifier())


def _env(tmp_path: Path) -> dict[str, str]:
    """A user's environment after the README's install: ``processor`` on PATH,
    no test-only module importable, no processor settings."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import importlib.abc, importlib.util, sys

        HIDDEN = set({_hidden_modules()!r})

        class NotInstalled(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in HIDDEN:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NotInstalled())
        # A library probing for an optional module (yarl: pydantic_core) asks
        # importlib.util.find_spec, which answers None when it is not installed.
        _find_spec = importlib.util.find_spec

        def find_spec(name, package=None):
            if name.partition(".")[0] in HIDDEN:
                return None
            return _find_spec(name, package)

        importlib.util.find_spec = find_spec
        """))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PROCESSOR_") and k not in ("REDIS_URL", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run_python(block: Block, url: str, env: dict[str, str], cwd: Path) -> None:
    script = cwd / f"readme_{block.line}.py"
    script.write_text(block.text.replace(URL, url))
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    where = f"README line {block.line}"
    assert proc.returncode == 0, f"{where} failed:\n{proc.stderr}"
    printed = proc.stdout.splitlines()
    for expected in re.findall(r"#\s*prints:\s*(.+?)\s*$", block.text, re.M):
        assert expected in printed, f"{where} should print {expected!r}, printed {printed}"


def _commands(text: str) -> list[str]:
    """The commands of a shell block: one per line (``\\`` continues a line)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip()
            .startswith("#")]


def _background(command: str) -> str | None:
    """The command without its ``&``, when it runs in the background."""
    code = re.sub(r"\s+#\s.*$", "", command).rstrip()
    if code.endswith("&") and not code.endswith("&&"):
        return code[:-1].rstrip()
    return None


@dataclass
class Background:
    proc: subprocess.Popen[bytes]
    stderr: Path
    where: str

    def started(self) -> None:
        """Until it says something on stderr, or exits (then: with status 0)."""
        deadline = time.monotonic() + 60
        while not self.stderr.stat().st_size and self.proc.poll() is None:
            assert time.monotonic() < deadline, f"{self.where}: said nothing for 60 s"
            time.sleep(0.05)
        if self.proc.poll() is not None:
            assert self.proc.returncode == 0, f"{self.where}: exited {self.proc.returncode}: " \
                f"{self.stderr.read_text()}"

    def stop(self) -> None:
        """SIGTERM: it must stop cleanly."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        assert self.proc.returncode == 0, f"{self.where}: exited {self.proc.returncode}: " \
            f"{self.stderr.read_text()}"


def _run_shell(block: Block, url: str, env: dict[str, str], cwd: Path) -> None:
    background: list[Background] = []
    try:
        for n, command in enumerate(_commands(block.text)):
            command = command.replace(URL, url)
            where = f"README line {block.line}: {command}"
            behind = _background(command)
            if behind is not None:
                stderr = cwd.parent / f"stderr-{block.line}-{n}"
                with open(stderr, "wb") as err:
                    proc = subprocess.Popen(["bash", "-c", f"exec {behind}"], cwd=cwd, env=env,
                                            stdout=subprocess.DEVNULL, stderr=err)
                background.append(Background(proc, stderr, where))
                background[-1].started()
                continue
            done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, f"{where}: exited {done.returncode}:\n{done.stderr}"
    finally:
        for job in background:
            job.stop()


async def test_the_readme_code_runs_as_written(make_redis_server: Any, tmp_path: Path) -> None:
    env = _env(tmp_path)
    hidden = subprocess.run([sys.executable, "-c", "import agent_framework"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert "ModuleNotFoundError" in hidden.stderr, "the test extras are not hidden"
    server = make_redis_server()
    cwd = tmp_path / "work"
    cwd.mkdir()
    async with Harness(server.url, "agent", 1, log_dir=tmp_path) as harness:
        worker = harness.spawn()
        await harness.wait_started([worker])
        for block in blocks():
            if block.skip:
                continue
            if block.lang == "python":
                _run_python(block, server.url, env, cwd)
            elif block.lang == "bash":
                _run_shell(block, server.url, env, cwd)
        assert harness.terminate(worker) == 0, worker.log()

"""Pure-merge benchmark: our decode + merge engine vs Agent Framework.

Builds the same stream of ``AgentResponseUpdate`` JSON texts for both sides
(genuine ``AgentResponseUpdate.to_dict()`` output, generated with a fixed
seed) and times, best of 3:

* ours: ``decode_entry({"response_id": ..., "update": text})`` and
  ``Turn.apply`` per entry, then ``Turn.finish()`` + ``encode_response`` per
  turn;
* Agent Framework: ``AgentResponseUpdate.from_dict(json.loads(text))`` per
  entry, then ``AgentResponse.from_updates(updates_of_turn)`` per turn.

No Redis, no I/O inside the timed region. Usage::

    python bench/merge_bench.py [--updates N] [--quick] [--repeat R] [--no-docs]

A full run (no ``--quick``, no ``--no-docs``) rewrites the section between
the ``merge-bench`` markers in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from agent_framework import AgentResponse, AgentResponseUpdate
from turns import CONCURRENT_TURNS, SEED, Entry, build_entries

# Measure the processor of the checkout this script lives in, whatever is
# installed in the environment.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from processor.engine.events import encode_response  # noqa: E402
from processor.engine.merge import Turn  # noqa: E402
from processor.ingest.decode import decode_entry  # noqa: E402
from processor.wire.ids import TurnKey  # noqa: E402

DOCS = ROOT / "docs" / "benchmarks.md"
START = "<!-- merge-bench:start -->"
END = "<!-- merge-bench:end -->"
DEFAULT_UPDATES = 200_000
QUICK_UPDATES = 20_000
TARGET_RATIO = 5.0
# ---------------------------------------------------------------- the two sides


def run_ours(entries: list[Entry]) -> list[str]:
    turns: dict[TurnKey, Turn] = {}
    for rid, text in entries:
        key, record = decode_entry({"response_id": rid, "update": text})
        turn = turns.get(key)
        if turn is None:
            turn = turns[key] = Turn(key)
        turn.apply(record)
    return [encode_response(turn.finish()) for turn in turns.values()]


def run_agent_framework(entries: list[Entry]) -> list[AgentResponse]:
    groups: dict[str, list[AgentResponseUpdate]] = {}
    for rid, text in entries:
        update = AgentResponseUpdate.from_dict(json.loads(text))
        group = groups.get(rid)
        if group is None:
            group = groups[rid] = []
        group.append(update)
    return [AgentResponse.from_updates(updates) for updates in groups.values()]


class GcClock:
    """Seconds the cyclic garbage collector ran (a ``gc.callbacks`` hook)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start


def best_of(
    sides: dict[str, Callable[[list[Entry]], Any]], entries: list[Entry], repeat: int
) -> dict[str, tuple[float, float]]:
    """Best wall time of each side over ``repeat`` rounds, with the collector's
    seconds in that run. Rounds alternate the sides, so a noisy neighbour on
    the machine hits both alike."""
    best = dict.fromkeys(sides, (float("inf"), 0.0))
    for _ in range(repeat):
        for name, fn in sides.items():
            gc.collect()
            clock = GcClock()
            gc.callbacks.append(clock)
            start = time.perf_counter()
            fn(entries)
            seconds = time.perf_counter() - start
            gc.callbacks.remove(clock)
            best[name] = min(best[name], (seconds, clock.seconds))
    return best


def check_same_work(entries: list[Entry]) -> tuple[int, int]:
    """Both sides must see the same text: compare the merged text characters."""
    ours = sum(
        len(c.get("text") or "")
        for r in run_ours(entries)
        for m in json.loads(r)["messages"]
        for c in m["contents"]
        if c["type"] in ("text", "text_reasoning")
    )
    theirs = sum(
        len(c.text or "")
        for r in run_agent_framework(entries)
        for m in r.messages
        for c in m.contents
        if c.type in ("text", "text_reasoning")
    )
    if ours != theirs:
        raise SystemExit(f"sanity check failed: {ours} text chars merged by us, {theirs} by AF")
    return ours, len({rid for rid, _ in entries})


# ---------------------------------------------------------------- reporting


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "cpu": f"{cpu} ({os.cpu_count()} logical CPUs)",
        "processor package": str(Path(sys.modules["processor"].__file__).parent),
        "agent-framework-core": metadata.version("agent-framework-core"),
        "msgspec": metadata.version("msgspec"),
    }


def load_average() -> str:
    """Other work on the machine skews timings: record how busy it was."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


#: The code the benchmark runs: local changes here make the commit "dirty".
MEASURED = (
    "combine.py", "decode.py", "dotnet.py", "events.py", "ids.py", "merge.py", "models.py",
    "turn_state.py", "validate.py",
)


def git_commit() -> str:
    """HEAD, plus a note when the measured modules differ from it."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short", "HEAD")
        diff = git("diff", "--quiet", "HEAD", "--", *(f"processor/{m}" for m in MEASURED))
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes" if diff.returncode else "")


def render_section(result: dict[str, Any]) -> str:
    info = result["machine"]
    return "\n".join(
        [
            START,
            "## Pure merge vs Agent Framework",
            "",
            f"Measured {result['date']} at commit `{result['commit']}` with "
            f"`{result['command']}` (from the repository root).",
            "",
            f"Workload: {result['updates']:,} `AgentResponseUpdate.to_dict()` JSON texts "
            f"(built with agent_framework, seed {SEED}) in {result['turns']:,} turns of "
            f"10-40 updates; 2-3 agents per turn handing off under their own response ids; "
            f"text deltas of 2-20 characters, some reasoning (keyed and id-less), tool calls "
            f"in 2-4 argument chunks plus their results, usage and finish reason last; "
            f"{CONCURRENT_TURNS} turns in flight, entries interleaved. Single process, no "
            f"Redis, no I/O in the timed region; best of {result['repeat']} runs per side "
            "(rounds alternate the two sides). The cyclic garbage collector runs, as it "
            "would in a user's process; its seconds (a `gc.callbacks` hook) are those of "
            "the best run.",
            "",
            "| engine | what is timed | seconds | of which cyclic GC | updates/s |",
            "|---|---|---:|---:|---:|",
            f"| processor | `decode_entry` + `Turn.apply` per entry, `Turn.finish` + "
            f"`encode_response` per turn | {result['ours_s']:.3f} | {result['ours_gc']:.3f} | "
            f"{result['ours_ups']:,.0f} |",
            f"| Agent Framework | `AgentResponseUpdate.from_dict(json.loads(text))` per entry, "
            f"`AgentResponse.from_updates` per turn | {result['af_s']:.3f} | "
            f"{result['af_gc']:.3f} | {result['af_ups']:,.0f} |",
            "",
            f"**Ratio: {result['ratio']:.2f}x** Agent Framework (target: at least "
            f"{TARGET_RATIO:g}x; "
            f"{'met' if result['ratio'] >= TARGET_RATIO else 'not met'}).",
            "",
            "Machine:",
            "",
            f"- Python: {info['python']}",
            f"- Platform: {info['platform']}",
            f"- CPU: {info['cpu']}",
            f"- agent-framework-core {info['agent-framework-core']}, msgspec {info['msgspec']}",
            f"- Load average (1/5/15 min) when the timing started: {result['load']}",
            END,
        ]
    )


def write_docs(section: str, path: Path = DOCS) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start, end = text.find(START), text.find(END)
    if start >= 0 and end > start:
        text = text[:start] + section + text[end + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=None, help="updates to merge")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_UPDATES:,} updates, docs untouched"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per side (best kept)")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args(argv)
    total = args.updates or (QUICK_UPDATES if args.quick else DEFAULT_UPDATES)
    if total < 10:
        parser.error("--updates must be at least 10")

    info = machine()
    for name, value in info.items():
        print(f"{name:>22}: {value}")
    t0 = time.perf_counter()
    entries = build_entries(total)
    payload = sum(len(t) for _, t in entries)
    print(
        f"{'workload':>22}: {total:,} updates, {payload / 1e6:.1f} MB of JSON "
        f"(built in {time.perf_counter() - t0:.1f}s)"
    )
    chars, turns = check_same_work(entries)
    print(f"{'sanity':>22}: {turns:,} turns, both sides merged {chars:,} text characters")

    load = load_average()
    best = best_of({"ours": run_ours, "af": run_agent_framework}, entries, args.repeat)
    (ours, ours_gc), (af, af_gc) = best["ours"], best["af"]
    print(f"{'processor':>22}: {ours:.3f}s  {total / ours:>12,.0f} updates/s  "
          f"(cyclic GC {ours_gc:.3f}s)")
    print(f"{'agent framework':>22}: {af:.3f}s  {total / af:>12,.0f} updates/s  "
          f"(cyclic GC {af_gc:.3f}s)")
    ratio = af / ours
    verdict = "OK" if ratio >= TARGET_RATIO else f"BELOW the {TARGET_RATIO:g}x target"
    print(f"{'ratio':>22}: {ratio:.2f}x Agent Framework ({verdict})")

    if not (args.quick or args.no_docs):
        command = shlex.join(["python", "bench/merge_bench.py", *sys.argv[1:]])
        section = render_section(
            {
                "date": datetime.now(UTC).strftime("%Y-%m-%d"),
                "command": command,
                "commit": git_commit(),
                "updates": total,
                "turns": turns,
                "repeat": args.repeat,
                "ours_s": ours,
                "ours_gc": ours_gc,
                "af_gc": af_gc,
                "ours_ups": total / ours,
                "af_s": af,
                "af_ups": total / af,
                "ratio": ratio,
                "machine": info,
                "load": load,
            }
        )
        write_docs(section)
        print(f"{'docs':>22}: updated {DOCS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

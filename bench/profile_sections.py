"""The sections of docs/profiles.md (``bench/run.py --profile``
and ``--pyinstrument``): py-spy's raw samples of one worker as tables of
the functions where its time goes, and pyinstrument's call tree as it
printed it. ``report.write_section`` places them on the page."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from scenarios import Throughput


def profile_section(raw: Path, run: Throughput, top: int = 25, stored: bool = False) -> str:
    """py-spy's samples of one worker (``stored``: one storing every entry,
    ``--no-hold-turns``): the functions where time goes."""
    own: Counter[str] = Counter()
    total_in: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [_short(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            total_in[frame] += n
    worker = run.cpu.get("consumers", 0)
    redis = run.cpu.get("redis", 0)
    lines = [
        "## Profile of one worker" + (" storing turns (`--no-hold-turns`)" if stored else ""),
        "",
        "`py-spy record --format raw --rate 250 --nonblocking` on one worker"
        + (" with `--no-hold-turns`" if stored else " (the default: holding turns)")
        + ", in an extra "
        f"run over the first {run.turns:,} turns of the same stream ({run.rate:,.0f} "
        f"updates/s while sampled; {samples:,} samples). CPU seconds per 100,000 updates: "
        "worker "
        f"{100_000 * worker / run.updates:.2f} s, redis-server (the scripts and the reads) "
        f"{100_000 * redis / run.updates:.2f} s, wall {100_000 / run.rate:.2f} s.",
        "",
        "| own time | function |",
        "|---:|---|",
    ]
    lines += [f"| {n / samples:.1%} | `{f}` |" for f, n in own.most_common(top)]
    lines += ["", "| time inside | function |", "|---:|---|"]
    inside = [(f, n) for f, n in total_in.most_common() if "processor/" in f]
    lines += [f"| {n / samples:.1%} | `{f}` |" for f, n in inside[:top]]
    return "\n".join(lines)


def pyinstrument_section(tree: Path, run: Throughput) -> str:
    """pyinstrument's call tree of one worker (wall clock, async-aware): where
    each coroutine step of the event loop spends its time."""
    text = tree.read_text()
    # The tree starts at its first line with a time; the banner above it goes.
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line[:1].isdigit()), 0)
    body = "\n".join(line.rstrip() for line in lines[first:] if line.strip())
    return "\n".join([
        "## Call tree of one worker (pyinstrument)",
        "",
        "`python -m pyinstrument` around `processor run` (the default: holding turns; "
        "text renderer, a sample every "
        f"1 ms, frames under 1% left out), in an extra run over the first {run.turns:,} "
        f"turns of the same stream ({run.rate:,.0f} updates/s under the profiler, which "
        "slows the worker down). Wall-clock seconds over the worker's whole life, start-up "
        "and the idle wait for the stream included; under `Handle._run` are the event "
        "loop's steps: the shard loop's applier (`_apply_loop`: feeding each held turn "
        "what the batch read of it, publishing the turns that ended with `finalise_held`, "
        "spilling to the stored path what is due) and its reader (`_read_ahead`: reading "
        "the next batch, grouping it per turn and opening its new turns with "
        "`open_turns`).",
        "",
        "```text",
        body,
        "```",
    ])


def _short(frame: str) -> str:
    """``fn (path/to/site-packages/pkg/mod.py:12)`` -> ``fn (pkg/mod.py:12)``."""
    name, _, where = frame.partition(" (")
    for marker in ("site-packages/", "python3.11/", "/work/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    if where.startswith("wt/") and "/" in where[3:]:
        where = where.split("/", 2)[2]
    return f"{name} ({where}" if where else name

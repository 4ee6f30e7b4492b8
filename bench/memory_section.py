"""The *Memory* section of docs/benchmarks.md (``bench/run.py``): Redis
memory per active turn, held and stored, and the worker's RSS over a long
run, from ``memory_scenarios``' measurements. ``report.write_section``
places it on the page."""

from __future__ import annotations

from collections.abc import Callable

from memory_scenarios import Memory, RssRun

MIB = 1 << 20


def memory_section(mems: list[Memory] | None, rss: RssRun | None) -> str:
    lines = ["## Memory", ""]
    if mems:
        lines += _memory_table(mems)
    if rss is not None:
        first = [p for p in rss.points if p[0] >= rss.updates * 0.1] or rss.points
        start, end = first[0][1], rss.points[-1][1]
        peak = max(p[1] for p in rss.points)
        lines += [
            f"Worker RSS over {rss.updates:,} updates ({rss.seconds:.0f} s, one worker, "
            "the stream topped up as it drains): "
            f"{start / MIB:.1f} MiB after the first 10%, {end / MIB:.1f} MiB at the end, "
            f"peak {peak / MIB:.1f} MiB ({(end - start) / MIB:+.1f} MiB over the last 90%).",
            "",
            "![worker RSS](bench-rss.png)",
        ]
    return "\n".join(lines)


def _memory_table(mems: list[Memory]) -> list[str]:
    """Redis memory per active turn, held (the default) and stored."""
    first = mems[0]
    lines = [
        f"Redis `used_memory` with {first.turns:,} turns active (every update read, no "
        "`end` yet), one worker. Holding them (the default), Redis keeps each turn's "
        "entries pending in the updates stream and a small turn hash; storing them "
        "(`--no-hold-turns`), a record per entry in the turn's `recs:` hash, the stream "
        "trimmed as entries are acked (a held turn past `--hold-ms` is checkpointed: one "
        "snapshot, its entries acked).",
        "",
        "| per active turn | " + " | ".join(_mem_name(m) for m in mems) + " |",
        "|---|" + "---:|" * len(mems),
        *(_mem_row(name, [f"{value(m) / m.turns:,.0f} B" for m in mems])
          for name, value in _MEM_ROWS),
        # (Not MEMORY USAGE of the stream: Redis's estimate for a stream
        # came out at twice the whole growth.)
        _mem_row("growth / raw bytes",
                 [f"{(m.active - m.before) / m.raw_bytes:.2f}x" for m in mems]),
        "",
    ]
    for m in mems:
        lines += [
            f"{_mem_name(m)}: after the turns ended, `used_memory` "
            f"{(m.drained - m.before) / MIB:+.1f} MiB over the start with the outputs still "
            f"in their streams, {(m.cleaned - m.before) / MIB:+.2f} MiB once the outputs are "
            "read and deleted and the done markers' TTL has passed.", ""]
    return lines


def _rest(mem: Memory) -> int:
    return mem.active - mem.before - mem.state_bytes - mem.started_events


#: The memory table's rows in bytes: what each is, and how it is had.
_MEM_ROWS: list[tuple[str, Callable[[Memory], int]]] = [
    ("raw bytes of the turn's update entries (field names + values)", lambda m: m.raw_bytes),
    ("`used_memory` growth", lambda m: m.active - m.before),
    ("of which turn state (`turn:` + `recs:` hashes, `MEMORY USAGE`)",
     lambda m: m.state_bytes),
    ("of which the events stream (`synthesis.started`)", lambda m: m.started_events),
    ("the rest: the updates stream's entries and pending list (growth less the above)", _rest),
]


def _mem_row(name: str, cells: list[str]) -> str:
    return f"| {name} | " + " | ".join(cells) + " |"


def _mem_name(mem: Memory) -> str:
    return "held (default)" if mem.held else "stored (`--no-hold-turns`)"

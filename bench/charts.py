"""``bench/run.py``'s PNG charts for docs/benchmarks.md (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from latency import Latency, percentile
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter
from memory_scenarios import RssRun
from memory_section import MIB
from report import LATENCY_TARGET_MS
from scenarios import Throughput

#: Axis ticks in thousands ("150k"): full numbers ran into each other.
_THOUSANDS = FuncFormatter(lambda v, _pos: f"{v / 1000:,.0f}k")


def throughput_chart(runs: list[Throughput], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 1.0 + 0.34 * len(runs)), dpi=110)
    names = [t.name for t in runs]
    rates = [t.rate for t in runs]
    colors = ["#999999" if t.name == "drain" else "#d9822b" if t.name == "FastStream"
              else "#2b6cb0" for t in runs]
    bars = ax.barh(names, rates, color=colors)
    ax.bar_label(bars, labels=[f"{r:,.0f}" for r in rates], padding=3, fontsize=8)
    ax.invert_yaxis()
    _targets(ax, {t.name: t.rate for t in runs})
    ax.set_xlabel("updates/s (higher is better)")
    ax.xaxis.set_major_formatter(_THOUSANDS)
    ax.set_xlim(0, max(rates) * 1.2)
    ax.set_title("End-to-end throughput, same stream, same redis-server", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def _targets(ax: Axes, rates: dict[str, float]) -> None:
    """The throughput targets as vertical lines, named in a legend: half the
    drain, five times FastStream."""
    marks = [(rates.get("drain", 0) * 0.5, "target: 0.5x drain", "#c53030", "--"),
             (rates.get("FastStream", 0) * 5, "target: 5x FastStream", "#d9822b", ":")]
    drawn = False
    for x, label, color, style in marks:
        if x > 0:
            ax.axvline(x, color=color, linestyle=style, linewidth=1.2, label=label)
            drawn = True
    if drawn:
        ax.legend(fontsize=7, loc="lower right")


def latency_chart(lat: Latency, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=110)
    ordered = sorted(lat.samples)
    n = len(ordered)
    ax.plot(ordered, [100 * (i + 1) / n for i in range(n)], color="#2b6cb0")
    for q in (50, 99, 99.9):
        v = percentile(ordered, q)
        ax.axvline(v, color="#999999", linestyle=":", linewidth=1)
        ax.text(v, 3 + q / 25, f" p{q:g} {v:.1f} ms", fontsize=8)
    ax.axvline(LATENCY_TARGET_MS, color="#c53030", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("end XADD -> merged entry read (ms, log scale)")
    ax.set_ylabel("% of turns")
    ax.set_title(f"Latency at {lat.rate:,.0f} updates/s, one worker", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def rss_chart(rss: RssRun, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=110)
    xs = [p[0] for p in rss.points]
    ax.plot(xs, [p[1] / MIB for p in rss.points], color="#2b6cb0", label="worker RSS")
    ax.plot(xs, [p[2] / MIB for p in rss.points], color="#d9822b",
            label="Redis used_memory (incl. backlog)")
    ax.set_xlabel("updates processed")
    ax.xaxis.set_major_formatter(_THOUSANDS)
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("Memory over a long run, one worker", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)

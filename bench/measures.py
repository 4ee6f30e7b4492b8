"""What the load benchmarks (serve_bench, cancel_bench, inbox_bench,
loop_idle, live_turns) measure alike: a nearest-rank percentile, Redis's
command counts, and its time per command and per script."""

from __future__ import annotations

import asyncio
import hashlib
import math
from typing import Any

from processor.scripts import NAMES, source


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered), math.ceil(q / 100 * len(ordered))) - 1)]


async def commandstats(client: Any) -> dict[str, int]:
    """Calls so far of each command (``INFO commandstats``)."""
    info = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()}


async def idle_rates(client: Any, seconds: float) -> dict[str, float]:
    """Calls per second of each command over ``seconds`` with no traffic (this
    function's own INFO calls left out)."""
    before = await commandstats(client)
    await asyncio.sleep(seconds)
    after = await commandstats(client)
    rates = {k: (after.get(k, 0) - before.get(k, 0)) / seconds for k in after}
    rates["info"] = max(0.0, rates.get("info", 0.0) - 1 / seconds)
    return {k: v for k, v in rates.items() if v > 0}


def print_commandstats(stats: dict[str, Any], updates: int) -> None:
    """redis-server's calls and microseconds per update, per command, busiest first."""
    rows = sorted(stats.items(), key=lambda kv: -kv[1]["usec"])
    total = sum(row["usec"] for _, row in rows)
    print(f"  redis: {total / updates:.1f} us per update in commands "
          f"(Lua scripts include the commands they call)")
    for name, row in rows[:12]:
        print(f"    {name.removeprefix('cmdstat_'):14} {row['calls'] / updates:6.2f} calls "
              f"{row['usec'] / updates:6.2f} us per update")


def print_scripts(log: list[dict[str, Any]], updates: int) -> None:
    """Per script (its sha), calls and microseconds per update, from the slow log."""
    names = {hashlib.sha1(source(name).encode()).hexdigest(): name for name in NAMES}
    usec: dict[str, list[int]] = {}
    for row in log:
        command = row["command"].split()
        if command and command[0].upper() == b"EVALSHA":
            name = names.get(command[1].decode(), command[1].decode()[:8])
            usec.setdefault(name, []).append(row["duration"])
    for name, times in sorted(usec.items(), key=lambda kv: -sum(kv[1])):
        print(f"    {name:20} {len(times) / updates:6.3f} calls {sum(times) / updates:6.2f} us "
              f"per update, {sum(times) / len(times):8.0f} us per call")

"""What the load benchmarks (serve_bench, cancel_bench, inbox_bench) measure
alike: a nearest-rank percentile and Redis's command counts."""

from __future__ import annotations

import asyncio
import math
from typing import Any


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

"""Reading a worker's metrics port from tests: GET a path, parse /metrics."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of ``GET http://127.0.0.1:<port><path>`` (blocking)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def fetch(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(get, port, path)


async def wait_status(port: int, path: str, status: int, timeout: float = 20,
                      matching: str = "") -> str:
    """Poll ``path`` until it answers ``status`` (with ``matching`` in its
    body); returns the body."""
    deadline = time.monotonic() + timeout
    last: tuple[int, str] | None = None
    while time.monotonic() < deadline:
        try:
            last = await fetch(port, path)
        except OSError as exc:  # not listening yet
            last = (0, repr(exc))
        if last[0] == status and matching in last[1]:
            return last[1]
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} never answered {status} in {timeout:g}s; last: {last}")


class Scrape:
    """One /metrics page: families by name, sample values by name and labels."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(self, sample: str, **labels: str) -> float:
        """The sample's value (0 when absent, as for a counter never incremented)."""
        for family in self.families.values():
            for s in family.samples:
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return 0.0

    def total(self, sample: str) -> float:
        """The sum of a sample over all its label values."""
        return sum(s.value for f in self.families.values() for s in f.samples
                   if s.name == sample)

    def by_label(self, sample: str, label: str) -> dict[str, float]:
        """A sample summed per value of one label."""
        out: dict[str, float] = {}
        for family in self.families.values():
            for s in family.samples:
                if s.name == sample and label in s.labels:
                    out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
        return out


async def scrape(port: int) -> Scrape:
    status, body = await fetch(port, "/metrics")
    assert status == 200, body
    return Scrape(body)

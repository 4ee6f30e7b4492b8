"""Instructions redis-server spends per entry in ``apply_entries`` (callgrind).

``bench/apply_cost.py`` reads Redis's own CPU clock, which swings with the
machine's load; this counts instructions, which do not. It starts a
redis-server (the one on ``PATH``) under ``valgrind --tool=callgrind
--toggle-collect=evalShaCommand``, so that only what runs inside EVALSHA is
counted, takes the end-to-end workload's first ``--turns`` turns in batches
of 500 as a worker holding turns does (the default: ``open_turns`` and
``finalise_held``), or with ``--stored`` as one storing every entry
(``--no-hold-turns``) does: ``apply_entries`` as the worker builds the
calls, with no finalise (``--finalise``: and ``finalise_turns`` for the
turns made ready, as the worker calls them), and prints the instructions per
entry applied::

    python bench/apply_count.py [--turns 400] [--keep FILE] [--batch 500] [--stored] [--finalise]

``--keep`` keeps callgrind's output for ``callgrind_annotate --inclusive=yes``.

Needs valgrind. Takes about 15 s for 400 turns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import redis.asyncio
import workload
from apply_cost import one_round, scripts_of

from processor.embedded.ports import free_port
from processor.worker.worker import WorkerConfig

T = TypeVar("T")


def _total(out: Path) -> int:
    """The instruction total of a callgrind output file."""
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


async def _wait_up(client: redis.asyncio.Redis) -> None:
    for _ in range(300):
        try:
            await client.ping()
            return
        except redis.exceptions.ConnectionError:
            await asyncio.sleep(0.2)
    raise RuntimeError("redis-server under valgrind did not start")


async def under_callgrind(run: Callable[[redis.asyncio.Redis], Awaitable[T]],
                          keep: Path | None = None) -> tuple[T, int]:
    """``run``'s result against a redis-server under callgrind, counting
    only what runs inside ``EVALSHA``, and those instructions (callgrind's
    output copied to ``keep``)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--toggle-collect=evalShaCommand",
             f"--callgrind-out-file={out}", "redis-server", "--port", str(port),
             "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.asyncio.Redis(port=port)
        try:
            await _wait_up(client)
            result = await run(client)
            with contextlib.suppress(redis.exceptions.ConnectionError):  # no reply comes
                await client.shutdown(nosave=True)
            server.wait(timeout=60)  # callgrind writes its counts as the server exits
        finally:
            await client.aclose()
            if server.poll() is None:
                server.kill()
        total = _total(out)
        if keep is not None:
            shutil.copyfile(out, keep)
    return result, total


async def count(turns: int, keep: Path | None = None, batch: int = 500,
                stored: bool = False, finalise: bool = False) -> None:
    async def run(client: redis.asyncio.Redis) -> int:
        work = workload.build(turns)
        await workload.make_template(client, "cost:template", work, [WorkerConfig().group])
        applied, _stats = await one_round(client, work, batch, stored=stored,
                                          finalise=finalise)
        return int(applied)

    applied, total = await under_callgrind(run, keep)
    print(f"entries applied: {applied:,} ({turns:,} turns, {batch} a call)")
    print(f"{scripts_of(stored, finalise)}: {total / applied:,.0f} instructions of "
          f"redis-server per entry ({total:,} inside EVALSHA)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--keep", type=Path, help="where to copy callgrind's output")
    parser.add_argument("--batch", type=int, default=500,
                        help="entries a call (the worker reads up to 500; fewer under a trickle)")
    parser.add_argument("--stored", action="store_true",
                        help="apply each batch as a worker storing every entry does "
                             "(--no-hold-turns): apply_entries alone")
    parser.add_argument("--finalise", action="store_true",
                        help="with --stored (implied), apply each batch as the worker does, "
                             "finalising the turns it makes ready (both scripts counted)")
    args = parser.parse_args()
    asyncio.run(count(args.turns, args.keep, args.batch, args.stored or args.finalise,
                      args.finalise))

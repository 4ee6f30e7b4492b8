"""The long chaos soak, recorded in docs/reliability.md.

    python bench/chaos_soak.py [--turns 1000] [--seconds 120] [--seed 2] [--shards 1]
        [--reclaim-idle-ms 1000] [--no-hold-turns] [--cpu-load N] [--no-write]

Starts a private redis-server with the AOF on (appendfsync always) and runs
tests/support/chaos.py's soak against it: 3 ``processor run`` workers, ~21 updates
per turn over the given number of turns, a worker SIGKILLed every ~2 s and
restarted, Redis SIGKILLed and restarted once, every worker connection
CLIENT KILLed once; with ``--cpu-load N``, N busy loops compete for the CPUs
all along. Every cancelled turn's partial merge is counted and must be a
prefix of what its producer sent. Prints the figures and, unless ``--no-write``, writes them
into docs/reliability.md between marker comments named after what the
workers did: they hold turns (the default), and the figures go between the
``chaos-soak-held`` markers; with ``--no-hold-turns`` they store every entry
(the stored path), and the figures go between the ``chaos-soak`` markers.
Exits 1 if any check failed (a lost, duplicated or differing turn, an
error logged).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from support.chaos import ChaosConfig, ChaosRun  # noqa: E402

from processor.embedded import EmbeddedRedis  # noqa: E402

DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- chaos-soak:begin -->", "<!-- chaos-soak:end -->"


async def soak(cfg: ChaosConfig) -> tuple[list[str], list[str]]:
    server = EmbeddedRedis(appendonly=True).start()
    try:
        async def restart() -> None:
            await server.akill()
            await server.astart()

        with tempfile.TemporaryDirectory() as logs:
            run = ChaosRun(server.url, f"soak{uuid.uuid4().hex[:6]}", cfg, [server.url],
                           restart=restart, log_dir=Path(logs))
            figures = await run.run()
        return figures.lines(), run.problems
    finally:
        server.close()


def record(lines: list[str], cfg: ChaosConfig, command: str) -> None:
    begin, end = (BEGIN, END) if not cfg.hold_turns else (
        BEGIN.replace("soak", "soak-held"), END.replace("soak", "soak-held"))
    text = DOC.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{DOC.relative_to(ROOT)} has no {begin} ... {end}: not written")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    block = "\n".join([
        begin,
        f"Measured at commit `{commit}` with `{command}` on {platform.system()} "
        f"{platform.machine()}, {os.cpu_count()} cores, load average {load} (a shared "
        "machine: times are noisy, counts are not).",
        "",
        "```text",
        *lines,
        "```",
        end,
    ])
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    DOC.write_text(head + block + tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=120.0, help="producing time")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--reclaim-idle-ms", type=int, default=ChaosConfig.reclaim_idle_ms,
                        help="the workers' --reclaim-idle-ms (a dead worker's entries wait "
                             "this long)")
    parser.add_argument("--no-hold-turns", action="store_true",
                        help="the workers store every entry (the stored path)")
    parser.add_argument("--cpu-load", type=int, default=0,
                        help="busy-loop processes competing for the CPUs meanwhile")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    cfg = ChaosConfig(turns=args.turns, produce_seconds=args.seconds, seed=args.seed,
                      shards=args.shards, hold_turns=not args.no_hold_turns,
                      reclaim_idle_ms=args.reclaim_idle_ms, cpu_load=args.cpu_load)
    lines, problems = asyncio.run(soak(cfg))
    print("\n".join(lines))
    for problem in problems[:20]:
        print("PROBLEM:", problem, file=sys.stderr)
    if not args.no_write and not problems:
        command = (f"python bench/chaos_soak.py --turns {args.turns} "
                   f"--seconds {args.seconds:g} --seed {args.seed}"
                   + (f" --shards {args.shards}" if args.shards != 1 else "")
                   + (f" --reclaim-idle-ms {args.reclaim_idle_ms}"
                      if args.reclaim_idle_ms != ChaosConfig.reclaim_idle_ms else "")
                   + (" --no-hold-turns" if args.no_hold_turns else "")
                   + (f" --cpu-load {args.cpu_load}" if args.cpu_load else ""))
        record(lines, cfg, command)
        print(f"written to {DOC.relative_to(ROOT)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

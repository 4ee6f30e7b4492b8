"""Instructions one worker spends per update, counted with callgrind.

A shared host's speed moves the throughput from minute to minute; the
instruction count of the same run does not. This runs ``loop_idle.py``
(one worker in this process over the end-to-end workload, against its own
redis-server) under ``valgrind --tool=callgrind`` twice, with one round
and with none (the workload built, nothing consumed), and prints the
difference divided by the updates consumed::

    python bench/worker_count.py [--turns 1000] [--no-hold-turns] [--live UPDATES]
                                 [--hold-ms MS] [--no-progress]

The worker holds turns, as by default; with ``--no-hold-turns`` it stores
every entry (the stored path). With ``--live N`` the workload is the many
live turns' (``--turns`` turns of N text updates, round-robin). The
worker's sweep is left out (``--sweep-interval 3600``): it runs by the
clock, ten times a second over every active turn, and under callgrind a
run lasts ten times longer, so its instructions per update would be what
the machine's speed decided (30,000 per update between two runs of the
same code on many live turns). Only the worker's process is counted
(redis-server is not). The modules
are compiled first and ``PYTHONHASHSEED`` is fixed, so that two runs of the
same code count within about 0.5% of each other. Needs valgrind; about a
minute for 1,000 turns.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
UPDATES = re.compile(r"^\s*([\d,]+) updates/s", re.MULTILINE)


def count(turns: int, rounds: int, flags: list[str]) -> tuple[int, str]:
    """Instructions of one ``loop_idle.py`` run, and what it printed."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # else every module compiles again, counted
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, "loop_idle.py", "--turns", str(turns), "--rounds", str(rounds),
             *flags],
            cwd=HERE, env=env, capture_output=True, text=True, check=True)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            raise SystemExit(f"no count in valgrind's output:\n{done.stderr[-2000:]}")
        return int(found.group(1)), done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--no-hold-turns", action="store_true",
                        help="the worker stores every entry (the stored path)")
    parser.add_argument("--live", type=int, default=0, metavar="UPDATES",
                        help="the many-live-turns workload: --turns turns of this many "
                             "text updates, round-robin")
    parser.add_argument("--hold-ms", type=int,
                        help="the worker's --hold-ms (under callgrind a turn may outlive "
                             "the default 5 s: 600000 keeps every turn held)")
    parser.add_argument("--no-progress", action="store_true",
                        help="the worker without live progress")
    args = parser.parse_args()
    compileall.compile_dir(HERE.parent / "processor", quiet=1)
    compileall.compile_dir(HERE, quiet=1)
    flags = ["--no-hold-turns"] if args.no_hold_turns else []
    if args.live:
        flags += ["--live", str(args.live)]
    if args.hold_ms is not None:
        flags += ["--hold-ms", str(args.hold_ms)]
    if args.no_progress:
        flags.append("--no-progress")
    flags += ["--sweep-interval", "3600"]
    worked, printed = count(args.turns, 1, flags)
    idle, _ = count(args.turns, 0, flags)
    updates = args.turns * args.live if args.live else _updates(args.turns)
    side = "stored" if args.no_hold_turns else "default"
    print(f"{side}: {(worked - idle) / updates:,.0f} instructions per update "
          f"({worked - idle:,} over {updates:,} updates; {printed.strip().splitlines()[-1]})")


def _updates(turns: int) -> int:
    sys.path.insert(0, str(HERE))
    import workload

    return int(workload.build(turns).updates)


if __name__ == "__main__":
    main()

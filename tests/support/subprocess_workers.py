"""``processor run`` subprocesses for ``worker_harness.Harness``: spawn
them on the harness's namespace, wait until they started, kill or
terminate them (crash, restart and drain tests, the chaos soak, the
benchmarks)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processor.host.config import OPTIONS
from processor.wire.keys import Namespace

ROOT = Path(__file__).resolve().parents[2]
#: Options on by default: ``name=False`` turns them off (``--no-<name>``).
_ON_BY_DEFAULT = {opt.name for opt in OPTIONS if opt.default is True}


@dataclass
class SubprocessWorker:
    consumer: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def _stop_signals_blocked() -> Any:
    """Spawn with SIGTERM/SIGINT blocked (the mask survives exec): a signal
    sent before ``processor run`` installed its handler waits for it instead
    of killing the interpreter mid start-up, so terminate() right after
    spawn() is deterministic (the worker unblocks them, processor/stopping.py)."""
    stops = {signal.SIGTERM, signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Subprocesses:
    """A mixin of ``worker_harness.Harness``, which supplies the
    namespace, the Redis URL, the log directory and ``wait_for``."""

    url: str
    ns: Namespace
    log_dir: Path
    procs: list[SubprocessWorker]
    _serial: int
    wait_for: Any

    def spawn(self, consumer: str | None = None, *extra: str, launcher: Iterable[str] = (),
              **options: Any) -> SubprocessWorker:
        """``python -m processor.cli.main run`` on this namespace. ``options`` become
        flags: ``reclaim_idle_ms=500`` -> ``--reclaim-idle-ms 500``,
        ``progress=True`` -> ``--progress``, ``hold_turns=False`` ->
        ``--no-hold-turns`` (an option on by default). ``launcher`` goes between the
        interpreter and ``-m processor.cli.main`` (e.g. ``-m pyinstrument ...``)."""
        self._serial += 1
        consumer = consumer or f"p{self._serial}"
        args = [sys.executable, *launcher, "-m", "processor.cli", "run", "--redis-url", self.url,
                "--namespace", self.ns.name, "--shards", str(self.ns.shards),
                "--consumer", consumer]
        for name, value in options.items():
            flag = "--" + name.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is False:
                if name in _ON_BY_DEFAULT:  # hold_turns=False -> --no-hold-turns
                    args.append("--no-" + flag[2:])
            elif value is not None:
                args += [flag, str(value)]
        args += list(extra)
        log_path = self.log_dir / f"{self.ns.name}-{consumer}-{self._serial}.log"
        with open(log_path, "wb") as log:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            with _stop_signals_blocked():
                proc = subprocess.Popen(
                    args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env
                )
        sub = SubprocessWorker(consumer, proc, log_path)
        self.procs.append(sub)
        return sub

    async def wait_started(self, subs: Iterable[SubprocessWorker], timeout: float = 30) -> None:
        """Until each subprocess logged "worker started" (its groups exist).
        Needs log level info. Redis 6.2 creates a consumer only when it is
        first delivered an entry, so XINFO CONSUMERS cannot tell."""
        subs = list(subs)

        async def started() -> bool:
            return all('"worker started"' in sub.log() for sub in subs)

        await self.wait_for(started, timeout, f"{[s.consumer for s in subs]} never started")

    def kill(self, sub: SubprocessWorker) -> None:
        """SIGKILL: no drain, no goodbye (a crashed worker)."""
        sub.proc.send_signal(signal.SIGKILL)
        sub.proc.wait(30)
        self.procs.remove(sub)

    def terminate(self, sub: SubprocessWorker, timeout: float = 30) -> int:
        """SIGTERM and wait for the exit status."""
        sub.proc.send_signal(signal.SIGTERM)
        code = sub.proc.wait(timeout)
        self.procs.remove(sub)
        return code

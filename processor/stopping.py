"""SIGTERM/SIGINT for ``processor run`` from the process's first lines.

Kubernetes (or anyone) may SIGTERM a worker at any moment, also while it is
still importing or connecting. Python's default SIGTERM kills the process
(status -15), so ``processor run`` records the signal from the start of
``main`` (``catch_early``) and hands it to the event loop once there is one
(``attach``): a stop requested before the worker exists stops it as soon
as it does, and the process still exits 0 after a clean (empty) drain.

The only window left is the interpreter's own start-up. A launcher that blocks
SIGTERM/SIGINT across ``exec`` closes it too: ``catch_early`` unblocks
them once its handler is in place, so a signal sent meanwhile is delivered to
it (the test harness spawns workers that way)."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []
_previous: dict[int, object] = {}


def _record(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def catch_early() -> None:
    """Record SIGTERM/SIGINT instead of dying, until ``attach`` or ``release``.
    Does nothing outside the main thread (only it may set signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        _previous[sig] = signal.signal(sig, _record)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def release() -> None:
    """Back to the handlers from before ``catch_early`` (for commands other
    than ``run``); a signal recorded meanwhile is raised again so it acts as
    it would have."""
    while _previous:
        sig, handler = _previous.popitem()
        signal.signal(sig, handler)  # type: ignore[arg-type]
    while _received:
        signal.raise_signal(_received.pop(0))


class Stop:
    """A stop request: set by SIGTERM/SIGINT, early or late."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self._callbacks: list[Callable[[], None]] = []

    def request(self) -> None:
        self.requested.set()
        for callback in self._callbacks:
            callback()

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on a stop request, now if one was already made."""
        self._callbacks.append(callback)
        if self.requested.is_set():
            callback()


def attach(loop: asyncio.AbstractEventLoop) -> Stop:
    """Route SIGTERM/SIGINT to a ``Stop`` through ``loop``; a signal
    ``catch_early`` recorded before counts as a request already made."""
    stop = Stop()
    for sig in SIGNALS:
        loop.add_signal_handler(sig, stop.request)
    if _received:
        _received.clear()
        stop.request()
    return stop

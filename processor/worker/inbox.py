"""The worker's side of the producers' inboxes: admitting them into the input streams.

A least-privilege producer (``Producer(inbox=True)``, the ``producer`` ACL
user) cannot XADD: its ``send_inbox`` pushes each entry to its shard's
``{ns:s}:inbox`` list and rings the shard's bell (a token in
``{ns:s}:inbox:bell``) unless it holds one already. Every worker admits the
inbox of each shard it reads (``Membership.reads``): a task per shard
waits on the bell with a ``BLPOP`` of ``WAIT_S`` (which holds one pooled
connection per shard while it waits) and, when it rings, calls
``admit_inbox.lua`` until the inbox is empty. Each call moves up to
``ADMIT_ITEMS`` entries (and ``ADMIT_BYTES``) from the inbox's head
to the stream, each with one ``XADD *`` and ``LPOP`` in the same atomic
step, so the stream takes the inbox's order, and an entry is never in both
places or in neither, whatever crashes. From there the shard loop reads it
like any other entry.

Why a bell and not a ``BLPOP`` of the inbox itself: that would take the
entry out of Redis into the worker, where a crash loses it; the bell carries
no data, so a lost token loses nothing (the next send rings again, and a
shard's new reader admits at once).

Idle cost per shard read: one ``BLPOP`` that times out every ``WAIT_S``,
and every ``CHECK_EVERY`` of them one ``admit_inbox`` call that finds
the inbox empty (for entries pushed without ringing, which only a producer
bypassing ``send_inbox`` does). Nothing else runs while no producer uses an
inbox.

An item that is not an entry's fields (a hostile producer may ``RPUSH``
anything) is dead-lettered by the script, whole, with ``BAD_INBOX_ITEM``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from processor.redis_io.connections import is_redis_failure, is_transient
from processor.scripts.membership_calls import admit_inbox, build_admit
from processor.wire import defaults
from processor.wire.keys import Namespace, Shard
from processor.worker.membership import Membership
from processor.worker.metrics import DeadLetterLog, Metrics
from processor.worker.shell import run_together

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient, Script

log = logging.getLogger("processor.inbox")

#: The DLQ reason of an inbox item that is not one msgpack array of field names and values.
BAD_INBOX_ITEM = "bad_inbox_item"
#: Entries one ``admit_inbox`` call moves at most (the script blocks Redis meanwhile).
ADMIT_ITEMS = 500
#: Bytes one call moves at most (at least one item, whatever its size).
ADMIT_BYTES = 4 << 20
#: Seconds a BLPOP waits for the bell by default (``WorkerConfig.idle_wait``; a
#: short wait: a shard this worker stops reading is let go within it, and a
#: stopping worker leaves within it).
WAIT_S = defaults.IDLE_WAIT
#: Idle waits between two admissions without a ring.
CHECK_EVERY = 30
#: Seconds between two log lines of the same failing admission.
LOG_EVERY_S = 60.0


class Admitter:
    """Admits the inbox of every shard this worker reads, until stopped."""

    def __init__(self, client: RedisClient, script: Script, namespace: Namespace,
                 membership: Membership, metrics: Metrics, dead_letters: DeadLetterLog,
                 dlq_maxlen: int,
                 wait: float = WAIT_S) -> None:
        self.client = client
        self.script = script  # (Scripts.admit_inbox)
        self.namespace = namespace
        self.membership = membership
        self.metrics = metrics
        self.dead_letters = dead_letters  # (Worker.dead_letters: the log's rate limit)
        self.dlq_maxlen = dlq_maxlen
        self.wait = wait  # seconds of each idle BLPOP (WAIT_S)
        self._logged: dict[int, tuple[str, float]] = {}  # shard -> last failure logged, when

    async def run(self, stopping: asyncio.Event) -> None:
        """One task per shard until ``stopping`` is set. Each then finishes what
        it is doing (a BLPOP returns within ``wait``) rather than being
        cancelled in the middle of a blocking read; only a cancelled ``run``
        cancels them (until each has ended: ``run_together``)."""
        await run_together(*(self._shard(shard, stopping) for shard in self.namespace.all()))

    async def _shard(self, shard: Shard, stopping: asyncio.Event) -> None:
        due, waits = True, 0  # admit at start: entries may have waited for a worker
        while not stopping.is_set():
            try:
                if not self.membership.reads(shard.index):
                    due = True  # admit first when the shard is read again
                    await _wait(stopping, self.wait)
                    continue
                if due or waits >= CHECK_EVERY:
                    due, waits = True, 0
                    await self.admit(shard)
                    due = False
                rung = await self.client.blpop([shard.inbox_bell], timeout=self.wait)
                due = bool(rung)
                waits += 0 if rung else 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis down, a refusal, a bug: never the worker's end
                self._failed(shard, exc)
                due = True
                await _wait(stopping, self.wait)

    async def admit(self, shard: Shard) -> int:
        """Move the shard's inbox into its stream, a call at a time, until it is
        empty; returns the entries admitted. An XADD the script could not do
        (out of memory, the stream's ids exhausted) raises
        ``AdmitFailed``: the entry stays first in the inbox."""
        total = 0
        while True:
            admitted, dead, left, error = await admit_inbox(self.script, build_admit(
                shard, ADMIT_ITEMS, ADMIT_BYTES, BAD_INBOX_ITEM, self.dlq_maxlen))
            if admitted:
                self.metrics.inbox_admitted.labels(str(shard.index)).inc(admitted)
                total += admitted
            if dead:
                self.metrics.dead_lettered([BAD_INBOX_ITEM] * dead)
                self.dead_letters.note(BAD_INBOX_ITEM, shard.index, dead)
            if error:
                raise AdmitFailed(error)
            if not left or not (admitted or dead):
                if self._logged.pop(shard.index, None) is not None:
                    log.info("admitting the inbox again", extra={"shard": shard.index})
                return total

    def _failed(self, shard: Shard, exc: Exception) -> None:
        """Count a failed admission and log it, once a minute per shard while it
        keeps failing the same way (it is retried every ``wait``)."""
        if not (isinstance(exc, AdmitFailed) or is_redis_failure(exc)):  # a bug, an odd reply
            self.metrics.step_failed(exc)
            log.exception("inbox admission failed unexpectedly", extra={"shard": shard.index})
            return
        self.metrics.redis_error(exc)
        text, now = f"{type(exc).__name__}: {exc}", time.monotonic()
        last = self._logged.get(shard.index)
        if last is None or last[0] != text or now - last[1] >= LOG_EVERY_S:
            # An outage is a warning (every Redis step retries through it);
            # a refusal (out of memory, the stream's ids exhausted) an error.
            level = logging.WARNING if is_transient(exc) else logging.ERROR
            log.log(level, "cannot admit the inbox into the stream; retrying, its entries "
                    "wait in the inbox", extra={"shard": shard.index, "error": text})
            self._logged[shard.index] = (text, now)


async def _wait(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less once ``stopping`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), timeout=seconds)


class AdmitFailed(Exception):
    """``admit_inbox`` stopped at an XADD Redis refused (its error text)."""

"""Prometheus metrics of one worker: this module owns every metric object.

The worker calls a few small hooks (``Metrics.read``, ``applied``,
``finalised``, ...); what the Lua scripts decide (dead letters by
reason, dropped entries) is counted from their replies, and what is
published (terminal status, dead letters found by the replay) from what the
worker hands to ``finalise_turns`` and that script's per-turn result.
Shared state (lag, pending, active turns, DLQ length) is sampled per shard
every few seconds by ``processor.worker.sampler.Sampler``, never per entry.

Labels are bounded: a shard index, a status, a reason code, an exception
class name. Never a response id, a consumer name or anything from a URL.
See docs/operations.md's "Metrics" section for what each metric means.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from redis.exceptions import RedisError

from processor import logs
from processor.engine.replay import Settled
from processor.redis_io.replies import as_text
from processor.wire.stream_ids import id_order

turn_log = logging.getLogger("processor.turns")
dead_log = logging.getLogger("processor.dlq")

_LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
_unpack = msgspec.msgpack.Decoder()

BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def label(value: Any) -> str:
    """A label value from a code the program chose; anything else is ``other``
    (so a surprising reply can never create an unbounded series)."""
    text = as_text(value)
    return text if _LABEL.match(text) else "other"


class Metrics:
    """The metric objects of one worker, in a registry of their own (several
    in-process workers never clash; ``processor run`` serves this registry)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.consumed = Counter(
            "processor_entries_consumed", "Input entries delivered to this worker "
            "(source=read: XREADGROUP, source=reclaim: XAUTOCLAIM)", ["shard", "source"],
            registry=r)
        self.stored = Counter(
            "processor_entries_stored", "Entries applied to their turn's state (merged at "
            "finalisation), as counted by apply_entries, and held turns' entries once "
            "published", registry=r)
        self.spilled = Counter(
            "processor_held_turns_spilled", "Held turns handed to apply_entries "
            "instead of being published from the worker's memory", registry=r)
        self.checkpointed = Counter(
            "processor_held_turns_checkpointed", "Checkpoints of held turns held for "
            "--hold-ms: their merge stored as one snapshot and their entries acked, the "
            "turn still held", registry=r)
        self.merged = Counter(
            "processor_merged_published", "Merged entries published, by status", ["status"],
            registry=r)
        self.terminal = Counter(
            "processor_terminal_events_published", "Terminal synthesis events published, "
            "by status", ["status"], registry=r)
        self.dlq = Counter(
            "processor_dlq_entries", "Entries dead-lettered, by reason", ["reason"], registry=r)
        self.cancels = Counter(
            "processor_cancels", "Turns published as cancelled", registry=r)
        self.dropped = Counter(
            "processor_dropped_entries", "Entries of cancelled turns acked and dropped",
            registry=r)
        self.reclaimed = Counter(
            "processor_reclaimed_entries", "Entries taken over from an idle consumer",
            ["shard"], registry=r)
        self.redis_errors = Counter(
            "processor_redis_errors", "Redis calls that failed, by exception class",
            ["error"], registry=r)
        self.redis_retries = Counter(
            "processor_redis_retries", "Redis calls retried after a connection error",
            registry=r)
        self.step_failures = Counter(
            "processor_step_failures", "Shard loop steps that failed with an unexpected "
            "error (the step is retried; its entries stay pending)", registry=r)
        self.batch = Histogram(
            "processor_batch_entries", "Entries per batch read", buckets=BATCH_BUCKETS,
            registry=r)
        self.merge_seconds = Histogram(
            "processor_merge_seconds", "Replaying one turn's stored entries into its "
            "outputs (the merge)", buckets=LATENCY_BUCKETS, registry=r)
        self.settled = Counter(
            "processor_turns_settled", "Turns merged for publishing, by where the merge "
            "came from (source=mirror: this worker's own mirror; source=replay: the stored "
            "records read back from Redis; source=held: a held turn)",
            ["source"], registry=r)
        self.live_without_mirror = Counter(
            "processor_live_without_mirror", "Batches of a stored, live turn whose deltas "
            "were not published because this worker has no mirror of the turn (dropped past "
            "the mirrors' byte budget or --mirror-turns, or stored by another worker): the "
            "turn says nothing more until its outcome, whose merged event is authoritative",
            registry=r)
        self.end_to_merged = Histogram(
            "processor_end_to_merged_seconds", "From the XADD of the entry that ended a turn "
            "(end, error, or the one past a limit; its stream id's time) to the turn's "
            "publication (this worker's clock)", buckets=LATENCY_BUCKETS, registry=r)
        self.finalise_seconds = Histogram(
            "processor_finalise_seconds", "One finalisation round: read the turns' state, "
            "merge, publish with finalise_turns", buckets=LATENCY_BUCKETS, registry=r)
        self.active = Gauge(
            "processor_active_turns", "Turns started and not yet published (sampled)",
            ["shard"], registry=r)
        self.lag = Gauge(
            "processor_group_lag", "Entries of the updates stream not yet delivered to the "
            "group (sampled)", ["shard"], registry=r)
        self.pending = Gauge(
            "processor_group_pending", "Entries delivered but not yet acked (sampled)",
            ["shard"], registry=r)
        self.consumers = Gauge(
            "processor_group_consumers", "Consumers in the group (sampled)", ["shard"],
            registry=r)
        self.dlq_length = Gauge(
            "processor_dlq_length", "Length of the dlq stream (sampled)", ["shard"], registry=r)
        self.bad_ids = Gauge(
            "processor_stream_ids_bad", "1 when the shard's updates stream has ids that are "
            "exhausted or far ahead of Redis's clock (producers' sends fail or will; "
            "processor repair-stream), else 0 (sampled)", ["shard"], registry=r)
        self.inbox_admitted = Counter(
            "processor_inbox_admitted", "Entries this worker moved from a shard's inbox "
            "(Producer(inbox=True)) into its updates stream", ["shard"], registry=r)
        self.cancel_requests = Counter(
            "processor_cancel_requests", "Cancel requests taken from the namespace's channel "
            "(clients that may not SET cancel keys), by outcome: set, kept (a cancel was "
            "there), refused (malformed or out of bounds)", ["outcome"], registry=r)
        self.inbox_length = Gauge(
            "processor_inbox_length", "Entries waiting in the shard's inbox (sampled)",
            ["shard"], registry=r)
        self.shards_read = Gauge(
            "processor_shards_read", "Shards this worker reads new entries from: those "
            "shard affinity gives it, plus any whose owners stalled", registry=r)
        self.shards = Gauge(
            "processor_shards", "Shards of the namespace (its record, {ns:0}:meta)",
            registry=r)
        self.lost_entries = Counter(
            "processor_lost_entries", "Entries deleted from the stream while pending (a "
            "trim, an XDEL), found by a reclaim or a take-back: their data is gone, each "
            "has an entry_lost dead letter", ["shard"], registry=r)
        self.state_lost = Counter(
            "processor_state_lost", "Times this worker found the namespace's state in Redis "
            "gone (its record missing or of another epoch: a Redis restarted without "
            "persistence) and published the turns it knew as state_lost", registry=r)
        self.groups_recreated = Counter(
            "processor_groups_recreated", "Consumer groups this worker found gone and put "
            "back (XGROUP DESTROY, the stream deleted)", ["shard"], registry=r)
        self.live_workers = Gauge(
            "processor_live_workers", "Live workers of the group as this worker's last "
            "beat saw them (more than processor_shards: every shard is shared)", registry=r)
        # The merged and terminal counters' children by turn status.
        self._published: dict[str, tuple[Counter, Counter]] = {}
        self._settled_held: Counter | None = None
        self.heartbeat = Gauge(
            "processor_loop_heartbeat_seconds", "Unix time of the event loop's last "
            "heartbeat", registry=r)
        self.sample_errors = Counter(
            "processor_sample_errors", "Periodic samples of shard state that failed",
            registry=r)

    # ------------------------------------------------------------ hooks

    def read(self, shard: int, count: int, source: str = "read") -> None:
        """A batch of ``count`` entries was delivered from ``shard``."""
        self.consumed.labels(str(shard), source).inc(count)
        self.batch.observe(count)
        if source == "reclaim":
            self.reclaimed.labels(str(shard)).inc(count)

    def settled_by_source(self) -> dict[str, int]:
        """Turns merged for publishing so far, by source (for the exit log line)."""
        return {sample.labels["source"]: int(sample.value)
                for metric in self.settled.collect() for sample in metric.samples
                if sample.name.endswith("_total")}

    def applied(self, counts: Sequence[Any]) -> None:
        """``apply_entries``' third reply: flat ``[name, n, ...]`` with
        ``stored``, ``dropped`` and ``dlq:<reason>``."""
        for i in range(0, len(counts) - 1, 2):
            name, n = as_text(counts[i]), int(counts[i + 1])
            if name == "stored":
                self.stored.inc(n)
            elif name == "dropped":
                self.dropped.inc(n)
            elif name.startswith("dlq:"):
                self.dlq.labels(label(name[4:])).inc(n)

    def finalised(self, outcomes: Sequence[Settled], results: Sequence[int]) -> None:
        """A finalise (``finalise_turns``, ``finalise_held``,
        ``publish_lost_turns``) was called with ``outcomes`` and replied
        ``results``: a 1 is a turn published, with its merged entry,
        terminal event and the dead letters its replay found. Also logs each
        published turn: completed ones at debug, cancelled and failed ones
        at info."""
        now = time.time()
        statuses: dict[str, int] = {}  # (one inc per status and call: each takes a lock)
        for outcome, result in zip(outcomes, results, strict=True):
            if int(result) != 1:
                continue
            if outcome.ending:  # (a cancel or a timeout ended it: no entry to time from)
                sent = id_order(outcome.ending)[0] / 1000
                # Redis's clock against this worker's: skewed clocks clamp at 0.
                self.end_to_merged.observe(max(0.0, now - sent))
            status: str = outcome.status
            statuses[status] = statuses.get(status, 0) + 1
            self.dead_lettered(dead_letter_reasons(outcome.dead_letters))
            level = logging.DEBUG if status == "completed" else logging.INFO
            if turn_log.isEnabledFor(level):
                turn_log.log(level, "turn published", extra=logs.turn_fields(outcome.outputs))
        for status, n in statuses.items():
            children = self._published.get(status)
            if children is None:  # (labels() and label() cost more than the inc)
                value = label(status)
                children = self._published[status] = (self.merged.labels(value),
                                                      self.terminal.labels(value))
            children[0].inc(n)
            children[1].inc(n)
            if status == "cancelled":
                self.cancels.inc(n)

    def held_published(self, turns: int, entries: int, late: Sequence[str] = ()) -> None:
        """``finalise_held`` published ``turns`` held turns of ``entries``
        entries, and dead-lettered those found after their turn's end
        (``late``: their reasons)."""
        if self._settled_held is None:  # (made on first use: no series without holding)
            self._settled_held = self.settled.labels("held")
        self._settled_held.inc(turns)
        self.stored.inc(entries)
        self.dead_lettered(late)

    def dead_lettered(self, reasons: Iterable[str]) -> None:
        """Entries a finalise dead-lettered, one reason each."""
        for reason in reasons:
            self.dlq.labels(label(reason)).inc()

    def redis_error(self, exc: BaseException | None, retried: bool = True) -> None:
        self.redis_errors.labels(label(type(exc).__name__)).inc()
        if retried:
            self.redis_retries.inc()

    def step_failed(self, exc: BaseException) -> None:
        """A shard loop step failed past the retries; a Redis error reply
        (OOM, NOPERM, READONLY, ...) is a Redis error too."""
        self.step_failures.inc()
        if isinstance(exc, RedisError):
            self.redis_error(exc, retried=False)

    @contextmanager
    def timed(self, histogram: Histogram) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            histogram.observe(time.perf_counter() - start)


def dead_letter_reasons(packed: bytes) -> list[str]:
    """The ``reason`` of each DLQ entry in a msgpack array of field arrays."""
    return [reason for reason, _id, _turn in dead_letter_summary(packed)]


def dead_letter_summary(packed: bytes) -> list[tuple[str, str, str]]:
    """``(reason, source_id, response_id)`` of each DLQ entry in a msgpack
    array of field arrays (never their payload)."""
    found = []
    for fields in _unpack.decode(packed) if packed else []:
        named = {fields[i]: fields[i + 1] for i in range(0, len(fields) - 1, 2)
                 if fields[i] in ("reason", "source_id", "response_id")}
        found.append((str(named.get("reason", "")), str(named.get("source_id", "")),
                      str(named.get("response_id", ""))))
    return found


class DeadLetterLog:
    """Dead letters in the worker's log, at ``warning``: one line per reason
    per ``every`` seconds, with the shard, the entry ids (up to ``max_ids``)
    and the turns where known, and how many of that reason were not logged
    since its last line. Never the payload: an entry's fields are user data
    (and a hostile producer's), and the DLQ keeps them."""

    def __init__(self, every: float = 10.0, max_ids: int = 20,
                 clock: Any = time.monotonic) -> None:
        self.every, self.max_ids, self.clock = every, max_ids, clock
        self._next: dict[str, float] = {}  # reason -> when it may be logged again
        self._quiet: dict[str, int] = {}  # reason -> dead letters not logged since

    def note(self, reason: str, shard: int, count: int, ids: Sequence[str] = (),
             turns: Sequence[str] = ()) -> None:
        """``count`` entries of ``shard`` were dead-lettered as ``reason``
        (``ids``, ``turns``: those known, maybe fewer than ``count``)."""
        if count <= 0:
            return
        now = self.clock()
        if now < self._next.get(reason, 0.0):
            self._quiet[reason] = self._quiet.get(reason, 0) + count
            return
        self._next[reason] = now + self.every
        fields: dict[str, Any] = {"reason": label(reason), "shard": shard, "count": count,
                                  "entry_ids": list(ids[:self.max_ids]),
                                  "not_logged": self._quiet.pop(reason, 0)}
        if turns:
            fields["turns"] = sorted(set(turns))[:self.max_ids]
        dead_log.warning("entries dead-lettered", extra=fields)

    def late(self, shard: int, turn: str, late: Sequence[tuple[str, str, str]]) -> None:
        """The entries of response id ``turn`` a finalise dead-lettered, found
        after the turn's end (``(reason, entry id, ...)`` each)."""
        by_reason: dict[str, list[str]] = {}
        for reason, entry_id, _ in late:
            by_reason.setdefault(reason, []).append(entry_id)
        for reason, ids in by_reason.items():
            self.note(reason, shard, len(ids), ids, [turn])

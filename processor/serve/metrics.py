"""Prometheus metrics of one ``processor serve`` process, in a registry of
its own (as the worker's, processor/worker/metrics.py). Labels are bounded: a
reason code or a kind of Redis call, never a response id or a token."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from processor.serve.tokens import Verdict

#: What the server asks Redis for, one label value each.
REDIS_CALLS = ("live", "position", "state", "snapshot", "history", "final", "cancel", "ready")


class ServeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.open_streams = Gauge(
            "processor_serve_open_streams", "Event streams open to clients", registry=r)
        self.streams = Counter(
            "processor_serve_streams", "Event streams opened", registry=r)
        self.events_sent = Counter(
            "processor_serve_events_sent", "SSE events written to clients (live events, "
            "snapshots, merged responses; not heartbeats)", registry=r)
        self.resumes = Counter(
            "processor_serve_resumes", "Event streams opened with a resume id "
            "(Last-Event-ID or ?after=)", registry=r)
        self.auth_refusals = Counter(
            "processor_serve_auth_refusals", "Requests refused for their token, by reason "
            "(missing, bad, expired: 401; forbidden: 403)", ["reason"], registry=r)
        self.dropped_clients = Counter(
            "processor_serve_dropped_clients", "Streams closed because their client did not "
            "read fast enough (queue full or a write timed out); each was told its resume id",
            registry=r)
        self.incomplete_history = Counter(
            "processor_serve_incomplete_history", "Joins and resumes whose past events could "
            "not all be found (a turn's live log expired, or workers run with --no-progress)",
            registry=r)
        self.redis_calls = Counter(
            "processor_serve_redis_calls", "Redis reads and writes made, by purpose "
            "(state, snapshot, history and final: the per-turn cache's reads of Redis, not "
            "the requests it answered, processor_serve_turn_cache_total; live: the "
            "readers' XREAD, one per shard at a time whatever the number of clients)",
            ["kind"], registry=r)
        self.redis_errors = Counter(
            "processor_serve_redis_errors", "Redis calls that failed (retried for the "
            "readers, an error answer for a request)", registry=r)
        self.redis_wait = Histogram(
            "processor_serve_redis_wait_seconds", "Seconds a request waited for one of the "
            "--redis-connections slots before its Redis calls (a burst of joins waits here "
            "instead of failing)", registry=r,
            buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
        self.cache = Counter(
            "processor_serve_turn_cache", "Reads of a turn's past by outcome: hit (answered "
            "from the per-turn cache), shared (a read another request started), read (a "
            "read of Redis)", ["outcome"], registry=r)
        self.over_budget = Counter(
            "processor_serve_reads_over_budget", "Reads of a turn's past cut at --read-budget "
            "bytes (the request gets what stays exact: the merged response at the end)",
            registry=r)
        self.connections_closed = Counter(
            "processor_serve_connections_closed", "Connections closed before a request, by "
            "reason: header_timeout (no whole request within --header-timeout), too_many "
            "(past --max-pending waiting connections, the oldest first)", ["reason"],
            registry=r)
        for outcome in ("hit", "shared", "read"):
            self.cache.labels(outcome)
        for reason in ("header_timeout", "too_many"):
            self.connections_closed.labels(reason)
        for verdict in Verdict:
            if verdict is not Verdict.OK:
                self.auth_refusals.labels(verdict.value)
        for kind in REDIS_CALLS:
            self.redis_calls.labels(kind)

"""The per-shard gauges of ``processor.worker.metrics.Metrics`` read
from Redis every few seconds (group lag, pending, consumers, active turns,
DLQ and inbox lengths), and the input stream's ids checked on the way."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from processor.redis_io.connections import is_redis_failure
from processor.redis_io.replies import as_text
from processor.wire import stream_ids
from processor.wire.keys import Namespace, Shard
from processor.worker.metrics import Metrics

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

log = logging.getLogger("processor.metrics")


class Sampler:
    """Samples each shard's group lag, pending count, consumers, active turns,
    DLQ length and inbox length every ``interval`` seconds (one pipeline per shard).

    It also checks the group's ``last-delivered-id`` against Redis's clock
    (``processor.wire.stream_ids``): an input stream whose ids are exhausted or
    far ahead sets ``processor_stream_ids_bad`` and is logged once, when it
    turns bad (and once when it is fine again). Here because this already
    reads ``XINFO GROUPS`` of every shard periodically: the check costs one
    ``TIME`` a round and reads no payload, and it sees the bad id once any
    worker has read the entry."""

    def __init__(
        self, client: RedisClient, namespace: Namespace, group: str, metrics: Metrics,
        interval: float = 5.0,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.group = group
        self.metrics = metrics
        self.interval = interval
        self._bad: set[int] = set()  # shards last found with bad ids

    async def run(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.interval)

    async def sample(self) -> None:
        try:
            now_ms: int | None = stream_ids.redis_ms(await self.client.time())
        except Exception as exc:
            now_ms = None  # no id checks this round
            self.metrics.sample_errors.inc()
            log.debug("sampling failed", extra={"error": repr(exc)})
        for shard in self.namespace.all():
            try:
                await self._sample_shard(shard, now_ms)
            except Exception as exc:  # an odd reply must not end the sampling for good
                self.metrics.sample_errors.inc()
                if is_redis_failure(exc):
                    log.debug("sampling failed", extra={"shard": shard.index, "error": repr(exc)})
                else:
                    log.exception("sampling failed", extra={"shard": shard.index})

    async def _sample_shard(self, shard: Shard, now_ms: int | None = None) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xinfo_groups(shard.updates)
            pipe.xlen(shard.updates)
            pipe.zcard(shard.active)
            pipe.xlen(shard.dlq)
            pipe.llen(shard.inbox)
            groups, length, active, dlq, inbox = await pipe.execute(raise_on_error=False)
        m, s = self.metrics, str(shard.index)
        if not isinstance(active, Exception):
            m.active.labels(s).set(active)
        if not isinstance(dlq, Exception):
            m.dlq_length.labels(s).set(dlq)
        if not isinstance(inbox, Exception):
            m.inbox_length.labels(s).set(inbox)
        info = find_group(groups, self.group) if isinstance(groups, list) else None
        if info is None:
            return  # no stream or no group yet: nothing meaningful to report
        pending = int(info.get("pending") or 0)
        m.pending.labels(s).set(pending)
        m.consumers.labels(s).set(int(info.get("consumers") or 0))
        if isinstance(length, Exception):  # (the pipeline's answer for it: a failed read)
            raise length
        m.lag.labels(s).set(group_lag(info, int(length), pending))
        if now_ms is not None:
            self._check_ids(shard, as_text(info.get("last-delivered-id") or "0-0"), now_ms)

    def _check_ids(self, shard: Shard, last: str, now_ms: int) -> None:
        problem = stream_ids.problem(last, now_ms)
        self.metrics.bad_ids.labels(str(shard.index)).set(1 if problem else 0)
        if problem and shard.index not in self._bad:
            self._bad.add(shard.index)
            log.error("input stream ids are bad: producers' sends fail (or will) until "
                      "`processor repair-stream` repairs the stream",
                      extra={"shard": shard.index, "stream": shard.updates, "problem": problem})
        elif not problem and shard.index in self._bad:
            self._bad.discard(shard.index)
            log.info("input stream ids are fine again",
                     extra={"shard": shard.index, "last_delivered_id": last})


def find_group(groups: list[dict[Any, Any]], group: str) -> dict[str, Any] | None:
    """Our group's entry of an XINFO GROUPS reply, with str keys."""
    for entry in groups:
        info = {as_text(k): v for k, v in entry.items()}
        if as_text(info.get("name", b"")) == group:
            return info
    return None


def group_lag(info: dict[str, Any], length: int, pending: int) -> int:
    """XINFO GROUPS ``lag`` (Redis 7.0+). Redis reports it as nil when entries
    were deleted out of order; then (and on Redis 6.2) the lag is the stream
    length minus the pending entries: the worker trims the entries it acks
    (all those below the oldest pending one), so what is left in the stream is
    pending, not yet delivered, or acked above a still pending entry (few)."""
    lag = info.get("lag")
    if lag is not None:
        return int(lag)
    return max(0, length - pending)

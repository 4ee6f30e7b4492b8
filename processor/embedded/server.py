"""One redis-server child process: started, stopped, killed and restarted."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

from processor.embedded.binaries import find_redis_server, redis_server_version, version_tuple
from processor.embedded.errors import EmbeddedRedisError
from processor.embedded.ports import HOST, free_port

_LOG_NAME = "redis-server.log"
_LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS server: its certificate, its key and the CA that signed it."""

    cert_file: Path
    key_file: Path
    ca_file: Path


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
        return version_tuple(self.version)

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
        """``start`` without blocking the event loop."""
        return await asyncio.to_thread(self.start)

    async def astop(self, timeout: float = 5.0) -> None:
        """``stop`` without blocking the event loop."""
        await asyncio.to_thread(self.stop, timeout)

    async def akill(self) -> None:
        """``kill`` without blocking the event loop."""
        await asyncio.to_thread(self.kill)

    async def arestart(self, timeout: float = 5.0) -> Self:
        """``restart`` without blocking the event loop."""
        return await asyncio.to_thread(self.restart, timeout)

    async def aclose(self) -> None:
        """``close`` without blocking the event loop."""
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

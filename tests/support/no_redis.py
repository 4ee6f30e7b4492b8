"""A stand-in Redis client for unit tests of a ``Worker`` that never reaches Redis."""

from __future__ import annotations


class NoRedis:
    """A client for a worker (``Worker(NoRedis(), config)``) that never
    reaches Redis: what the worker asks of its client when it is built."""

    def register_script(self, _source: str) -> None:
        return None

    def set_response_callback(self, _command: str, _callback: object) -> None:
        return None

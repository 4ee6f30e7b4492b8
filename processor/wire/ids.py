"""Identity rules of the contract: turn keys, shards, synthesis ids.

Pure functions, shared by the offline merge, the worker and the client, so
that every process computes the same answer (docs/contract.md §1 and §5).
"""

from __future__ import annotations

import uuid
import zlib
from typing import NamedTuple

# Fixed namespace for ResponseIds assigned from a turn_id: the same turn_id
# gives the same ResponseId on every worker and every restart.
_ASSIGNED_NS = uuid.UUID("6f1c1d1e-8a51-4c39-9d1f-7a0b9c3e2d10")

#: The most characters of a ResponseId, attempt id or correlation id
#: (docs/contract.md §3.2); cancel_turn.lua keeps the same bound on the id in
#: a cancellation key.
MAX_ID_LENGTH = 512


class TurnKey(NamedTuple):
    """The unit of merging: ``(response_id, attempt_id)``; attempt is "" when absent."""

    response_id: str
    attempt_id: str = ""

    def synthesis_id(self) -> str:
        """``<response_id>:synthesis`` or ``<response_id>:<attempt_id>:synthesis``."""
        if self.attempt_id:
            return f"{self.response_id}:{self.attempt_id}:synthesis"
        return f"{self.response_id}:synthesis"

    def encode(self) -> str:
        """A single string usable inside a Redis key (attempt after a NUL-free separator)."""
        return f"{len(self.response_id)}:{self.response_id}:{self.attempt_id}"

    @classmethod
    def decode(cls, text: str) -> TurnKey:
        """The inverse of ``encode``."""
        length, _, rest = text.partition(":")
        n = int(length)
        return cls(rest[:n], rest[n + 1 :])


#: ``new_turn_key(TurnKey, (response_id, attempt_id))``: a TurnKey without
#: NamedTuple's Python-level ``__new__``, for the per-entry hot paths.
new_turn_key = tuple.__new__


def response_id_for_turn(turn_id: str) -> str:
    """The ResponseId the processor assigns to a turn that only has a ``turn_id``."""
    return f"resp_{uuid.uuid5(_ASSIGNED_NS, turn_id).hex}"


def shard_of(routing_id: str, shards: int) -> int:
    """``crc32(id as UTF-8) % S`` (zlib's crc32, unsigned)."""
    if shards <= 1:
        return 0
    return zlib.crc32(routing_id.encode("utf-8")) % shards

"""A cancellation key's value and life (docs/contract.md §6): the one place
for their bounds. ``cancel_turn.lua`` (the Redis Function every client
cancels with) enforces the same numbers; workers read at most
``REASON_BYTES`` of any key's value (``GETRANGE``), so an administrator's
plain ``SET`` of any size costs them nothing, and ``reason_of`` makes
text of whatever bytes they get.
"""

from __future__ import annotations

import codecs

#: The most bytes of a reason the function stores and a worker reads (1 KiB).
REASON_BYTES = 1024
#: The reason stored when a client gives none.
DEFAULT_REASON = "cancelled"
#: A cancel key's life when the caller gives none, and the most it may ask
#: (seconds): long enough for a turn sent late or retried, short enough
#: that keys of turns that never come do not pile up.
DEFAULT_TTL = 3600
MAX_TTL = 86_400


def check_reason(reason: str) -> bytes:
    """A caller's reason as the function takes it: 1 to ``REASON_BYTES``
    bytes of UTF-8; ``ValueError`` otherwise."""
    if not isinstance(reason, str):
        raise ValueError(f"a cancel reason is text, not {type(reason).__name__}")
    try:
        data = reason.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a cancel reason must be valid Unicode text (a lone surrogate "
                         "cannot be encoded as UTF-8)") from None
    if not data or len(data) > REASON_BYTES:
        raise ValueError(f"a cancel reason is 1 to {REASON_BYTES} bytes of UTF-8 "
                         f"(this one is {len(data)})")
    return data


def check_ttl(ttl: int) -> int:
    """A caller's TTL in seconds: 1 to ``MAX_TTL``; ``ValueError`` otherwise."""
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_TTL:
        raise ValueError(f"a cancel's ttl is 1 to {MAX_TTL} seconds, not {ttl!r}")
    return ttl


def reason_of(raw: bytes | str | None) -> str | None:
    """The ``cancel_reason`` of a cancelled turn, from the first
    ``REASON_BYTES`` bytes of its key's value (``GETRANGE key 0 1023``;
    None: the key was gone). At most ``REASON_BYTES`` characters:
    invalid UTF-8 is replaced (U+FFFD), a character the cut split in two is
    left out, and an empty value is no reason (None). ``raw`` is what
    ``GETRANGE key 0 1023`` gave (longer is cut here as that would)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    head = raw[:REASON_BYTES]
    # A value of exactly REASON_BYTES may have been cut there: an incomplete
    # character at its end is left out rather than replaced.
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(
        head, final=len(head) < REASON_BYTES)
    return text or None

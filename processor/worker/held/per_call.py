"""How many held turns go in one script call (``in_calls``). Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

_T = TypeVar("_T")

#: What publishing a held turn costs a ``finalise_held`` call besides its
#: entries, counted in entries for ``in_calls``: its merged entry, terminal
#: event and the keys it deletes (measured on paced turns: about 130 µs of
#: redis-server a turn, about 6 µs an entry).
FINALISE_TURN_ENTRIES = 20


def in_calls(turns: Sequence[_T], entries: Callable[[_T], int], most: int) -> list[list[_T]]:
    """``turns`` in script calls of whole turns of about ``most`` held
    entries each (``--batch``, a read batch), in order: a call takes the
    next turn while its ``entries`` fit, and at least one. Held turns due
    or ending together in one call kept redis-server busy for as long as
    they were many, every client waiting (1,000 paced turns' checkpoint,
    50,000 entries: seconds; 500 ending turns' finalise: 50-210 ms). The
    rule of a checkpoint's calls and a finalise's (a turn counting
    ``FINALISE_TURN_ENTRIES`` more there); a spill applies it as it goes,
    the holds changing between its calls (``Spiller.spill``)."""
    calls: list[list[_T]] = []
    size = 0
    for turn in turns:
        n = entries(turn)
        if not calls or size + n > most:
            calls.append([])
            size = 0
        calls[-1].append(turn)
        size += n
    return calls

"""What a running turn's live events have said so far (``Shown``), and
where each message of its merge stood at its last full render
(``Layout``): the state that ``processor.engine.live`` diffs a merge
against and ``processor.engine.live_growth`` extends while the merge only
grows. The worker keeps one per turn (on its ``Held`` while held, on its
mirror while stored) and replaces it with the one a publish returns once
the publish is known to have run."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec


class Placed(NamedTuple):
    """A message as a turn's last full live render found it (``Layout``):
    its place in the merged order, its events' ``previous_message_id``,
    ``role``, ``agent_id`` and ``author_name``, and how many calls it has."""

    position: int
    previous: str | None
    role: str | None
    agent_id: Any
    author_name: str | None
    calls: int


class Layout(msgspec.Struct, gc=False):
    """The messages of the turn's merge when its ``Shown`` was made, kept
    for the renders that follow while the merge only grows
    (processor.engine.live_growth): good while the turn's ``Turn.mark`` is
    ``mark``. ``gone``: its texts or reasoning name messages no longer in
    the merge (a full render drops them)."""

    mark: int
    placed: dict[str, Placed]
    gone: bool


class Shown(msgspec.Struct, gc=False):
    """What a turn's live events have said so far: per message id, its text
    and reasoning; per ``(message id, index)``, each function call's
    arguments (as text) and each function result; the last step."""

    texts: dict[str, str] = msgspec.field(default_factory=dict)
    reasoning: dict[str, str] = msgspec.field(default_factory=dict)
    calls: dict[tuple[str, int], str] = msgspec.field(default_factory=dict)
    results: dict[tuple[str, int], Any] = msgspec.field(default_factory=dict)
    step: tuple[str, str] | None = None
    #: Messages in the merge with calls or results shown.
    tooled: frozenset[str] = frozenset()
    #: Messages with calls or results that left the merge (a reader dropped
    #: them; their calls and results are kept for a reader that did not).
    dropped: frozenset[str] = frozenset()
    #: Calls a message sent anew no longer has: a reader that does not drop
    #: messages still holds them, so the next call at such a place replaces.
    stale: frozenset[tuple[str, int]] = frozenset()
    layout: Layout | None = None

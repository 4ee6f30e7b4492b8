"""What a reader of live events holds after them: the text of each message
(``replay_texts``) and the messages' order (``replay_order``). The reference
a UI follows (docs/serve.md, docs/contract.md), property-tested against the
merge in tests/engine/test_live.py; the writer's side is
``processor.engine.live``."""

from __future__ import annotations

from typing import Any


def replay_texts(events: list[dict[str, Any]], kind: str = "synthesis.chunk") -> dict[str, str]:
    """What a reader holds per message after ``events`` (decoded JSON) of one
    chunk ``kind``: each chunk appended, or replacing with ``replace``. The
    reference a UI follows (and the tests check)."""
    out: dict[str, str] = {}
    for event in events:
        if event.get("type") != kind:
            continue
        mid = str(event.get("message_id"))
        out[mid] = event["delta"] if event.get("replace") else out.get(mid, "") + event["delta"]
    return out


def replay_order(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """The messages a reader holds after ``events`` (decoded JSON), in order,
    each with its role: each event of a message with a role places it just
    after its ``previous_message_id`` (first when None; where it was, or
    last when new, when that message is not known). Messages emptied since
    (an empty ``replace`` chunk) are still listed. The reference a UI
    follows for its messages' order (the tests check it)."""
    order: list[str] = []
    roles: dict[str, str | None] = {}
    for event in events:
        if "previous_message_id" not in event or event.get("role") is None:
            continue
        mid = str(event.get("message_id"))
        roles[mid] = event["role"]
        before = event["previous_message_id"]
        if before is not None and before not in order:
            if mid not in order:
                order.append(mid)
            continue
        if mid in order:
            order.remove(mid)
        order.insert(0 if before is None else order.index(before) + 1, mid)
    return [(mid, roles[mid]) for mid in order]

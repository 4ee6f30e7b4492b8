"""A turn's usage (docs/contract.md §4, rule 5): summed per counter, each
sum bounded by ``MAX_USAGE_COUNT``. Pure; ``processor.engine.merge.Turn``
folds it."""

from __future__ import annotations

from processor.engine.turn_state import TurnState
from processor.wire.models import MAX_USAGE_COUNT, Content


class UsageOverflow(Exception):
    """An update refused because its usage would take the turn's sum of a
    counter past ``MAX_USAGE_COUNT``; folding it
    changed nothing. (``TurnLife`` ends the turn
    as ``turn_limit`` there.)"""

    def __init__(self, counter: str, total: int) -> None:
        super().__init__(counter, total)
        self.counter = counter  # the counter's name, as the producer wrote it
        self.total = total  # the sum it would have reached


def usage_after(st: TurnState, contents: list[Content], inner: str) -> dict[str, int] | None:
    """The usage of inner response ``inner`` of the turn whose state is
    ``st`` once these contents' usage is taken (None: unchanged). Changes
    nothing.

    Usage leaves the messages and is summed per counter (rule 5). A usage
    content with ``merge_mode="replace"`` is Agent Framework's correction:
    the running total of its run so far (its function-calling loop emits
    one). Summing it would count that run twice, so it replaces what its
    inner response reported before; other inner responses (other agents
    of the turn) keep theirs.

    Raises ``UsageOverflow`` if the turn's sum (over every inner
    response, as rendered) of one of its counters would pass
    ``MAX_USAGE_COUNT``.
    """
    mine: dict[str, int] | None = None
    for content in contents:
        if content.type != "usage":
            continue
        details = {k: v for k, v in (content.usage_details or {}).items() if v is not None}
        if content.merge_mode == "replace":
            mine = details
        elif details:
            if mine is None:
                current = st.block_usage.get(inner)
                mine = current.copy() if current else {}
            for name, value in details.items():
                mine[name] = mine.get(name, 0) + value
    if mine:
        blocks = st.block_usage
        if st.usage or len(blocks) > (inner in blocks):  # several agents' usage
            for name, value in mine.items():
                total = value + (st.usage or {}).get(name, 0)
                for key, usage in blocks.items():
                    if key != inner:
                        total += usage.get(name, 0)
                if total > MAX_USAGE_COUNT:
                    raise UsageOverflow(name, total)
        elif max(mine.values()) > MAX_USAGE_COUNT:  # (the usual turn: its own alone)
            name = max(mine, key=mine.__getitem__)
            raise UsageOverflow(name, mine[name])
    return mine

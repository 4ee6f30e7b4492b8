"""What telling a running turn's progress costs as the turn grows in messages.

A turn of ``M`` messages (``--messages``, three agents handing off, 30
text updates each) then streams on in its last message, one text update
at a time; after each update its live events are found, as the worker
finds them for a publish: by ``live_events`` of a full render
(``Turn.finish``: every message rendered and walked) and by
``live_progress`` (the render skipped while the turn only grew); with
``--calls`` the last message streams a call's arguments instead. Prints
the CPU time per update (the fold included) of both, in one run::

    python bench/live_render.py [--messages 1,5,20,50,100] [--updates 3000] [--calls]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from live_turns import AGENTS
from workload import ROOT  # noqa: F401  (puts this tree's processor first on sys.path)

from processor.engine.lifecycle import Limits, TurnLife
from processor.engine.live import live_events
from processor.engine.live_growth import live_progress
from processor.engine.shown import Shown
from processor.ingest.decode import decode_plain
from processor.wire.ids import TurnKey
from processor.wire.models import Update

KEY = TurnKey("render")


def _update(message: int, text: str, call: bool = False) -> list[Update]:
    """A text update of message ``message`` (with ``call``: a chunk of its
    call's arguments)."""
    author = AGENTS[message % len(AGENTS)]
    content = ({"type": "function_call", "arguments": text} if call
               else {"type": "text", "text": text})
    found = decode_plain([json.dumps({
        "type": "agent_response_update", "role": "assistant", "message_id": f"m{message}",
        "author_name": author, "agent_id": f"agent-{author.lower()}",
        "contents": [content]}).encode()])
    assert found is not None
    return found


def _turn(messages: int) -> TurnLife:
    life = TurnLife(KEY, Limits(max_turn_updates=10**7, max_turn_bytes=10**10))
    for m in range(messages):
        for k in range(30):
            life.feed_updates(_update(m, f"word{k} "), "0-1", "0-1", 100, lambda n: (0, ""))
    return life


def full(life: TurnLife, shown: Shown) -> Shown:
    return live_events(KEY, life.turn.state.ids, shown, life.response(), 0)[1]


def grown(life: TurnLife, shown: Shown) -> Shown:
    return live_progress(KEY, life.turn.state.ids, shown, life.turn, 0)[1]


def per_update_us(messages: int, updates: int, tell: Callable[[TurnLife, Shown], Shown],
                  calls: bool = False) -> float:
    """CPU µs per update of folding it and telling it (``tell``); with
    ``calls`` the last message streams a call's arguments instead of text."""
    life = _turn(messages)
    if calls:
        start = decode_plain([json.dumps({
            "type": "agent_response_update", "message_id": f"m{messages - 1}",
            "contents": [{"type": "function_call", "call_id": "c1", "name": "search",
                          "arguments": "{"}]}).encode()])
        assert start is not None
        life.feed_updates(start, "0-1", "0-1", 100, lambda n: (0, ""))
    shown = tell(life, Shown())
    stream = [_update(messages - 1, f"more{i} ", calls) for i in range(updates)]
    began = time.process_time()
    for one in stream:
        life.feed_updates(one, "0-1", "0-1", 100, lambda n: (0, ""))
        shown = tell(life, shown)
    return 1e6 * (time.process_time() - began) / updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", default="1,5,20,50,100")
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--calls", action="store_true",
                        help="the last message streams a call's arguments, not text")
    args = parser.parse_args()
    print(f"{'messages':>8}  {'full render':>12}  {'live_progress':>13}  ratio")
    for messages in (int(m) for m in args.messages.split(",")):
        before = per_update_us(messages, args.updates, full, args.calls)
        after = per_update_us(messages, args.updates, grown, args.calls)
        print(f"{messages:>8}  {before:>9.1f} µs  {after:>10.1f} µs  {before / after:5.1f}x")


if __name__ == "__main__":
    main()

"""Loading the Lua state transitions from ``processor/scripts``.

Each ``<name>.lua`` is one atomic transition; ``--- includes/<part>`` lines
pull in shared fragments from ``scripts/includes`` (as BullMQ does). A fragment
names the fragments it uses with its own ``--- includes/`` lines: includes nest,
and each fragment is pulled in once per script, where it is first named (a
fragment that uses another must name it before its own functions, so Lua sees
the ``local function`` before the call). A cycle is an error. The text is
loaded once; redis-py's ``Script`` objects run it with EVALSHA and reload it
after a ``NOSCRIPT`` (a restarted or failed-over Redis). The producers'
scripts are also assembled into a Redis Function library, which producers
call without any right to load Lua (``processor.scripts.library``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

_INCLUDE = re.compile(r"^--- includes/(\w+)\s*$", re.MULTILINE)


class IncludeCycle(ValueError):
    """Fragments that include each other."""


def include(part: str) -> str:
    """The text of fragment ``includes/<part>.lua``, unexpanded."""
    return (resources.files("processor.scripts") / "includes" / f"{part}.lua").read_text()


def expand(text: str, read: Callable[[str], str] = include) -> str:
    """``text`` with its includes expanded, nested ones too, each fragment once
    (where it is first named; later names of it expand to nothing)."""
    seen: set[str] = set()

    def walk(text: str, stack: tuple[str, ...]) -> str:
        def one(match: re.Match[str]) -> str:
            part = match.group(1)
            if part in stack:
                raise IncludeCycle(" -> ".join((*stack, part)))
            if part in seen:
                return ""
            seen.add(part)
            return walk(read(part), (*stack, part))

        return _INCLUDE.sub(one, text)

    return walk(text, ())


@cache
def source(name: str) -> str:
    """The full text of script ``name`` with its includes expanded."""
    return expand((resources.files("processor.scripts") / f"{name}.lua").read_text())


NAMES = (
    "apply_entries", "finalise_turns", "sweep_shard", "send_update", "replay_dead_letter",
    "compact_turn", "beat_worker", "open_turns", "finalise_held", "cancelled_turns",
    "read_inputs", "create_namespace", "reshard_namespace", "dead_letter_lost",
    "publish_lost_turns", "recreate_group", "send_inbox", "admit_inbox",
    "publish_live", "cancel_turn", "checkpoint_held",
)


class Scripts:
    """The registered scripts of one Redis client, by name."""

    def __init__(self, client: RedisClient) -> None:
        self.apply_entries = client.register_script(source("apply_entries"))
        self.finalise_turns = client.register_script(source("finalise_turns"))
        self.sweep_shard = client.register_script(source("sweep_shard"))
        self.compact_turn = client.register_script(source("compact_turn"))
        self.beat_worker = client.register_script(source("beat_worker"))
        self.open_turns = client.register_script(source("open_turns"))
        self.finalise_held = client.register_script(source("finalise_held"))
        self.cancelled_turns = client.register_script(source("cancelled_turns"))
        self.dead_letter_lost = client.register_script(source("dead_letter_lost"))
        self.publish_lost_turns = client.register_script(source("publish_lost_turns"))
        self.recreate_group = client.register_script(source("recreate_group"))
        self.admit_inbox = client.register_script(source("admit_inbox"))
        self.publish_live = client.register_script(source("publish_live"))
        self.checkpoint_held = client.register_script(source("checkpoint_held"))

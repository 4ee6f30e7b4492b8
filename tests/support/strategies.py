"""Random multi-agent turns, for property tests and for the live-worker tests.

One generator, two drivers: ``random_turn`` draws from a seeded
``random.Random`` (the worker tests replay thousands of turns from a seed),
``turns`` draws from Hypothesis (so failures shrink). Both return the
input entries of one turn as in docs/contract.md §3, ``update`` given as a
dict, ending with a ``kind=end`` entry.

What a turn contains: several agents (each with its own inner response id,
author and agent id) streaming messages concurrently; keyed messages and
id-less runs; text, reasoning, parallel function-call chunks interleaved by
``call_id``; tool results for calls that were already streamed; usage,
finish reasons, random ``created_at``; unknown content types; producer
message ids that deliberately look like the ids the processor assigns.

Every delta carries a unique token ``<n>`` (text, reasoning, argument
chunks, results, unknown contents), so a test can find each one in the merged
output and check it appears exactly once, in its message, in arrival order.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st

from processor.engine.merge import turn_tag
from processor.wire.ids import TurnKey

T = TypeVar("T")

#: A delta token; ``TOKEN.findall(text)`` lists the tokens in a merged text.
TOKEN = re.compile(r"<(\d+)>")

FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")
AUTHORS = ("alice", "bob", "carol", "dave")
TOOL_NAMES = ("get_weather", "search", "handoff_to_bob", "lookup")
UNKNOWN_TYPE = "x_widget"  # a content type Agent Framework does not know


class Chooser(Protocol):
    """The random choices the generator makes; one driver per source."""

    def integer(self, lo: int, hi: int) -> int: ...

    def chance(self, p: float) -> bool: ...


class RngChooser:
    """Choices from a seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


class DrawChooser:
    """Choices drawn by Hypothesis. Both shrink toward 0, i.e. toward the
    lowest integer and toward "no", so a failing turn shrinks to a plain one."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def chance(self, p: float) -> bool:
        return self.draw(st.integers(0, 999)) >= round(1000 * (1 - p))


def pick(ch: Chooser, options: Sequence[T]) -> T:
    return options[ch.integer(0, len(options) - 1)]


@dataclass(frozen=True)
class Options:
    """Knobs of the generator. The defaults are the full mix.

    ``agents=1, idless=False, interleave=False, relabel=False`` gives turns
    where Agent Framework's own ``AgentResponse.from_updates`` is right (one
    inner response, every update keyed, no message interleaved with another,
    no message renaming its role or author).
    """

    max_messages: int = 8
    agents: int = 3
    idless: bool = True
    interleave: bool = True
    extras: bool = True  # unknown contents, created_at, usage, finish reasons, ids
    lookalike_ids: bool = True  # producer ids shaped like assigned ids
    relabel: bool = True  # a later update of a message names another role or author


@dataclass
class _Agent:
    agent_id: str
    author: str | None
    inner: str | None  # the update's own response_id (None: the turn's)


@dataclass
class _Stream:
    """One message an agent is streaming: its pending updates, in order."""

    agent: _Agent
    message_id: str | None
    role: str
    updates: list[dict[str, Any]] = field(default_factory=list)


class _TurnBuilder:
    def __init__(self, ch: Chooser, response_id: str, opts: Options) -> None:
        self.ch = ch
        self.rid = response_id
        self.opts = opts
        self.tag = turn_tag(TurnKey(response_id, ""))
        self.counter = itertools.count()
        self.ids = itertools.count()
        self.used_ids: set[str] = set()
        self.finished_calls: list[str] = []  # call ids whose chunks were all emitted
        self.closing: dict[int, str] = {}  # id(update) of a call's last chunk -> call id

    def token(self) -> str:
        return f"<{next(self.counter)}>"

    # ------------------------------------------------------------ agents

    def agents(self) -> list[_Agent]:
        count = self.ch.integer(1, max(1, self.opts.agents))
        out = []
        for i in range(count):
            if count == 1 or not self.opts.interleave:
                inner = pick(self.ch, (None, self.rid))
            else:
                inner = pick(self.ch, (None, self.rid, f"{self.rid}/inner-{i}", f"inner-{i}"))
            author = pick(self.ch, (*AUTHORS[:count], None)) if count > 1 else pick(
                self.ch, (AUTHORS[0], None)
            )
            out.append(_Agent(f"agent-{i}", author, inner))
        return out

    def message_id(self) -> str:
        """A producer id, sometimes one shaped like the processor's assigned ids."""
        if self.opts.lookalike_ids and self.ch.chance(0.25):
            candidate = f"msg-{self.ch.integer(0, 30)}-{self.tag}"
            candidate += "~" * self.ch.integer(0, 1)
        else:
            candidate = f"m{next(self.ids)}"
        if candidate in self.used_ids:
            candidate = f"m{next(self.ids)}-dup"
        self.used_ids.add(candidate)
        return candidate

    # ------------------------------------------------------------ streams

    def stream(self, agent: _Agent) -> _Stream:
        keyed = not self.opts.idless or self.ch.chance(0.6)
        if self.finished_calls and self.ch.chance(0.3):
            stream = _Stream(agent, self.message_id() if keyed else None, "tool")
            self._results(stream)
        else:
            stream = _Stream(agent, self.message_id() if keyed else None, "assistant")
            kind = self.ch.integer(0, 2)
            if kind == 1:
                self._calls(stream)
            else:
                if kind == 2 or self.ch.chance(0.2):
                    self._deltas(stream, "text_reasoning")
                self._deltas(stream, "text")
        if self.opts.extras and self.ch.chance(0.3):
            stream.updates.append(self._update(stream, [self._usage()]))
        if self.opts.extras and self.ch.chance(0.15):
            unknown = {"type": UNKNOWN_TYPE, "widget": {"token": self.token()}}
            at = self.ch.integer(0, len(stream.updates))
            stream.updates.insert(at, self._update(stream, [unknown]))
        self._decorate(stream)
        return stream

    def _deltas(self, stream: _Stream, kind: str) -> None:
        for _ in range(self.ch.integer(1, 4)):
            stream.updates.append(self._update(stream, [{"type": kind, "text": self.token()}]))

    def _calls(self, stream: _Stream) -> None:
        """Parallel calls: chunks of several call ids, interleaved."""
        calls = []
        for _ in range(self.ch.integer(1, 3)):
            call_id = f"call-{next(self.ids)}"
            chunks = self.ch.integer(1, 3)
            calls.append([call_id, chunks, 0])
        while calls:
            i = self.ch.integer(0, len(calls) - 1) if self.opts.interleave else 0
            call = calls[i]
            call_id, chunks, sent = call
            content: dict[str, Any] = {"type": "function_call", "call_id": call_id}
            args = self.token()
            if sent == 0:
                content["name"] = pick(self.ch, TOOL_NAMES)
                args = '{"q": "' + args
            if sent == chunks - 1:
                args += '"}'
            content["arguments"] = args
            update = self._update(stream, [content])
            stream.updates.append(update)
            call[2] += 1
            if call[2] == chunks:
                calls.pop(i)
                self.closing[id(update)] = call_id

    def _results(self, stream: _Stream) -> None:
        for _ in range(self.ch.integer(1, 2)):
            if not self.finished_calls:
                break
            call_id = self.finished_calls.pop(self.ch.integer(0, len(self.finished_calls) - 1))
            token = self.token()
            result: Any = f"done {token}" if self.ch.chance(0.7) else {"value": token}
            content = {"type": "function_result", "call_id": call_id, "result": result}
            stream.updates.append(self._update(stream, [content]))

    def _usage(self) -> dict[str, Any]:
        details = {
            "input_token_count": self.ch.integer(0, 50),
            "output_token_count": self.ch.integer(0, 50),
        }
        if self.ch.chance(0.5):
            details["x_custom_count"] = self.ch.integer(0, 9)  # an unknown counter
        usage: dict[str, Any] = {"type": "usage", "usage_details": details}
        if self.ch.chance(0.1):
            # Agent Framework's correction: the running total of this agent's run.
            usage["merge_mode"] = "replace"
        return usage

    def _update(self, stream: _Stream, contents: list[dict[str, Any]]) -> dict[str, Any]:
        update: dict[str, Any] = {"type": "agent_response_update", "contents": contents}
        update["role"] = stream.role
        if stream.agent.author is not None:
            update["author_name"] = stream.agent.author
        update["agent_id"] = stream.agent.agent_id
        if stream.agent.inner is not None:
            update["response_id"] = stream.agent.inner
        if stream.message_id is not None:
            update["message_id"] = stream.message_id
        return update

    def _decorate(self, stream: _Stream) -> None:
        """Leave out what a producer may leave out after the first update."""
        for i, update in enumerate(stream.updates):
            later = i > 0
            if later and self.ch.chance(0.3):
                update.pop("role", None)
            if later and self.ch.chance(0.3):
                update.pop("author_name", None)
            if later and self.ch.chance(0.2):
                update.pop("agent_id", None)
            if later and self.opts.relabel and self.ch.chance(0.05):
                # The first role and author a message names are its own (rule 3);
                # in an id-less run a new name starts a new message (rule 4).
                update["role"] = pick(self.ch, ("assistant", "tool", "user"))
            if later and self.opts.relabel and self.ch.chance(0.05):
                update["author_name"] = pick(self.ch, AUTHORS)
            if self.opts.extras and self.ch.chance(0.2):
                update["created_at"] = _timestamp(self.ch)
            if self.opts.extras and self.ch.chance(0.1):
                update["finish_reason"] = pick(self.ch, FINISH_REASONS)
            if self.opts.extras and self.ch.chance(0.05):
                update["additional_properties"] = {"trace": pick(self.ch, ("a", "b"))}

    # ------------------------------------------------------------ the turn

    def entries(self) -> list[dict[str, Any]]:
        agents = self.agents()
        pending: list[_Stream] = []
        started = 0
        total = self.ch.integer(1, max(1, self.opts.max_messages))
        out: list[dict[str, Any]] = []
        while started < total or pending:
            start = started < total and (not pending or self.ch.chance(0.35))
            if start and (self.opts.interleave or not pending):
                pending.append(self.stream(pick(self.ch, agents)))
                started += 1
                continue
            i = self.ch.integer(0, len(pending) - 1) if self.opts.interleave else 0
            stream = pending[i]
            update = stream.updates.pop(0)
            if id(update) in self.closing:
                # Results are only written for calls the agent already streamed.
                self.finished_calls.append(self.closing.pop(id(update)))
            out.append(self._entry(update))
            if not stream.updates:
                pending.pop(i)
        if self.opts.extras and self.ch.chance(0.3):
            out.append(self._entry({"type": "agent_response_update", "contents": [self._usage()],
                                    "finish_reason": pick(self.ch, FINISH_REASONS)}))
        out.append({"response_id": self.rid, "kind": "end"})
        return out

    def _entry(self, update: dict[str, Any]) -> dict[str, Any]:
        entry: dict[str, Any] = {"response_id": self.rid, "kind": "update", "update": update}
        if self.opts.extras and self.ch.chance(0.1):
            entry["session_id"] = f"session-{self.rid}"
            entry["step_id"] = f"step-{self.ch.integer(0, 9)}"
        return entry


def _timestamp(ch: Chooser) -> str:
    return f"2026-01-{ch.integer(1, 28):02d}T{ch.integer(0, 23):02d}:{ch.integer(0, 59):02d}:00Z"


def build_turn(ch: Chooser, response_id: str, opts: Options | None = None) -> list[dict[str, Any]]:
    """The entries of one random turn, from any ``Chooser``."""
    return _TurnBuilder(ch, response_id, opts or Options()).entries()


def random_turn(rng: random.Random, response_id: str, **options: Any) -> list[dict[str, Any]]:
    """A random turn from a seeded ``random.Random`` (see ``Options``)."""
    return build_turn(RngChooser(rng), response_id, Options(**options))


@st.composite
def turns(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    response_id: str | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Hypothesis strategy for one random turn (see ``Options``)."""
    rid = response_id or draw(st.sampled_from(("turn-1", "resp_abc", "R")))
    return build_turn(DrawChooser(draw), rid, Options(**options))


# ---------------------------------------------------------------- numbered entries

#: What became of one numbered entry (docs/contract.md §3.4) on its way to a
#: worker: it arrived, it was lost (with Redis's data, trimmed or deleted
#: before it was read), or a producer's retry got it through twice (the
#: copy right after it: the producer sends the next entry only then).
FATES = ("sent", "lost", "doubled")


def numbered(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of one turn numbered as ``Producer`` numbers them: 0, 1, ..."""
    return [{**entry, "n": str(i)} for i, entry in enumerate(entries)]


@st.composite
def deliveries(
    draw: Callable[[st.SearchStrategy[Any]], Any], entries: list[dict[str, Any]],
    fates: Sequence[str] = FATES,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The numbered ``entries`` as a worker reads them, each one's fate drawn
    from ``fates`` (shrinking towards ``sent``), and the fates."""
    drawn = [draw(st.sampled_from(fates)) for _ in entries]
    out: list[dict[str, Any]] = []
    for entry, fate in zip(numbered(entries), drawn, strict=True):
        if fate != "lost":
            out.append(entry)
        if fate == "doubled":
            out.append(dict(entry))
    return out, drawn

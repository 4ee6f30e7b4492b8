"""The benchmarks' agent turns: genuine ``AgentResponseUpdate.to_dict()``
JSON built with Agent Framework from a fixed seed, shared by the pure-merge
benchmark (``bench/merge_bench.py``) and the end-to-end one
(``bench/workload.py``), so both measure the same data.

2-3 agents per turn handing off under their own response ids, 10-40 updates
per turn, text deltas of 2-20 characters, some reasoning (keyed and
id-less), tool calls in 2-4 argument chunks plus their results, usage and
finish reason last; ``CONCURRENT_TURNS`` turns in flight, their entries
interleaved as on a shared stream.
"""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_framework import AgentResponseUpdate, Content

SEED = 20240917
#: Turns in flight at once: their entries interleave, as on a shared stream.
CONCURRENT_TURNS = 8

AGENTS = (
    ("triage", "Triage"),
    ("researcher", "Researcher"),
    ("writer", "Writer"),
    ("critic", "Critic"),
)
TOOLS = ("search_web", "get_weather", "lookup_order", "run_sql", "fetch_document")
_VOCABULARY = (
    "the quick brown fox jumps over a lazy dog while agents hand off work to each other "
    "and stream partial answers token by token with tools results and reasoning about "
    "weather orders invoices customers shipping refunds"
)
WORDS = tuple(_VOCABULARY.split())

Entry = tuple[str, str]  # (the entry's response_id field, the update's JSON text)


# ---------------------------------------------------------------- workload


class _Gen:
    """A seeded generator of realistic multi-agent turns."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = datetime(2025, 1, 1, tzinfo=UTC)

    def _ts(self) -> str:
        self.clock += timedelta(milliseconds=self.rng.randint(5, 80))
        return self.clock.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    def _delta(self) -> str:
        rng = self.rng
        n = rng.randint(2, 20)
        out = ""
        while len(out) < n:
            out += rng.choice(WORDS) + " "
        return out[:n]

    def _json_chunks(self, payload: dict[str, Any], pieces: int) -> list[str]:
        text = json.dumps(payload)
        cuts = sorted(self.rng.sample(range(1, len(text)), pieces - 1)) if pieces > 1 else []
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in itertools.pairwise(bounds)]

    def turn(self, index: int, size: int) -> list[AgentResponseUpdate]:
        """One turn of exactly ``size`` updates (10..40), usage at the end."""
        rng = self.rng
        rid = f"resp_{index:07d}"
        n_agents = rng.choice((2, 2, 3))
        agents = rng.sample(AGENTS, n_agents)
        budget = size - 1  # the last update carries usage and finish_reason
        shares = [3] * n_agents
        for _ in range(budget - 3 * n_agents):
            shares[rng.randrange(n_agents)] += 1
        updates: list[AgentResponseUpdate] = []
        for j, ((agent, name), share) in enumerate(zip(agents, shares, strict=True)):
            # The first agent answers under the turn's id, the ones it hands
            # off to under their own (inner) response ids.
            inner = rid if j == 0 else f"{rid}-{agent}"
            updates.extend(self._agent(rid, inner, j, agent, name, share))
        usage = {
            "input_token_count": rng.randint(100, 4000),
            "output_token_count": rng.randint(20, 800),
        }
        usage["total_token_count"] = usage["input_token_count"] + usage["output_token_count"]
        updates.append(
            AgentResponseUpdate(
                contents=[Content.from_usage(usage)],
                role="assistant",
                response_id=rid,
                finish_reason="stop",
                created_at=self._ts(),
            )
        )
        assert len(updates) == size
        return updates

    def _agent(
        self, rid: str, inner: str, j: int, agent: str, name: str, share: int
    ) -> list[AgentResponseUpdate]:
        rng = self.rng
        msg = f"msg_{rid}_{j}"

        def update(contents: list[Content], **kw: Any) -> AgentResponseUpdate:
            kw.setdefault("role", "assistant")
            kw.setdefault("message_id", msg)
            return AgentResponseUpdate(
                contents=contents,
                author_name=name,
                agent_id=f"agent-{agent}",
                response_id=inner,
                created_at=self._ts(),
                **kw,
            )

        out: list[AgentResponseUpdate] = []
        left = share
        # Some reasoning first; half the time id-less (folds into the message).
        if left >= 5 and rng.random() < 0.35:
            keyed = rng.random() < 0.5
            for _ in range(rng.randint(1, 3)):
                reasoning = Content.from_text_reasoning(text=self._delta())
                out.append(update([reasoning], message_id=msg if keyed else None))
                left -= 1
        # A tool call: argument chunks, then its result.
        if left >= 5 and rng.random() < 0.45:
            call_id = f"call_{rid}_{j}"
            tool = rng.choice(TOOLS)
            args = {"query": self._delta(), "limit": rng.randint(1, 50)}
            chunks = self._json_chunks(args, rng.randint(2, min(4, left - 2)))
            for k, chunk in enumerate(chunks):
                call = Content.from_function_call(
                    call_id=call_id, name=tool if k == 0 else "", arguments=chunk
                )
                out.append(update([call]))
                left -= 1
            result = Content.from_function_result(
                call_id=call_id, result=json.dumps({"ok": True, "value": self._delta()})
            )
            out.append(update([result], role="tool", message_id=f"msg_{rid}_{j}_tool"))
            left -= 1
            msg = f"msg_{rid}_{j}_answer"
        # The answer, as text deltas.
        for _ in range(left):
            out.append(update([Content.from_text(self._delta())]))
        return out


def build_entries(total: int, seed: int = SEED) -> list[Entry]:
    """``total`` update entries, turns of 10..40 updates interleaved in arrival order."""
    gen = _Gen(seed)
    rng = random.Random(seed + 1)
    sizes: list[int] = []
    left = total
    while left > 0:
        # Never leave a remainder shorter than a turn (total >= 10).
        size = left if left <= 40 else rng.randint(10, min(40, left - 10))
        sizes.append(size)
        left -= size
    pending: list[list[Entry]] = []
    out: list[Entry] = []
    next_turn = 0
    while next_turn < len(sizes) or pending:
        while len(pending) < CONCURRENT_TURNS and next_turn < len(sizes):
            updates = gen.turn(next_turn, sizes[next_turn])
            rid = f"resp_{next_turn:07d}"
            texts = [json.dumps(u.to_dict()) for u in updates]
            pending.append([(rid, t) for t in reversed(texts)])
            next_turn += 1
        i = rng.randrange(len(pending))
        out.append(pending[i].pop())
        if not pending[i]:
            pending.pop(i)
    assert len(out) == total
    return out

"""The chaos soak's plan (tests/support/chaos.py runs it): which turns, how each
one ends (end, producer error, cancel part-way, silence), the marker each
update carries, and the order the producer writes their entries in."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from support.strategies import random_turn

MARKER = "chaos_e"  # additional_properties key prefix of an update's marker


@dataclass(frozen=True)
class ChaosConfig:
    turns: int = 150
    max_messages: int = 9  # about 21 updates per turn
    workers: int = 3
    shards: int = 1
    kill_every: float = 2.0  # seconds between SIGKILLs (jittered +-50 %)
    cancel_rate: float = 0.10
    error_rate: float = 0.05
    silent_rate: float = 0.02
    window: int = 40  # turns open at once
    chunk: int = 50  # entries per XADD pipeline
    produce_seconds: float = 20.0  # the producer spreads its writes over this long
    turn_timeout: float = 6.0
    reclaim_idle_ms: int = 1000
    batch: int = 100
    restart_redis: bool = True  # needs ChaosRun.restart
    client_kill: bool = True
    seed: int = 1
    hold_turns: bool = True  # the workers hold turns (the default), else --no-hold-turns
    # Held turns are checkpointed every --hold-ms: short, so that kills and the
    # Redis restart land between checkpoints of the soak's turns.
    hold_ms: int = 700
    cpu_load: int = 0  # busy-loop processes competing for the CPUs while it runs


@dataclass
class PlannedTurn:
    rid: str
    entries: list[dict[str, Any]]  # every entry the producer may send, markers set
    plan: str  # completed | error | silent | cancelled
    cancel_at: int | None = None  # the cancel key is SET before entries[cancel_at]
    stop_after_cancel: bool = False  # a cooperative producer stops at the cancel

    @property
    def sent(self) -> list[int]:
        """Indexes of the entries the producer sends."""
        if self.cancel_at is not None and self.stop_after_cancel:
            return list(range(self.cancel_at))
        return list(range(len(self.entries)))


def marker(index: int) -> str:
    return f"{MARKER}{index}"


def plan_turns(cfg: ChaosConfig) -> list[PlannedTurn]:
    rng = random.Random(cfg.seed)
    out = []
    for t in range(cfg.turns):
        rid = f"chaos-{cfg.seed}-{t:05d}"
        entries = random_turn(rng, rid, max_messages=cfg.max_messages)
        for i, entry in enumerate(entries):
            if "update" in entry:
                props = entry["update"].setdefault("additional_properties", {})
                props[marker(i)] = 1
        roll = rng.random()
        turn = PlannedTurn(rid, entries, "completed")
        if roll < cfg.cancel_rate:
            turn.plan = "cancelled"
            turn.cancel_at = rng.randrange(len(entries))
            # A cancel before the first entry: the producer goes on (else the
            # turn would never exist); otherwise half of them stop at once.
            turn.stop_after_cancel = turn.cancel_at > 0 and rng.random() < 0.5
        elif roll < cfg.cancel_rate + cfg.error_rate:
            turn.plan = "error"
            entries[-1] = {"response_id": rid, "kind": "error", "error": "model overloaded",
                           "code": "503"}
        elif roll < cfg.cancel_rate + cfg.error_rate + cfg.silent_rate:
            turn.plan = "silent"
            entries.pop()  # never ends: turn_timeout
        out.append(turn)
    return out


Action = tuple[str, int, int]  # ("entry" | "cancel", turn index, entry index)


def arrival(turns: list[PlannedTurn], window: int, rng: random.Random) -> list[Action]:
    """The producers' writes in one order: ``window`` turns open at once,
    each turn's own entries (and its cancel) in order."""
    todo: list[list[Action]] = []
    for t, turn in enumerate(turns):
        acts: list[Action] = []
        for i in turn.sent:
            if i == turn.cancel_at:
                acts.append(("cancel", t, i))
            acts.append(("entry", t, i))
        if turn.cancel_at is not None and turn.cancel_at not in turn.sent:
            acts.append(("cancel", t, turn.cancel_at))
        todo.append(acts)
    out: list[Action] = []
    waiting = list(range(len(turns)))[::-1]
    open_: list[list[Action]] = []
    while waiting or open_:
        while waiting and len(open_) < window:
            open_.append(list(reversed(todo[waiting.pop()])))
        k = rng.randrange(len(open_))
        out.append(open_[k].pop())
        if not open_[k]:
            open_[k] = open_[-1]
            open_.pop()
    return out

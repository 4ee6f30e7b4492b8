"""The chaos soak's figures and its checks of what came out: every sent
entry merged, dropped or dead-lettered exactly once, each response
byte-identical to ``processor merge`` of the entries it merged (with the
cancel where one cut it), and each turn's events in order with one terminal
event. A mixin of ``chaos.ChaosRun``, which runs the soak and reads
the outputs."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from processor.engine.lifecycle import Limits
from processor.wire.ids import TurnKey
from support.chaos_plan import ChaosConfig, PlannedTurn, marker
from support.turn_reference import offline_results


@dataclass
class Figures:
    """What happened and what came out (printed, and recorded by the bench)."""

    turns: int = 0
    entries_sent: int = 0
    updates_sent: int = 0
    planned: Counter[str] = field(default_factory=Counter)
    worker_kills: int = 0
    kills_holding_entries: int = 0  # killed while holding read, unapplied entries
    redis_restarts: int = 0
    client_kills: int = 0  # connections killed
    seconds_producing: float = 0.0
    seconds_total: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    merged_entries: int = 0  # entries merged into responses
    dropped: int = 0
    dlq: Counter[str] = field(default_factory=Counter)  # by reason
    lost: int = 0
    duplicated: int = 0
    mismatches: int = 0  # responses differing from processor merge
    unexpected: int = 0  # turns whose outcome is not their plan (e.g. an early timeout)
    reclaim_logs: int = 0  # "reclaimed entries" log lines
    held_published: int = 0  # turns published as held (--hold-turns), by the workers that exited
    spill_logs: int = 0  # "spilled held turns" log lines
    spills: Counter[str] = field(default_factory=Counter)  # those lines, by why
    error_logs: int = 0  # worker log lines at level error
    leftover_keys: int = 0
    # Cancelled turns: how much of what was sent their partial merges kept.
    cancelled: int = 0
    cancelled_partial: int = 0  # some but not all of the sent updates merged
    cancelled_empty: int = 0  # nothing merged (e.g. cancelled before its first entry)
    cancelled_whole: int = 0  # everything sent merged (the producer stopped at the cancel)
    cancelled_merged: int = 0  # entries merged into cancelled turns
    cancelled_sent: int = 0  # entries sent for them
    holes: int = 0  # partial merges that are not a prefix of the turn (must be 0)

    def lines(self) -> list[str]:
        return [
            f"turns {self.turns}: {dict(self.planned)}; entries sent {self.entries_sent} "
            f"({self.updates_sent} updates)",
            f"faults: {self.worker_kills} worker SIGKILLs ({self.kills_holding_entries} holding "
            f"unapplied entries), {self.redis_restarts} Redis "
            f"restarts, {self.client_kills} connections killed",
            f"time: {self.seconds_producing:.1f} s producing, {self.seconds_total:.1f} s "
            f"until drained",
            f"outcomes: {dict(self.statuses)}; entries merged {self.merged_entries}, "
            f"dropped {self.dropped}, dlq {dict(self.dlq)}",
            f"lost {self.lost}, duplicated {self.duplicated}, responses differing from "
            f"processor merge {self.mismatches}, unexpected outcomes {self.unexpected}, "
            f"state keys left {self.leftover_keys}",
            f"worker logs: {self.reclaim_logs} reclaims, {self.error_logs} error lines, "
            f"{self.spill_logs} spills of held turns {dict(self.spills)}, "
            f"{self.held_published} turns published held by the workers that exited",
            f"cancelled turns {self.cancelled}: {self.cancelled_partial} partial merges, "
            f"{self.cancelled_whole} whole, {self.cancelled_empty} empty; "
            f"{self.cancelled_merged} of {self.cancelled_sent} sent entries merged; "
            f"partial merges with a hole (not a prefix of the turn) {self.holes}",
        ]


class ChaosChecks:
    """Checking a soak's outputs against its plan, into ``figures`` and ``problems``."""

    cfg: ChaosConfig
    figures: Figures
    problems: list[str]

    def _check(self, turns: list[PlannedTurn], ids: dict[tuple[int, int], tuple[int, str]],
               outputs: Any, done_dropped: dict[str, int]) -> None:
        fig = self.figures
        where = {loc: key for key, loc in ids.items()}
        dead: dict[int, list[dict[str, str]]] = {}
        seen_sources: Counter[tuple[int, str]] = Counter()
        for entry in outputs.dlq:
            loc = (int(entry["_shard"]), entry.get("source_id", ""))
            seen_sources[loc] += 1
            fig.dlq[entry.get("reason", "?")] += 1
            if loc in where:
                dead.setdefault(where[loc][0], []).append(entry)
            else:
                self.problems.append(f"DLQ entry of no sent entry: {entry}"[:500])
        fig.duplicated += sum(n - 1 for n in seen_sources.values() if n > 1)
        for t, turn in enumerate(turns):
            got = outputs.turns.get(TurnKey(turn.rid))
            self._check_turn(t, turn, got, dead.get(t, []), done_dropped.get(turn.rid, 0))
        if fig.leftover_keys:
            self.problems.append(f"{fig.leftover_keys} state keys left")

    def _check_turn(self, t: int, turn: PlannedTurn, got: Any, dead: list[dict[str, str]],
                    late_drops: int) -> None:
        fig = self.figures
        sent = turn.sent
        if got is None or not got.merged:
            fig.lost += len(sent)
            self.problems.append(f"{turn.rid}: never merged")
            return
        if len(got.merged) != 1:
            fig.duplicated += len(got.merged) - 1
            self.problems.append(f"{turn.rid}: merged {len(got.merged)} times")
        self._check_events(turn, got)
        entry = got.merged[0]
        response = json.loads(entry["response"])
        meta = json.loads(entry["meta"])
        status = entry["status"]
        code = (meta.get("error") or {}).get("code")
        outcome = code or status
        fig.statuses[outcome] += 1
        props = response.get("additional_properties") or {}
        merged = {i for i in sent if marker(i) in props}
        closing = len(turn.entries) - 1 if turn.plan != "silent" else None
        if status in ("completed", "error") and code != "turn_timeout" and closing in sent:
            merged.add(closing)
        # The expected response: processor merge of what was merged, then the cut.
        lines = [turn.entries[i] for i in sorted(merged)]
        if status == "cancelled":
            lines.append({"kind": "cancel", "response_id": turn.rid})
        if status == "cancelled" and not merged:
            # Nothing applied before the cancel: offline, the cancel line comes
            # first and every entry after it is dropped.
            lines = [lines[-1], *(turn.entries[i] for i in sent)]
        if status == "cancelled":
            self._count_cut(turn, merged, sent)
        want = offline_results(lines, self._limits())
        key = TurnKey(turn.rid)
        if key not in want or want[key].status != status or want[key].response != entry["response"]:
            fig.mismatches += 1
            self.problems.append(f"{turn.rid}: live {status} differs from processor merge\n"
                                 f"live:    {entry['response'][:1500]}\n"
                                 f"offline: {want.get(key) and want[key].response[:1500]}")
        expected = {"completed": "completed", "error": "producer_error",
                    "silent": "turn_timeout", "cancelled": None}[turn.plan]
        if expected is not None and (outcome != expected or merged != set(sent)):
            fig.unexpected += 1
            self.problems.append(f"{turn.rid}: planned {turn.plan}, got {outcome} with "
                                 f"{len(merged)}/{len(sent)} entries merged")
        # Every sent entry exactly once: merged, dropped or dead-lettered.
        counts = meta["counts"]
        dropped = counts["dropped"] + late_drops
        if counts["entries"] != len(merged):
            self.problems.append(f"{turn.rid}: meta counts {counts['entries']} entries, "
                                 f"markers show {len(merged)}")
        fig.merged_entries += len(merged)
        fig.dropped += dropped
        accounted = len(merged) + dropped + len(dead)
        if accounted < len(sent):
            fig.lost += len(sent) - accounted
            self.problems.append(f"{turn.rid}: {len(sent) - accounted} entries lost")
        elif accounted > len(sent):
            fig.duplicated += accounted - len(sent)
            self.problems.append(f"{turn.rid}: {accounted - len(sent)} entries counted twice")
        for d in dead:
            update = d.get("update", "")
            if any(f'"{marker(i)}"' in update for i in merged):
                fig.duplicated += 1
                self.problems.append(f"{turn.rid}: entry both merged and dead-lettered")

    def _count_cut(self, turn: PlannedTurn, merged: set[int], sent: list[int]) -> None:
        """A cancelled turn's partial merge: counted, and checked to be a prefix
        of what was sent (docs/design.md, *Cancellation*: no entry older than a
        merged one is missing)."""
        fig = self.figures
        fig.cancelled += 1
        fig.cancelled_merged += len(merged)
        fig.cancelled_sent += len(sent)
        if not merged:
            fig.cancelled_empty += 1
        elif len(merged) == len(sent):
            fig.cancelled_whole += 1
        else:
            fig.cancelled_partial += 1
        if merged != set(sorted(sent)[:len(merged)]):
            fig.holes += 1
            self.problems.append(f"{turn.rid}: cancelled with a hole: merged {sorted(merged)} "
                                 f"of {sorted(sent)}")

    def _check_events(self, turn: PlannedTurn, got: Any) -> None:
        types = [e["type"] for e in got.events]
        seqs = [e["seq"] for e in got.events]
        if (types.count("synthesis") != 1 or types[-1] != "synthesis"
                or types.count("synthesis.started") != 1 or types[0] != "synthesis.started"
                or seqs != list(range(len(seqs)))):
            self.problems.append(f"{turn.rid}: events {list(zip(types, seqs, strict=True))}")
        elif got.events[-1]["status"] != got.merged[0]["status"]:
            self.problems.append(f"{turn.rid}: terminal status differs from merged status")

    def _limits(self) -> Limits:
        return Limits(turn_timeout=self.cfg.turn_timeout)

"""A busy ``processor run`` at ``info`` says what it does: a ``progress``
line every ``--log-interval`` seconds with the turns it published, the
input entries it applied (and their rates), the dead letters, and the
namespace's lag."""

from __future__ import annotations

import json
from typing import Any

from support.worker_harness import Harness

TURNS = 40


def _turn(rid: str) -> list[dict[str, Any]]:
    update = {"contents": [{"type": "text", "text": "hi"}], "role": "assistant"}
    return [{"response_id": rid, "update": json.dumps(update)},
            {"response_id": rid, "update": json.dumps(update)},
            {"response_id": rid, "kind": "end"}]


def _progress(log: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.splitlines()]
    return [line for line in lines if line["msg"] == "progress"]


async def test_a_busy_worker_logs_progress_at_info(redis_url: str, namespace: str,
                                                   tmp_path: Any) -> None:
    async with Harness(redis_url, namespace, 2, log_dir=tmp_path) as harness:
        sub = harness.spawn(None, log_level="info", log_interval=0.3)
        await harness.wait_started([sub])
        entries = [entry for n in range(TURNS) for entry in _turn(f"busy-{n}")]
        entries.append({"response_id": "poison", "update": "{not json"})  # a dead letter
        await harness.add(entries)
        await harness.wait_merged(TURNS)
        await harness.wait_applied()

        async def counted() -> bool:  # the lines add up to what was done
            lines = _progress(sub.log())
            return (sum(line["turns_published"] for line in lines) == TURNS
                    and sum(line["entries"] for line in lines) == 3 * TURNS
                    and sum(line["dead_lettered"] for line in lines) == 1)

        await harness.wait_for(counted, 30, "progress lines counting every turn and entry")
        assert harness.terminate(sub) == 0
    lines = _progress(sub.log())
    for line in lines:
        assert line["level"] == "info"
        assert line["interval_s"] > 0
        assert line["turns_per_s"] == round(line["turns_published"] / line["interval_s"], 1)
        assert line["entries_per_s"] == round(line["entries"] / line["interval_s"], 1)
        assert {"lag", "pending", "active_turns"} <= set(line)
    assert lines[-1]["lag"] == 0

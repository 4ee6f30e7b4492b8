"""What the loss tests (tests/worker/test_worker_losses.py,
tests/worker/test_worker_state_lost.py) share: the entries they add (a text
update, a turn's updates, its end), what they read back (a turn's one merged
entry, a response's text), a metric of an in-process worker and the log
records of a message."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from processor.worker.worker import Worker


def text_update(text: str, message_id: str = "m1") -> dict[str, Any]:
    return {"contents": [{"type": "text", "text": text}], "role": "assistant",
            "message_id": message_id}


def updates(rid: str, texts: list[str]) -> list[dict[str, Any]]:
    return [{"response_id": rid, "update": text_update(t)} for t in texts]


def end(rid: str) -> dict[str, Any]:
    return {"response_id": rid, "kind": "end"}


def merged_of(outputs: Any, rid: str) -> dict[str, Any]:
    (turn,) = [t for k, t in outputs.turns.items() if k.response_id == rid]
    (merged,) = turn.merged
    return {**merged, "meta": json.loads(merged["meta"]),
            "response": json.loads(merged["response"])}


def text_of(response: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for m in response["messages"] for c in m["contents"])


def metric(worker: Worker, name: str, labels: dict[str, str] | None = None) -> float:
    return worker.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def records(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(message)]

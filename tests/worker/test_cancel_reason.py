"""A cancel's reason reaches its turn's terminal ``synthesis`` event and the
merged entry's ``meta`` as ``cancel_reason`` (docs/contract.md §5.1, §5.2,
§6): bounded (at most 1,024 characters, from at most the first 1 KiB of the
key's value, read with ``GETRANGE``), decoded safely whatever an
administrator's plain ``SET`` wrote, null on every other terminal event.
On both worker paths (held and stored) and in ``processor merge``."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.agui_checks import check_models
from support.turn_reference import end_entry, text_delta
from support.worker_harness import Harness

from processor.engine import agui, agui_live
from processor.engine.lifecycle import Limits
from processor.engine.offline import merge_lines
from processor.wire.cancels import REASON_BYTES, reason_of
from processor.wire.ids import TurnKey
from processor.wire.schema import document

STOP = "user pressed stop"


# ----------------------------------------------------------------- pure


@given(st.binary(max_size=3 * REASON_BYTES))
def test_any_bytes_make_a_bounded_reason(raw: bytes) -> None:
    reason = reason_of(raw)
    assert reason is None or 0 < len(reason) <= REASON_BYTES
    assert (reason is None) == (raw == b"")


@given(st.text(min_size=1, max_size=2 * REASON_BYTES))
def test_a_reason_is_its_text_or_a_whole_character_prefix_of_it(text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    reason = reason_of(raw[:REASON_BYTES])  # what GETRANGE 0 1023 gives
    whole = raw.decode("utf-8", "replace")  # (a lone surrogate is not UTF-8: U+FFFD)
    if len(raw) <= REASON_BYTES:
        assert reason == whole
    else:
        assert reason is not None and whole.startswith(reason)
        assert len(reason.encode("utf-8", "surrogatepass")) <= REASON_BYTES


def test_bad_utf8_an_empty_value_and_a_cut_character() -> None:
    assert reason_of(b"\xff\xfe stop") == "\ufffd\ufffd stop"
    assert reason_of(b"stop \xe2\x82") == "stop \ufffd"  # not cut: an incomplete end replaced
    assert reason_of(b"") is None and reason_of(None) is None
    cut = ("x" * (REASON_BYTES - 1) + "é").encode()[:REASON_BYTES]  # é cut in two
    assert reason_of(cut) == "x" * (REASON_BYTES - 1)


def test_the_schemas_carry_a_bounded_cancel_reason() -> None:
    defs = document()["$defs"]
    for name in ("Meta", "Synthesis"):
        field = defs[name]["properties"]["cancel_reason"]
        assert {"type": "string", "maxLength": REASON_BYTES} in field["anyOf"], field
        assert {"type": "null"} in field["anyOf"]


def test_processor_merge_carries_a_cancel_lines_reason() -> None:
    lines = [json.dumps(line) for line in (
        text_delta("a", "kept"), {"kind": "cancel", "response_id": "a", "reason": STOP},
        {"kind": "cancel", "response_id": "a", "reason": "second"},  # the first one stays
        {"kind": "cancel", "response_id": "b", "reason": "y" * 5000},  # before its start
        text_delta("b", "never"), text_delta("c", "done"), end_entry("c"),
        {"kind": "cancel", "response_id": "d"}, text_delta("d", "x"))]
    results = {r.response_id: r for r in merge_lines(lines).results()}
    reasons = {rid: (r.meta.cancel_reason, r.events[-1].cancel_reason)
               for rid, r in results.items()}
    assert reasons == {"a": (STOP, STOP), "b": ("y" * REASON_BYTES, "y" * REASON_BYTES),
                       "c": (None, None), "d": (None, None)}
    assert results["a"].status == "cancelled" and results["c"].status == "completed"


# ----------------------------------------------------------------- workers


def _meta(outputs: Any, rid: str) -> dict[str, Any]:
    [merged] = outputs.turns[TurnKey(rid)].merged
    return dict(json.loads(merged["meta"]))


@pytest.mark.parametrize("hold", [True, False], ids=["held", "stored"])
async def test_the_reason_reaches_the_terminal_event_and_meta(
    redis_url: str, namespace: str, hold: bool
) -> None:
    big = b"\xff\xfe" + b"z" * (4 << 20)  # an administrator's plain SET: 4 MB, not UTF-8
    async with Harness(redis_url, namespace, hold_turns=hold,
                       limits=Limits(turn_timeout=300)) as harness:
        await harness.start_workers(1)
        await harness.cancel("early", reason="before it began")  # found by apply_entries
        await harness.add([text_delta(rid, "kept") for rid in
                           ("early", "stop", "big", "empty", "hash", "done")] + [end_entry("done")])
        await harness.wait_merged(2)  # early and done
        await harness.wait_applied()
        await harness.cancel("stop", reason=STOP)  # found by a sweep
        shard = harness.ns.shard_for("big")
        await harness.client.set(shard.cancel("big"), big, ex=600)
        await harness.client.set(harness.ns.shard_for("empty").cancel("empty"), b"", ex=600)
        await harness.client.hset(harness.ns.shard_for("hash").cancel("hash"), "a", "b")
        await harness.wait_merged(6)
        outputs = await harness.outputs()
    expected = {"early": "before it began", "stop": STOP,
                "big": "\ufffd\ufffd" + "z" * (REASON_BYTES - 2), "empty": None, "hash": None,
                "done": None}
    for rid, reason in expected.items():
        final = outputs.turns[TurnKey(rid)].events[-1]
        assert final["type"] == "synthesis" and "cancel_reason" in final

        assert (final["cancel_reason"], _meta(outputs, rid)["cancel_reason"]) == (reason, reason)
        assert final["status"] == ("completed" if rid == "done" else "cancelled")


def test_agui_run_finished_carries_the_reason_in_its_metadata() -> None:
    """AG-UI 1.0's cancelled outcome has no field for a reason; every event
    may carry ``metadata``: the stored run (``--agui``) and the live
    projection of the terminal event both put it there, as AG-UI's own
    models read it (no field AG-UI does not define)."""
    lines = [json.dumps(text_delta("a", "kept")),
             json.dumps({"kind": "cancel", "response_id": "a", "reason": STOP}),
             json.dumps(text_delta("c", "done")), json.dumps(end_entry("c"))]
    results = {r.response_id: r for r in merge_lines(lines).results()}
    for rid, reason in (("a", STOP), ("c", None)):
        result = results[rid]
        stored = agui.project(result.response, result.meta, result.status)[-1]
        final = msgspec.json.decode(msgspec.json.encode(result.events[-1]))
        live = agui_live.LiveRun().event(final)[-1]
        for event in (stored, live):
            check_models([event])
            assert event["type"] == "RUN_FINISHED"
            assert event.get("metadata") == ({"cancelReason": reason} if reason else None)

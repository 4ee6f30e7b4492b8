"""Every way a turn meets a cancel, on a real Redis with several workers
(docs/contract.md §5.2 and §6): before its first entry, mid-turn, after its end,
twice, and while its producer is silent. Each turn ends with exactly one
terminal event of the right status and exactly one merged entry, nothing is
published after the terminal event, and entries that arrive after the cancel
are acked and counted as dropped (never merged, never dead-lettered).

And a Python ``asyncio.CancelledError`` inside a worker, whether its task
is cancelled mid-batch or a library raises one: the turn still ends exactly
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from support.expectations import check_invariants
from support.turn_reference import TurnOutput
from support.worker_harness import Harness

from processor.engine.lifecycle import Limits
from processor.wire.ids import TurnKey


def _update(text: str, message_id: str = "m1") -> dict:
    return {"type": "agent_response_update", "role": "assistant", "message_id": message_id,
            "contents": [{"type": "text", "text": text}]}


def _u(rid: str, text: str) -> dict[str, Any]:
    return {"response_id": rid, "update": _update(text)}


def _end(rid: str) -> dict[str, Any]:
    return {"response_id": rid, "kind": "end"}


def _turn(outputs: Any, rid: str) -> TurnOutput:
    [turn] = [t for k, t in outputs.turns.items() if k.response_id == rid]
    return turn


def _texts(turn: TurnOutput) -> list[str]:
    response = json.loads(turn.response)
    return [c["text"] for m in response["messages"] for c in m["contents"]]


async def _done(harness: Harness, rid: str) -> dict[str, str]:
    shard = harness.ns.shard_for(rid)
    raw = await harness.client.hgetall(shard.done(TurnKey(rid).encode()))
    return {k.decode(): v.decode() for k, v in raw.items()}


def _check_ends_once(turn: TurnOutput, status: str) -> None:
    """One merged entry, one terminal event of ``status``, last, gap-free seq."""
    assert len(turn.merged) == 1, turn.merged
    assert turn.merged[0]["status"] == status
    types = [e["type"] for e in turn.events]
    assert types.count("synthesis") == 1 and types[-1] == "synthesis", types
    assert turn.events[-1]["status"] == status
    assert [e["seq"] for e in turn.events] == list(range(len(types)))
    check_invariants(turn.result(), str(turn.key))


async def test_cancel_paths_on_three_workers(redis_url: str, namespace: str) -> None:
    # A long turn timeout: only the cancel can end the silent turns.
    async with Harness(redis_url, namespace, shards=2, progress=True,
                       limits=Limits(turn_timeout=300)) as harness:
        await harness.start_workers(3)
        await harness.cancel("before")  # before its first entry: the cancel still wins
        await harness.add([_u("before", "never"), _end("before"),
                           _u("mid", "kept"), _u("silent", "only this"),
                           _u("twice", "t"), _u("after", "a"), _end("after")])
        await harness.wait_merged(2)  # before and after
        await harness.wait_applied()
        for rid in ("mid", "silent", "twice", "twice", "after"):
            await harness.cancel(rid, reason=f"stop {rid}")
        await harness.wait_merged(5)
        # The producers of mid and twice go on a little: acked, counted, dropped.
        late = [_u("mid", "late 1"), _u("mid", "late 2"), _end("mid"),
                _u("twice", "late"), _u("before", "later still")]
        await harness.add(late)
        await harness.cancel("twice", reason="again")  # a third time, after the end
        await harness.wait_drained()
        await asyncio.sleep(0.5)  # a few sweeps: nothing more may be published
        outputs = await harness.outputs()
        done = {rid: await _done(harness, rid)
                for rid in ("before", "mid", "silent", "twice", "after")}
        assert not await harness.client.exists(*[s.agui for s in harness.shards])
    assert outputs.merged_count == 5 and outputs.dlq == []
    for rid in ("before", "mid", "silent", "twice"):
        _check_ends_once(_turn(outputs, rid), "cancelled")
    _check_ends_once(_turn(outputs, "after"), "completed")
    assert _texts(_turn(outputs, "before")) == []
    assert _texts(_turn(outputs, "mid")) == ["kept"]
    assert _texts(_turn(outputs, "silent")) == ["only this"]
    assert _texts(_turn(outputs, "after")) == ["a"]
    # Dropped before the terminal event: in its counts; after it: on the done
    # marker. (Whether "before"'s end came before or after its terminal event
    # depends on batching; mid's and twice's late entries came after.)
    dropped = {rid: _turn(outputs, rid).events[-1]["counts"]["dropped"] + int(d["dropped"])
               for rid, d in done.items()}
    assert dropped == {"before": 3, "mid": 3, "silent": 0, "twice": 1, "after": 0}
    assert int(done["mid"]["dropped"]) == 3 and int(done["twice"]["dropped"]) == 1
    assert {rid: d["status"] for rid, d in done.items()} == {
        "before": "cancelled", "mid": "cancelled", "silent": "cancelled",
        "twice": "cancelled", "after": "completed"}


@pytest.mark.parametrize("hold", [True, False], ids=["held", "stored"])
async def test_worker_task_cancelled_mid_batch(redis_url: str, namespace: str,
                                               hold: bool) -> None:
    """The worker that read a turn's end has its task cancelled before it
    publishes it (held: in finalise_held; stored: before finalise_turns);
    other workers finish the turn, once."""
    async with Harness(redis_url, namespace, reclaim_idle_ms=300, hold_turns=hold) as harness:
        first = await harness.start_worker()
        stuck = asyncio.Event()

        async def finalise_forever(*_args: object, **_kwargs: object) -> None:
            stuck.set()
            await asyncio.Event().wait()

        if hold:
            first.worker.scripts.finalise_held = finalise_forever
        else:
            first.worker.finaliser.finalise = finalise_forever  # type: ignore[method-assign]
        await harness.add([_u("cut", "one"), _u("cut", " two"), _end("cut")])
        await asyncio.wait_for(stuck.wait(), 10)
        first.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first.task
        harness.workers.remove(first)
        await first.client.aclose()
        await harness.start_workers(2)
        await harness.wait_merged(1)
        await harness.wait_drained()
        await asyncio.sleep(0.3)
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    _check_ends_once(_turn(outputs, "cut"), "completed")
    assert _texts(_turn(outputs, "cut")) == ["one two"]


@pytest.mark.parametrize("hold", [True, False], ids=["held", "stored"])
async def test_stray_cancelled_error_inside_the_worker(redis_url: str, namespace: str,
                                                       hold: bool) -> None:
    """A CancelledError raised inside a step (a library's, not a cancel of the
    worker's task) must not kill the shard loop: the same worker goes on, and
    the turn whose publishing it interrupted ends once (held: raised once
    finalise_held published it; stored: once apply_entries stored it)."""
    async with Harness(redis_url, namespace, reclaim_idle_ms=300, hold_turns=hold) as harness:
        running = await harness.start_worker()
        scripts = running.worker.scripts
        name = "finalise_held" if hold else "apply_entries"
        real = getattr(scripts, name)
        raised = asyncio.Event()

        async def apply_then_raise(**kwargs: Any) -> Any:
            reply = await real(**kwargs)
            if not raised.is_set():
                raised.set()
                raise asyncio.CancelledError("stray")
            return reply

        setattr(scripts, name, apply_then_raise)
        await harness.add([_u("stray", "x"), _end("stray")])
        await asyncio.wait_for(raised.wait(), 10)
        await harness.wait_merged(1)  # assert_workers_alive: the worker did not die
        await harness.add([_u("next", "y"), _end("next")])
        await harness.wait_merged(2)
        await harness.wait_drained()
        outputs = await harness.outputs()
    _check_ends_once(_turn(outputs, "stray"), "completed")
    _check_ends_once(_turn(outputs, "next"), "completed")

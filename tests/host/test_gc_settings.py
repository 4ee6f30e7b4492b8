"""The worker's cyclic-GC settings (``host.run.tune_gc``): a batch's transient
objects must not trigger generation-0 passes, and the older generations keep
Python's defaults."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from support.turn_reference import entry_fields, text_delta

from processor.host.run import GC_GEN0_THRESHOLD, tune_gc
from processor.scripts.stored_calls import build_apply
from processor.wire.keys import Namespace
from processor.worker.config import WorkerConfig


@pytest.fixture
def worker_gc() -> Iterator[None]:
    """The worker's settings for the test, Python's own restored after it."""
    saved = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


def text_deltas(count: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """``count`` entries as XREADGROUP returns them: eight turns' text deltas, interleaved."""
    return [(f"1700000000000-{i}".encode(),
             {name.encode(): value.encode()
              for name, value in entry_fields(text_delta(f"resp-{i % 8}", f"word {i} ")).items()})
            for i in range(count)]


def test_tune_gc_raises_only_the_young_threshold(worker_gc: None) -> None:
    assert gc.get_threshold() == (GC_GEN0_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0  # start-up objects are out of the collector's way


def passes_while_decoding(count: int) -> int:
    """Generation-0 passes while ``build_apply`` decodes ``count`` entries
    (a held batch decodes less: its plain updates wait undecoded)."""
    entries = text_deltas(count)
    shard = next(iter(Namespace("gc", 1).all()))
    options = WorkerConfig(group="g", consumer="c")
    gc.collect()  # the young generation's count starts at 0
    before = gc.get_stats()[0]["collections"]
    call = build_apply(shard, entries, {}, options, 0)
    assert len(call.applied) == count
    return int(gc.get_stats()[0]["collections"] - before)


def test_a_full_batch_decodes_without_a_collection(worker_gc: None) -> None:
    assert passes_while_decoding(500) == 0  # the default --batch


def test_the_same_batch_would_collect_at_pythons_default(worker_gc: None) -> None:
    """So the test above can fail: at 700 the same batch runs passes."""
    gc.set_threshold(700, 10, 10)
    assert passes_while_decoding(500) > 0

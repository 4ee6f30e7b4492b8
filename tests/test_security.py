"""What a hostile producer or a leaked log could show.

- The DLQ copy of a bad entry is bounded in all (not only per value): a
  2 MiB field name or 18 MB of 60 KB fields come out as at most ~64 KiB, the
  small fields that identify the entry kept.
- Logs (even at debug) and DLQ details never echo more than a bounded prefix
  of a bad payload.
- No secret (the Redis password in the URL) in logs, metrics or error
  messages, through connection errors, a Redis restart and refused
  credentials.
"""

from __future__ import annotations

from worker_harness import Harness

from processor.batches import BatchOptions

BUDGET = BatchOptions.dlq_value_max
#: What a DLQ entry adds besides the copy: reason, detail, source_id, deliveries, truncated.
ADDED = 1024


def _size(fields: dict) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in fields.items()
               if not k.startswith("_"))


async def test_the_dlq_copy_of_a_bad_entry_is_bounded(redis_url: str, namespace: str) -> None:
    huge_name = {"response_id": "a", "N" * (2 << 20): "v", "update": "{}"}
    wide = {"update": "{}", **{f"f{i}": "x" * 60_000 for i in range(300)},
            "response_id": "b", "step_id": "s-1"}
    small = {"response_id": "c", "update": "[1, 2]"}
    async with Harness(redis_url, namespace) as harness:
        await harness.start_workers(1)
        shard = harness.shards[0]
        ids = [await harness.add_raw(shard, fields) for fields in (huge_name, wide, small)]
        await harness.wait_applied()
        outputs = await harness.outputs()
    dead = {d["source_id"]: d for d in outputs.dlq}
    for entry_id in ids[:2]:
        got = dead[entry_id]
        assert got["reason"] == "too_large" and got["truncated"] == "1"
        assert _size(got) <= BUDGET + ADDED, _size(got)
    # The small fields that say whose entry it was come first, whatever their place.
    assert dead[ids[0]]["response_id"] == "a" and dead[ids[0]]["update"] == "{}"
    assert dead[ids[1]]["response_id"] == "b" and dead[ids[1]]["step_id"] == "s-1"
    assert "N" * 256 in dead[ids[0]]  # a long name is cut too
    # An entry that fits is copied as it is.
    got = dead[ids[2]]
    assert got["reason"] == "invalid_update" and "truncated" not in got
    assert {k: got[k] for k in small} == small

"""A batch read for holding, grouped per turn (processor/worker/held/batch.py).

``group_batch`` takes a turn's plain updates in runs, checked per run; it
must give exactly what ``group_each`` gives, classifying every entry on its
own, whatever the batch holds (interleaved turns, odd and bad entries,
other shards) and whether or not the turns' response ids are known yet.
And ``group_each`` must give what the worker decoded entry by entry before
runs: each plain update (``peek_plain``) in its turn's runs, each other
entry decoded, each one that fails to decode or is another shard's left to
``apply_entries``, every entry once, each turn's in arrival order."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.strategies import turns
from support.turn_reference import as_read, delta, stream_fields

from processor.ingest import decode
from processor.ingest.decode import EntryError, decode_stream_entry, peek_plain
from processor.ingest.entry_fields import entry_shard
from processor.redis_io.replies import entry_of
from processor.wire.ids import TurnKey
from processor.worker.held.batch import HeldBatch, Run, group_batch, group_each

LIMIT = 1 << 20

#: Entries that are not plain updates, or only look like one.
ODD: list[dict[bytes, Any]] = [
    {b"update": delta("no id").encode()},  # no response id: failed
    {b"response_id": b"t0", b"update": b"{not json"},  # plain, but apply_entries dead-letters it
    {b"response_id": b"t0", b"update": delta("\u00e9").encode().replace(b"\\u00e9",
                                                                      "\u00e9".encode())},
    {b"response_id": b"t1", b"update": delta("k").encode(), b"kind": b"update"},  # three fields
    {b"response_id": b"t1", b"kind": b"end"},
    {b"response_id": b"t2", b"update": delta("x" * 300).encode()},  # over a small entry limit
    {b"response_id": b"t2", b"update": delta("s")},  # a str value: not as Redis gives
    {b"response_id": b"t\xff", b"update": delta("u").encode()},  # a response id not UTF-8
    {b"turn_id": b"tt", b"update": delta("turn id only").encode()},
    {b"response_id": b"t3", b"update": json.dumps(
        {"Contents": [{"$type": "text", "Text": "x"}]}).encode()},  # .NET: a single
    # Numbered (docs/contract.md §3.4): singles; a bad number fails to decode.
    {b"response_id": b"t1", b"n": b"3", b"kind": b"update", b"update": delta("n").encode()},
    {b"response_id": b"t1", b"n": b"03", b"update": delta("bad n").encode()},
]


@st.composite
def batches(draw: Any) -> tuple[list[tuple[bytes, dict[bytes, Any]]], int, int, int]:
    """Several random turns' entries interleaved, odd entries among them,
    as one XREADGROUP reply; the shard, the shard count and an entry limit."""
    queues = [[stream_fields(e) for e in draw(turns(f"t{i}"))]
              for i in range(draw(st.integers(1, 4)))]
    fields: list[dict[bytes, Any]] = []
    while any(queues):
        queue = draw(st.sampled_from([q for q in queues if q]))
        fields.append(queue.pop(0))
        if draw(st.integers(0, 9)) == 0:
            fields.append(draw(st.sampled_from(ODD)))
    shards = draw(st.integers(1, 3))
    shard = draw(st.integers(0, shards - 1))
    limit = draw(st.sampled_from([LIMIT, 400]))
    return as_read([(f"{i}-0".encode(), f) for i, f in enumerate(fields, 1)]), shard, shards, limit


def canonical(batch: HeldBatch) -> tuple[Any, ...]:
    """A batch as plain data, runs by their entries, texts, ids and size."""
    turns = tuple(
        (key, tuple(("run", tuple(p.entries), tuple(p.texts), tuple(p.ids), p.size)
                    if isinstance(p, Run) else ("single", p[0], p[1]) for p in parts))
        for key, parts in batch.turns.items())
    return turns, tuple(batch.failed)


def one_by_one(entries: list[Any], shard: int, shards: int, limit: int) -> dict[bytes, Any]:
    """What each entry is when decoded on its own, as the worker did before runs."""
    found: dict[bytes, Any] = {}
    for entry_id, fields in map(entry_of, entries):
        try:  # (decoded first, as apply_entries does: its routing id is then text)
            key, record, size = decode_stream_entry(fields, max_entry_bytes=limit)
        except EntryError:
            plain = peek_plain(fields, limit)  # waits undecoded: the held turn breaks later
            found[entry_id] = "failed" if plain is None else ("plain", *plain)
        else:
            plain = peek_plain(fields, limit)
            found[entry_id] = ("single", key, record, size) if plain is None else ("plain", *plain)
        if shards > 1 and found[entry_id] != "failed" and entry_shard(fields, shards) != shard:
            found[entry_id] = "failed"
    return found


def test_a_turn_whose_first_run_fails_keeps_the_order_of_its_first_entry_left() -> None:
    """Hypothesis found it: a turn whose first plain entry is over the entry
    limit (its run fails its check: the entry goes to apply_entries) starts
    where its next entry is, after a turn that came between, as entry by
    entry; the turns' order was the failed entry's."""
    over = {b"response_id": b"t2", b"update": delta("x" * 300).encode()}
    fields = [over, {b"response_id": b"t1", b"update": delta("a").encode()},
              {b"response_id": b"t2", b"update": delta("b").encode()}]
    entries = as_read([(f"{i}-0".encode(), f) for i, f in enumerate(fields, 1)])
    decode._recent_keys.clear()
    group_each(entries, 0, 1, 400)  # (every response id seen lately: the one-step path)
    batch = group_batch(entries, 0, 1, 400)
    assert [key.response_id for key in batch.turns] == ["t1", "t2"]
    assert canonical(batch) == canonical(group_each(entries, 0, 1, 400))


@settings(max_examples=80, deadline=None)
@given(case=batches(), known=st.booleans())
def test_runs_are_what_each_entry_on_its_own_gives(
    case: tuple[list[Any], int, int, int], known: bool
) -> None:
    entries, shard, shards, limit = case
    decode._recent_keys.clear()
    if known:  # every response id seen lately: the runs' one-step path
        group_each(entries, shard, shards, limit)
    assert canonical(group_batch(entries, shard, shards, limit)) == \
        canonical(group_each(entries, shard, shards, limit))

    batch = group_each(entries, shard, shards, limit)
    each = one_by_one(entries, shard, shards, limit)
    position = {entry_id: i for i, (entry_id, _f) in enumerate(entries)}
    seen: list[bytes] = [e[0] for e in batch.failed]
    assert all(each[i] == "failed" for i in seen)
    assert seen == sorted(seen, key=position.__getitem__)  # batch order
    for key, parts in batch.turns.items():
        mine: list[bytes] = []
        for i, part in enumerate(parts):
            if isinstance(part, Run):
                assert part.entries
                assert [each[e[0]] for e in part.entries] == [
                    ("plain", key, text, part.base + len(text)) for text in part.texts]
                assert part.ids == [e[0].decode() for e in part.entries]
                assert part.size == sum(part.sizes())
                assert i == 0 or not isinstance(parts[i - 1], Run)  # runs are maximal
                mine += [e[0] for e in part.entries]
            else:
                raw, applied = part
                assert each[raw[0]] == ("single", key, applied.record, applied.size)
                mine.append(raw[0])
        assert mine == sorted(mine, key=position.__getitem__)  # arrival order
        seen += mine
    assert sorted(seen) == sorted(position)  # every entry, once


def test_a_run_of_a_known_turn_is_taken_in_one_step() -> None:
    """The usual batch: plain updates of turns seen before, and their ends."""
    entries = as_read([
        *((f"{i}-0".encode(), {b"response_id": f"r{i % 2}".encode(),
                               b"update": delta(str(i)).encode()}) for i in range(1, 7)),
        (b"7-0", {b"response_id": b"r0", b"kind": b"end"}),
        (b"8-0", {b"update": delta("late").encode(), b"response_id": b"r0"}),  # either order
    ])
    group_each(entries, 0, 1, LIMIT)  # the response ids are known now
    batch = group_batch(entries, 0, 1, LIMIT)
    r0, r1 = batch.turns[TurnKey("r0")], batch.turns[TurnKey("r1")]
    assert [p.ids for p in r1 if isinstance(p, Run)] == [["1-0", "3-0", "5-0"]]
    assert isinstance(r0[0], Run) and r0[0].ids == ["2-0", "4-0", "6-0"]
    assert r0[1][1].record.kind == "end"
    assert isinstance(r0[2], Run) and r0[2].ids == ["8-0"]  # after the end: a new run
    assert batch.failed == []


def test_a_run_that_fails_its_check_is_taken_entry_by_entry() -> None:
    """A non-ASCII update among a known turn's plain ones is decoded on its
    own; an undecodable one is left to apply_entries, in batch order."""
    utf8 = delta("\u00e9").encode().replace(b"\\u00e9", "\u00e9".encode())
    entries = as_read([(b"1-0", {b"response_id": b"r", b"update": delta("a").encode()}),
                       (b"2-0", {b"response_id": b"r", b"update": utf8}),
                       (b"3-0", {b"response_id": b"r", b"update": "{bad \u00e9".encode()}),
                       (b"4-0", {b"response_id": b"r", b"update": delta("b").encode()})])
    group_each(entries[:1], 0, 1, LIMIT)
    batch = group_batch(entries, 0, 1, LIMIT)
    first, single, last = batch.turns[TurnKey("r")]
    assert isinstance(first, Run) and first.ids == ["1-0"]
    assert not isinstance(single, Run) and single[1].entry_id == "2-0"
    assert isinstance(last, Run) and last.ids == ["4-0"]
    assert batch.failed == [entry_of(entries[2])]


def test_another_shards_turn_is_left_to_apply_entries() -> None:
    from processor.wire.ids import shard_of

    ours = next(f"r{i}" for i in range(100) if shard_of(f"r{i}", 2) == 1)
    theirs = next(f"r{i}" for i in range(100) if shard_of(f"r{i}", 2) == 0)
    entries = as_read([(f"{i}-0".encode(), {b"response_id": rid.encode(),
                                            b"update": delta(str(i)).encode()})
                       for i, rid in enumerate([ours, theirs, ours, theirs], 1)])
    group_each(entries, 1, 2, LIMIT)
    batch = group_batch(entries, 1, 2, LIMIT)
    assert list(batch.turns) == [TurnKey(ours)]
    assert batch.failed == [entry_of(entries[1]), entry_of(entries[3])]

"""Instruction counts for the merge benchmark (callgrind is stable under load).

Wall times on a shared machine swing with its load; instruction counts do
not. This runs one side of ``bench/merge_bench.py`` on the first entries of
its workload, for ``valgrind --tool=callgrind``; a run of side ``none``
(same imports and loading, no work) is subtracted. Usage::

    python bench/merge_count.py dump /tmp/entries.json        # 20,000 entries
    for side in none decode apply ours af; do
        valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$side \\
            python bench/merge_count.py $side /tmp/entries.json
    done
    # instructions per update of a side: (totals of cg.$side - cg.none) / 20,000

Sides: ``decode`` (``decode_entry`` only), ``apply`` (``decode_entry`` and
``Turn.apply``), ``ours`` (the whole of merge_bench's processor side: also
``finish`` and ``encode_response`` per turn), ``af`` (Agent Framework's side);
``stream`` is the worker's ``decode_stream_entry`` on the same entries as
Redis returns them (bytes), less side ``stream-none`` (the bytes built only).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import merge_bench
from turns import build_entries

from processor.engine.merge import Turn
from processor.ingest.decode import decode_entry, decode_stream_entry
from processor.wire.ids import TurnKey


def main(side: str, path: str, count: int = 20_000) -> None:
    if side == "dump":
        entries = build_entries(merge_bench.DEFAULT_UPDATES)[:count]
        Path(path).write_text(json.dumps(entries))
        return
    entries = [(rid, text) for rid, text in json.loads(Path(path).read_text())]
    if side == "decode":
        for rid, text in entries:
            decode_entry({"response_id": rid, "update": text})
    elif side == "stream":
        raw = [{b"response_id": rid.encode(), b"update": text.encode()} for rid, text in entries]
        for fields in raw:
            decode_stream_entry(fields)
    elif side == "stream-none":  # the same bytes built, nothing decoded
        raw = [{b"response_id": rid.encode(), b"update": text.encode()} for rid, text in entries]
    elif side == "apply":
        turns: dict[TurnKey, Turn] = {}
        for rid, text in entries:
            key, record = decode_entry({"response_id": rid, "update": text})
            turn = turns.get(key)
            if turn is None:
                turn = turns[key] = Turn(key)
            turn.apply(record)
    elif side == "ours":
        merge_bench.run_ours(entries)
    elif side == "af":
        merge_bench.run_agent_framework(entries)
    elif side != "none":
        raise SystemExit(f"unknown side {side!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

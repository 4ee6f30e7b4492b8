"""The shapes of Redis replies, as text and as stream entries. No Redis client
here: pure code (the merge engine, ingest) parses replies with these."""

from __future__ import annotations

from typing import Any


def as_text(value: Any) -> str:
    """A Redis reply value as ``str`` (clients may or may not decode responses)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


#: An entry as XREADGROUP's reply holds it (``connections.read_raw``):
#: ``[id, [name, value, ...]]``. A shard runner reads its batches so.
RawEntry = list[Any]

#: An entry in the usual shape, as redis-py's stream replies give it:
#: ``(id, {name: value})``. The stored path, reclaims and the DLQ take these.
Entry = tuple[Any, dict[Any, Any]]


def fields_of(raw: RawEntry) -> dict[Any, Any]:
    """A raw entry's fields as a dict (``fields_dict``)."""
    flat = raw[1]
    if flat is not None and len(flat) == 4:  # the usual entry: no iterator to build
        return {flat[0]: flat[1], flat[2]: flat[3]}
    return fields_dict(flat)


def entry_of(raw: RawEntry) -> Entry:
    """A raw entry (``RawEntry``) in the usual shape (``Entry``)."""
    return raw[0], fields_of(raw)


def entries_of(read: list[RawEntry]) -> list[Entry]:
    """Raw entries in the usual shape."""
    return list(map(entry_of, read))


def fields_dict(flat: list[Any] | None) -> dict[Any, Any]:
    """An entry's flat field list as a dict (later duplicates win, as in
    redis-py); none (an entry deleted while pending, read with id 0) is {}."""
    if flat is None:
        return {}
    pairs = iter(flat)
    return dict(zip(pairs, pairs, strict=False))

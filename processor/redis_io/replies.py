"""The shapes of Redis replies, as text and as stream entries. No Redis client
here: pure code (the merge engine, ingest) parses replies with these."""

from __future__ import annotations

from typing import Any


def as_text(value: Any) -> str:
    """A Redis reply value as ``str`` (clients may or may not decode responses)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def stream_entry(entry: Any) -> tuple[Any, dict[Any, Any]]:
    """An entry in the usual shape, ``(id, {name: value})``, whether as
    ``read_raw`` or as
    ``parse_stream_read`` gives it."""
    fields = entry[1]
    if fields.__class__ is dict:
        return entry[0], fields
    return entry[0], fields_dict(fields)


def fields_dict(flat: list[Any] | None) -> dict[Any, Any]:
    """An entry's flat field list as a dict (later duplicates win, as in
    redis-py); none (an entry deleted while pending, read with id 0) is {}."""
    if flat is None:
        return {}
    pairs = iter(flat)
    return dict(zip(pairs, pairs, strict=False))

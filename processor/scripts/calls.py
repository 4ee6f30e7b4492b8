"""What every script call of the worker shares: its KEYS/ARGV (``ScriptCall``),
the settings the builders read (``BatchOptions``) and the packing of values
into the msgpack the scripts decode. Each family of scripts has its module
beside it (``stored_calls``, ``held_calls``, ``live_calls``, ``lost_calls``,
``sweep_calls``): domain objects in, KEYS/ARGV out, and a named reply back.
Pure: nothing here talks to Redis but the one call function of each script."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol, get_args

import msgspec

from processor.engine.lifecycle import Limits
from processor.wire.ids import TurnKey
from processor.wire.models import TURN_IDS
from processor.wire.outputs import Event

_pack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


class BatchOptions(Protocol):
    """What the script-call builders read of a worker's settings: a view of
    its ``WorkerConfig`` (processor.worker.config), where each has its one
    default."""

    @property
    def group(self) -> str: ...
    @property
    def shards(self) -> int: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def max_deliveries(self) -> int: ...
    @property
    def events_maxlen(self) -> int: ...
    @property
    def dlq_maxlen(self) -> int: ...
    @property
    def merged_maxlen(self) -> int: ...
    @property
    def dlq_fields_max(self) -> int: ...
    @property
    def ready_limit(self) -> int: ...
    @property
    def done_ttl(self) -> int: ...
    @property
    def agui(self) -> bool: ...
    @property
    def compact_threshold(self) -> int: ...
    @property
    def live_ttl(self) -> int: ...


@dataclass
class ScriptCall:
    keys: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)


#: The msgpack str headers of lengths below 256 (fixstr, then str 8), made once.
_STR_HEADS = [bytes((0xA0 | n,)) if n < 32 else b"\xd9" + bytes((n,)) for n in range(256)]


def msgpack_str(value: bytes) -> msgspec.Raw:
    """Bytes as a msgpack *str*: Redis's Lua cmsgpack cannot decode the bin
    types msgspec writes for bytes, and a str is kept byte for byte."""
    n = len(value)
    if n < 0x100:
        head = _STR_HEADS[n]  # most records: no header to build
    elif n < 0x10000:
        head = b"\xda" + n.to_bytes(2, "big")
    else:
        head = b"\xdb" + n.to_bytes(4, "big")
    return msgspec.Raw(head + value)


def id_list(ids: dict[str, str]) -> list[str]:
    """Turn-level correlation ids as the scripts remember them: [name, JSON value, ...]."""
    flat: list[str] = []
    for name in TURN_IDS:
        value = ids.get(name)
        if value is not None and name != "attempt_id":
            flat += [name, _json.encode(value).decode()]
    return flat


#: Each event class's ``type`` tag (``event_type``, looked up: every class of ``Event``).
_TAGS: dict[type, str] = {cls: str(cls.__struct_config__.tag) for cls in get_args(Event)}


@lru_cache(maxsize=1 << 14)
def call_ids(key: TurnKey) -> tuple[str, str, str, str]:
    """A turn's key (``TurnKey.encode``), response, synthesis and attempt ids
    as ``publish_live`` and ``finalise_held`` take them: the same in every
    call for the turn, so made once while it runs (the cache holds more
    turns than a worker publishes at once)."""
    return key.encode(), key.response_id, key.synthesis_id(), key.attempt_id or ""


#: Where an event's JSON says its seq before a script numbers it.
_SEQ = b'"seq":0,'


def cut_events(found: list[Event]) -> list[str]:
    """A turn's events as the scripts number them (``includes/xadd_events``):
    three values per event, its ``type`` tag, its JSON up to and including
    ``"seq":``, and its JSON after the seq's 0. The script joins the parts
    with the seq it takes: Redis's Lua hashes every string it makes, byte by
    byte, so the JSON is made there once, never found, cut and joined again.
    The first ``"seq":0,`` is the field (inside a JSON string its quotes
    would be escaped); both parts are text, packed as msgpack str."""
    parts: list[str] = []
    encode = _json.encode  # (ev.encode_event's encoding, without its call)
    for event in found:
        json = encode(event)
        cut = json.index(_SEQ) + 6  # (after '"seq":', before its 0)
        parts += [_TAGS[event.__class__], json[:cut].decode(), json[cut + 1:].decode()]
    return parts

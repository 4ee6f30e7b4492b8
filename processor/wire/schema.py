"""JSON Schemas of the wire contract, generated from the msgspec Structs."""

from __future__ import annotations

from typing import Any

import msgspec

from processor.wire.models import InputEntry, Update
from processor.wire.outputs import (
    DlqEntry,
    Event,
    EventEntry,
    MergedEntry,
    Meta,
    Response,
    TurnResult,
)

#: Name -> type of every published schema, in the order ``processor schema`` prints.
SCHEMAS: dict[str, Any] = {
    "entry": InputEntry,
    "update": Update,
    "merged_entry": MergedEntry,
    "response": Response,
    "meta": Meta,
    "events_entry": EventEntry,
    "event": Event,
    "dlq_entry": DlqEntry,
    # {ns:s}:agui entries (--agui): the same flat fields, `event` is an AG-UI 1.0 event.
    "agui_entry": EventEntry,
    "merge_line": TurnResult,
}


def document() -> dict[str, Any]:
    """One JSON Schema (2020-12) document: each name is a ``$ref`` into ``$defs``."""
    refs, defs = msgspec.json.schema_components(
        list(SCHEMAS.values()), ref_template="#/$defs/{name}"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "processor wire contract v1",
        "$defs": defs,
        "properties": dict(zip(SCHEMAS, refs, strict=True)),
    }


def schema_for(name: str) -> dict[str, Any]:
    """A standalone schema for one name (with the shared ``$defs``)."""
    doc = document()
    return {"$schema": doc["$schema"], **doc["properties"][name], "$defs": doc["$defs"]}

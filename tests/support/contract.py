"""The contract test, by construction: every output entry the integration
helpers read (tests/support/worker_harness.py reads every ``merged``, ``events`` and
``dlq`` entry of every live test) is checked here against the JSON Schema that
``processor schema`` prints, so every integration test checks it.

``processor schema`` prints ``processor.wire.schema.document`` (test_decode
runs the CLI and checks that); it is built in-process here to stay fast, and
compiled to Python by fastjsonschema: the schema uses only keywords of
draft 7 (type, anyOf, properties, required, enum, items,
additionalProperties, ``$ref`` into ``$defs``), and checking every entry
of a 2,000-turn test with ``jsonschema`` took most of that test's time.
test_decode checks the schema itself with ``jsonschema``'s 2020-12 validator.
Besides the schema, each event must carry every field its schema names
(docs/contract.md §5.2: null when unknown, never missing; a ``step`` without
``agent_name`` or ``content`` is exactly what this catches).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

import fastjsonschema

from processor.wire.schema import document

#: A compiled fastjsonschema validator: returns the value, or raises JsonSchemaException.
Check = Callable[[Any], Any]


@cache
def _doc() -> dict[str, Any]:
    return document()


def _compiled(schema: dict[str, Any]) -> Check:
    # (use_default=False: a compiled validator otherwise fills the schema's
    # defaults into the value it checks, changing what the test reads.)
    return fastjsonschema.compile({"$defs": _doc()["$defs"], **schema}, use_default=False)


@cache
def validator(name: str) -> Check:
    return _compiled(_doc()["properties"][name])


@cache
def _event_validator(kind: str) -> Check:
    """The schema of one event type: what the ``event`` schema's anyOf checks
    for an event of that ``type`` (the branches differ by their ``type``
    constant, so only that branch can match), without trying the others."""
    ref = _doc()["properties"]["event"]["discriminator"]["mapping"].get(kind)
    if ref is None:
        return validator("event")  # an unknown type: the anyOf fails on it
    return _compiled({"$ref": ref})


@cache
def _event_fields() -> dict[str, frozenset[str]]:
    """Event type -> every field its schema names."""
    defs = _doc()["$defs"]
    mapping = _doc()["properties"]["event"]["discriminator"]["mapping"]
    return {kind: frozenset(defs[ref.rpartition("/")[2]]["properties"])
            for kind, ref in mapping.items()}


def _fail(what: str, value: Any, exc: fastjsonschema.JsonSchemaException) -> AssertionError:
    return AssertionError(f"{what} does not match `processor schema`: {exc.message}\n"
                          f"{json.dumps(value)[:2000]}")


def check_event_entry(fields: dict[str, str]) -> dict[str, Any]:
    """An ``events`` stream entry (flat fields) and its event; returns the event."""
    try:
        validator("events_entry")(fields)
    except fastjsonschema.JsonSchemaException as exc:
        raise _fail("events entry", fields, exc) from exc
    event = json.loads(fields["event"])
    try:
        _event_validator(str(event.get("type")))(event)
    except fastjsonschema.JsonSchemaException as exc:
        raise _fail("event", event, exc) from exc
    want = _event_fields()[event["type"]]
    assert set(event) == want, (
        f"{event['type']} event lacks {sorted(want - set(event))} / has extra "
        f"{sorted(set(event) - want)}: {event}")
    flat = {k: fields[k] for k in ("type", "response_id", "synthesis_id")}
    assert flat == {k: event[k] for k in flat}, (fields, event)
    assert fields.get("attempt_id") == (event["attempt_id"] or None), (fields, event)
    return event


def check_dlq_entry(fields: dict[str, str]) -> None:
    """A ``dlq`` stream entry: the original fields plus what the schema adds."""
    try:
        validator("dlq_entry")(fields)
    except fastjsonschema.JsonSchemaException as exc:
        raise _fail("dlq entry", fields, exc) from exc


def check_merged_entry(fields: dict[str, str]) -> None:
    """A ``merged`` stream entry, its ``response`` and its ``meta``."""
    for name, value in (("merged_entry", fields), ("response", json.loads(fields["response"])),
                        ("meta", json.loads(fields["meta"]))):
        try:
            validator(name)(value)
        except fastjsonschema.JsonSchemaException as exc:
            raise _fail(name, value, exc) from exc

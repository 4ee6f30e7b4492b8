"""The wire schema of the inputs: msgspec Structs for what producers add
to a stream (docs/contract.md §3); the outputs are ``processor.wire.outputs``.

One definition per shape feeds decoding, validation, encoding and the JSON
Schema that ``processor schema`` prints. Field order here is the field
order on the wire.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

EntryKind = Literal["update", "end", "error"]

#: Turn-level correlation ids: first value seen for a turn wins (docs/contract.md §3.1).
TURN_IDS: tuple[str, ...] = (
    "runtime_id",
    "session_id",
    "thread_id",
    "turn_id",
    "task_id",
    "run_id",
    "attempt_id",
)
#: Entry-level correlation ids: kept on the progress event of that entry.
ENTRY_IDS: tuple[str, ...] = ("step_id", "tool_call_id", "action_id", "evidence_id")
#: A usage count (a ``usage_details`` value) is an integer from 0 to this,
#: in each update and in a turn's sum per counter: 2**53 - 1, the largest
#: integer every JSON reader holds exactly (JavaScript's, or any that reads
#: numbers as doubles). An update past it is ``invalid_update``; one that
#: would take a turn's sum past it ends the turn as ``turn_limit``.
MAX_USAGE_COUNT = (1 << 53) - 1
#: The largest entry number (the ``n`` field, docs/contract.md §3.4): 2**53 - 1
#: too, so that every JSON reader holds the counts derived from it exactly.
MAX_ENTRY_NUMBER = MAX_USAGE_COUNT
#: An entry number as the stream carries it: decimal digits, no sign, no
#: leading zero (so that one number has one spelling), at most 16 digits.
ENTRY_NUMBER_PATTERN = r"^(0|[1-9][0-9]{0,15})$"

# ``gc=False`` on the Structs made once per entry (Content, Update, Record):
# they hold decoded data, never themselves, so they cannot be part of a
# reference cycle, and untracked they are cheaper to create and free.


class Content(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, gc=False):
    """One content item in the Agent Framework Python shape.

    ``type`` is an open string: known types get their merge behaviour, unknown
    ones travel through untouched. Every field Agent Framework's ``Content``
    accepts is listed so that a round trip keeps it; a field Agent Framework
    does not know is moved into ``additional_properties`` by the decoder.
    (``data`` is not one: ``Content.from_dict`` only takes it as bytes for
    ``Content.from_data``, which JSON cannot carry, and ``to_dict`` never
    writes it; kept as a field it made the merged response fail to load.)
    """

    type: str
    text: str | None = None
    protected_data: str | None = None
    uri: str | None = None
    media_type: str | None = None
    message: str | None = None
    error_code: str | None = None
    error_details: str | None = None
    usage_details: dict[str, int | None] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | dict[str, Any] | None = None
    exception: str | None = None
    informational_only: bool | None = None
    result: Any = None
    items: list[Any] | None = None
    file_id: str | None = None
    vector_store_id: str | None = None
    inputs: list[Any] | None = None
    outputs: Any = None
    image_id: str | None = None
    commands: list[str] | None = None
    timeout_ms: int | None = None
    max_output_length: int | None = None
    status: str | None = None
    actions: list[dict[str, Any]] | None = None
    screenshot: dict[str, Any] | None = None
    pending_safety_checks: list[Any] | None = None
    acknowledged_safety_checks: list[Any] | None = None
    stdout: str | None = None
    stderr: str | None = None
    exit_code: int | None = None
    timed_out: bool | None = None
    tool_name: str | None = None
    server_name: str | None = None
    output: Any = None
    hosted: bool | None = None
    id: str | None = None
    function_call: dict[str, Any] | None = None
    user_input_request: bool | None = None
    approved: bool | None = None
    consent_link: str | None = None
    merge_mode: Literal["append", "replace"] | None = None
    annotations: list[Any] | None = None
    additional_properties: dict[str, Any] | None = None


#: Names Agent Framework's ``Content`` accepts; anything else is "unknown".
CONTENT_FIELDS: frozenset[str] = frozenset(Content.__struct_fields__)


class Update(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, gc=False):
    """``AgentResponseUpdate.to_dict()`` (Agent Framework Python shape)."""

    type: Literal["agent_response_update"] = "agent_response_update"
    contents: list[Content] = msgspec.field(default_factory=list)
    role: str | None = None
    author_name: str | None = None
    agent_id: str | None = None
    response_id: str | None = None
    message_id: str | None = None
    merge_mode: Literal["append", "replace"] | None = None
    created_at: str | None = None
    finish_reason: str | None = None
    continuation_token: dict[str, Any] | None = None
    additional_properties: dict[str, Any] | None = None


UPDATE_FIELDS: frozenset[str] = frozenset(Update.__struct_fields__)


class InputEntry(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=False):
    """The fields of one ``XADD {ns:s}:updates`` entry (docs/contract.md §3.1).

    ``update`` is JSON text (or msgpack bytes with ``enc=msgpack``); the
    decoder turns it into an ``Update``. Used for the JSON Schema and by
    ``processor merge``; the worker reads the same fields from a stream entry.
    """

    response_id: str | None = None
    kind: EntryKind = "update"
    update: str | None = None
    enc: Literal["json", "msgpack"] = "json"
    error: str | None = None
    code: str | None = None
    runtime_id: str | None = None
    session_id: str | None = None
    thread_id: str | None = None
    turn_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    attempt_id: str | None = None
    step_id: str | None = None
    tool_call_id: str | None = None
    action_id: str | None = None
    evidence_id: str | None = None
    # The entry's number within its turn (docs/contract.md §3.4): a decimal
    # string, 0 for the turn's first entry (per attempt), one more for each.
    n: Annotated[str, msgspec.Meta(pattern=ENTRY_NUMBER_PATTERN)] | None = None


class Record(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A decoded, validated entry: what the merge engine folds.

    Compact (msgpack, array-like) because the worker stores one per applied
    entry until the turn's state is compacted.
    """

    kind: EntryKind
    update: Update | None = None
    ids: dict[str, str] = msgspec.field(default_factory=dict)
    error: str | None = None
    code: str | None = None
    # The entry's number in its turn (the ``n`` field), None when unnumbered.
    # Last, so records stored before it load (with None), and a worker that
    # predates it reads a newer record without it (msgspec ignores the rest).
    n: int | None = None

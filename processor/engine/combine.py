"""How the pieces of a turn combine: chunks into contents, properties, id-less
runs into the keyed message after them, and the ids of id-less messages.

Pure helpers of ``processor.engine.merge`` (folding and rendering alike).
"""

from __future__ import annotations

import zlib
from operator import attrgetter
from typing import Any

import msgspec

from processor.engine.turn_state import Segment, TurnState
from processor.wire.ids import TurnKey, new_turn_key
from processor.wire.models import Content, Update
from processor.wire.outputs import Message, Response

FOLDABLE_TEXT = ("text", "text_reasoning")


def call_owners(st: TurnState, contents: list[Content]) -> list[int]:
    """The segments holding the calls that these contents' results answer."""
    calls = st.calls
    owners: list[int] = []
    if calls:
        for c in contents:
            if c.type == "function_result" and c.call_id is not None and c.call_id in calls:
                owners.append(calls[c.call_id])
    return owners


def take_names(seg: Segment, update: Update) -> None:
    """A message's role, author, agent and created_at are the first ones its
    updates name (docs/contract.md §4.3). (``Turn`` writes it out inline on
    its usual paths.)"""
    if seg.role is None:
        seg.role = update.role
    if seg.author_name is None:
        seg.author_name = update.author_name
    if seg.agent_id is None:
        seg.agent_id = update.agent_id
    if seg.created_at is None:
        seg.created_at = update.created_at


def position(st: TurnState, seg: int) -> tuple[int, int]:
    """Where a segment sits in the merged order: its block, its place there."""
    block = st.segments[seg].block
    return block, st.blocks[block].segments.index(seg)


def merged_response(st: TurnState) -> Response:
    """The response of a turn's state with no pending delta parts (see
    ``Turn.finish``): blocks and their messages in first-seen order, id-less
    runs folded into the keyed message after them, ids assigned where needed."""
    segments = st.segments
    order = [seg for b in st.blocks for i in b.segments if (seg := segments[i]).contents]
    kept = fold_idless(keep_moved_ids(st, order))
    tag = ""  # made only for a message that needs an assigned id
    reserved: set[str] = set()
    messages = []
    for seg, contents in kept:
        message_id = seg.message_id
        if message_id is None:
            if not tag:
                tag = turn_tag(new_turn_key(TurnKey, (st.response_id, st.attempt_id)))
                reserved = set(st.keyed)
            message_id = assigned_id(seg.ordinal, tag, reserved)
        messages.append(_message(st, seg, contents, message_id))
    return Response(
        messages=messages,
        response_id=st.response_id,
        agent_id=st.agent_id,
        finish_reason=st.finish_reason,
        usage_details=_usage(st),
        additional_properties=dict(st.properties),
    )


def keep_moved_ids(st: TurnState, order: list[Segment]) -> list[Segment]:
    """A producer's message id never vanishes (result before call).

    A keyed update whose function result moved after its call went to an
    id-less message. If the keyed message it names is empty (the result was
    all it held), the first such moved message in ``order`` (the merged
    order of the non-empty messages) is rendered as that keyed message: it
    carries the producer's id and the keyed message's role, author, agent
    and created_at (the first ones its updates name, the moved ones
    included: ``Turn`` names the keyed message from them too, §4.3) and,
    like any keyed message, an id-less run may fold into it but it does not
    fold into the next one. Any other message renders as before. The id is
    unique: its own message is not rendered, assigned ids never equal a
    producer's, and only one moved message takes it.
    """
    if not any(map(_moved_from, order)):
        return order  # (the usual turn: checked in C)
    out = order
    taken: set[str] = set()
    for i, seg in enumerate(order):
        origin = seg.moved_from
        if origin is None or origin in taken or st.segments[st.keyed[origin]].contents:
            continue
        taken.add(origin)
        if out is order:
            out = list(order)
        own = st.segments[st.keyed[origin]]
        out[i] = msgspec.structs.replace(
            seg, message_id=origin,
            # (A state stored before the moved update named the keyed one
            # may leave a name unset there: the moved message's stands in.)
            role=_first(own.role, seg.role),
            author_name=_first(own.author_name, seg.author_name),
            agent_id=_first(own.agent_id, seg.agent_id),
            created_at=_first(own.created_at, seg.created_at),
        )
    return out


_moved_from = attrgetter("moved_from")


def _first(named: str | None, fallback: str | None) -> str | None:
    return named if named is not None else fallback


def _usage(st: TurnState) -> dict[str, int] | None:
    """The turn's usage: every inner response's, summed per counter."""
    if st.usage is None and not st.block_usage:
        return None
    total = dict(st.usage or {})
    for usage in st.block_usage.values():
        for name, value in usage.items():
            total[name] = total.get(name, 0) + value
    return total


def _message(st: TurnState, seg: Segment, contents: list[Content], message_id: str) -> Message:
    props: dict[str, Any] = {}
    if seg.created_at is not None:
        props["created_at"] = seg.created_at
    inner = st.blocks[seg.block].inner_id
    if inner:
        props["response_id"] = inner
    if seg.agent_id is not None:
        props["agent_id"] = seg.agent_id
    return Message(
        role=seg.role or "assistant",
        contents=contents,
        author_name=seg.author_name,
        message_id=message_id,
        additional_properties=props,
    )


def assigned_id(ordinal: int, tag: str, reserved: set[str]) -> str:
    """The id of an id-less message: a function of its first update's arrival
    ordinal and the turn, so partial merges, re-merges after a crash and
    compacted states agree; never one a producer used in the turn (rule 6)."""
    candidate = f"msg-{ordinal}-{tag}"
    while candidate in reserved:
        candidate += "~"
    return candidate


def turn_tag(key: TurnKey) -> str:
    """A short per-turn tag that makes assigned ids unlikely to meet producer ids."""
    return f"{zlib.crc32(key.encode().encode()):08x}"


def same_author(current: str | None, incoming: str | None) -> bool:
    """An unnamed author continues the run; a different name splits it."""
    return current is None or incoming is None or current == incoming


def same_role(current: str | None, incoming: str | None) -> bool:
    """An unnamed role continues the run. A run that has not named its role is
    an assistant run (the default role, as in Agent Framework), so a ``tool``
    update after role-less assistant text starts a new message."""
    return incoming is None or (current or "assistant") == incoming


def fold_idless(order: list[Segment]) -> list[tuple[Segment, list[Content]]]:
    """Fold an id-less message into the keyed message right after it (rule 4).

    Walks from the end so that the merged order is what decides "right after":
    a chain of id-less runs that all match lands in the same keyed message.
    "Match" counts the authors already folded in: a keyed message without an
    author that took in bob's run does not then take alice's run too, so a
    message never mixes two speakers the run split kept apart.
    """
    out: list[tuple[Segment, list[Content]]] = []
    speaker: str | None = None  # the author of out[-1], its folded runs included
    for seg in reversed(order):
        if seg.message_id is None and out:
            nxt, nxt_contents = out[-1]
            if (
                nxt.message_id is not None
                and (seg.role or "assistant") == (nxt.role or "assistant")
                and same_author(speaker, seg.author_name)
            ):
                front = [_final(c, merge_mode=None) for c in seg.contents]
                out[-1] = (nxt, _join(front, nxt_contents))
                speaker = speaker or seg.author_name
                continue
        # Copies: the response must not share contents the next apply() mutates.
        out.append((seg, [_final(c, merge_mode=None) for c in seg.contents]))
        speaker = seg.author_name
    out.reverse()
    return out


def _join(front: list[Content], back: list[Content]) -> list[Content]:
    """``front + back``, with text deltas meeting at the seam concatenated."""
    if front and back and front[-1].type in FOLDABLE_TEXT and front[-1].type == back[0].type:
        seam = copy_content(front[-1])
        seam.text = (seam.text or "") + (back[0].text or "")
        merge_extras(seam, back[0])
        return [*front[:-1], seam, *back[1:]]
    return [*front, *back]


#: ``copy_content(content)``: a copy of a content (msgspec's C function
#: itself: a Python wrapper would cost as much as the copy).
copy_content = msgspec.structs.replace
#: ``_final(content, merge_mode=None)``: a copy for the response.
#: ``merge_mode`` says how a chunk combines with the previous one; a merged
#: content is no chunk (Agent Framework clears it when it finalises a
#: response too).
_final = msgspec.structs.replace


def merge_properties(target: dict[str, Any], incoming: dict[str, Any]) -> None:
    """Update-level properties: the later update wins per key, one level deep
    (``merge_additional_properties(..., incoming_wins=True)`` in Agent Framework,
    so namespaced objects like ``{"openai": {...}}`` combine)."""
    for key, value in incoming.items():
        current = target.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            target[key] = {**current, **value}
        else:
            target[key] = dict(value) if isinstance(value, dict) else value


def merge_extras(target: Content, chunk: Content) -> None:
    """What a later chunk adds to the content it continues, as Agent
    Framework's ``Content.__add__`` does: the earliest value wins per property
    key (one level deep), annotations concatenate; for reasoning the id is the
    first one given, signature (``protected_data``) and status the last ones;
    for calls ids and servers are the first ones, status and exception the
    last, flags are or-ed. Nothing a provider sends on a later chunk is lost.
    """
    if chunk.additional_properties:
        merged = dict(chunk.additional_properties)
        merge_properties(merged, target.additional_properties or {})
        target.additional_properties = merged
    if chunk.annotations:
        target.annotations = [*(target.annotations or []), *chunk.annotations]
    # (Each field is written only when it changes: setting a Struct field
    # costs more than reading it, and this runs for every chunk.)
    if target.type == "text_reasoning":
        if not target.id:
            target.id = chunk.id
        if chunk.protected_data is not None or chunk.merge_mode == "replace":
            target.protected_data = chunk.protected_data
        if chunk.status is not None:
            target.status = chunk.status
    elif target.type == "function_call":
        if not target.id:
            target.id = chunk.id
        if not target.call_id:
            target.call_id = chunk.call_id
        if not target.server_name:
            target.server_name = chunk.server_name
        if chunk.status is not None:
            target.status = chunk.status
        if chunk.exception is not None:
            target.exception = chunk.exception
        # Flags are or-ed, staying unset while neither side sets them.
        if target.hosted is not None or chunk.hosted is not None:
            target.hosted = bool(target.hosted or chunk.hosted)
        if target.informational_only is not None or chunk.informational_only is not None:
            target.informational_only = bool(target.informational_only or chunk.informational_only)
        if target.user_input_request is not None or chunk.user_input_request is not None:
            target.user_input_request = bool(target.user_input_request or chunk.user_input_request)


def merged_text(response: Response) -> str:
    """The response's text as ``AgentResponse.text`` computes it."""
    return "".join(
        " ".join(c.text or "" for c in m.contents if c.type == "text") for m in response.messages
    )

"""The merge: a pure, deterministic fold of a turn's entries (docs/contract.md §4).

``Turn`` folds update records one at a time, in arrival order, into a
state that is small (adjacent deltas are coalesced) and serialisable
(``Turn.to_bytes`` / ``Turn.from_bytes``), so a turn can be folded
part-way on one process and finished on another. ``Turn.finish`` renders
the merged ``Response`` without changing the state.

Nothing here does I/O, reads a clock or depends on which process runs it:
the same records in the same order give byte-identical output.

Layout of the state (``processor.engine.turn_state``): the turn's messages
("segments") grouped in blocks, one block per inner response id, blocks and
segments in first-seen order. A keyed segment collects every update naming
its ``message_id``; an id-less segment collects one contiguous run of
id-less updates. Ordering, grouping and id assignment are decided once,
here, from arrival order alone.
"""

from __future__ import annotations

import msgspec

from processor.engine.combine import (
    FOLDABLE_TEXT,
    assigned_id,
    call_owners,
    copy_content,
    merge_extras,
    merge_properties,
    merged_response,
    merged_text,
    position,
    take_names,
    turn_tag,
)
from processor.engine.turn_state import Block, Segment, TurnState
from processor.engine.usage import UsageOverflow, usage_after
from processor.wire.ids import TurnKey, new_turn_key
from processor.wire.models import TURN_IDS, Content, Record, Update
from processor.wire.outputs import Response

# Re-exported: the merge's public names stay importable from here.
__all__ = [
    "Block", "Segment", "Turn", "TurnState", "UsageOverflow", "assigned_id", "merged_text",
    "turn_tag",
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TurnState)


class Turn:
    """The incremental merge of one turn.

    ``apply`` folds a record; ``compact`` coalesces pending deltas (it never
    changes what ``finish`` returns); ``to_bytes``/``from_bytes`` carry the
    state across processes; ``finish`` renders the merged response.
    """

    __slots__ = ("_block_of", "_parts", "grown", "mark", "state")

    def __init__(self, key: TurnKey) -> None:
        self.state = TurnState(key.response_id, key.attempt_id)
        self._block_of: dict[str, int] = {}
        # Pending string pieces per (segment, content index): joined lazily so
        # a 10,000-delta message costs O(n), not O(n^2), to assemble.
        self._parts: dict[tuple[int, int], list[str]] = {}
        self.grown: dict[int, list[str]] | None = None
        self.mark = 0

    def track(self, mark: int) -> None:
        """Record from here on what only grows the merge (``grown``: per
        segment, the text, reasoning or call argument pieces appended to
        its last content by ``fold``'s usual path), under ``mark`` (not 0).
        Any other change sets ``mark`` to 0: then ``grown`` no longer tells
        all that changed (processor.engine.live_growth)."""
        self.mark, self.grown = mark, {}

    # ------------------------------------------------------------ state I/O

    @property
    def key(self) -> TurnKey:
        return new_turn_key(TurnKey, (self.state.response_id, self.state.attempt_id))

    def to_bytes(self) -> bytes:
        """Compact the state and serialise it (msgpack)."""
        self.compact()
        return _encoder.encode(self.state)

    @classmethod
    def from_bytes(cls, data: bytes) -> Turn:
        turn = cls.__new__(cls)
        turn.state = _decoder.decode(data)
        turn._block_of = {b.inner_id: i for i, b in enumerate(turn.state.blocks)}
        turn._parts = {}
        turn.grown, turn.mark = None, 0
        return turn

    def compact(self) -> None:
        """Coalesce pending deltas into their contents. Output is unchanged."""
        for (seg, idx), parts in self._parts.items():
            content = self.state.segments[seg].contents[idx]
            joined = "".join(parts)
            if content.type == "function_call":
                content.arguments = joined
            else:
                content.text = joined
        self._parts.clear()

    # ------------------------------------------------------------ folding

    def apply(self, record: Record) -> None:
        """Fold one record (in arrival order). Only ``update`` records change
        the merge; the caller decides what ``end``/``error`` mean. Raises
        ``UsageOverflow``, changing nothing, for an update whose usage
        does not fit (so its ids are taken only after the fold)."""
        update = record.update
        if update is not None:
            self.fold(update)
        if record.ids:
            self._take_ids(record.ids)

    def fold(self, update: Update) -> None:
        """Fold one update (in arrival order): ``apply`` of a record of
        it with no correlation ids.

        The usual update, one text, reasoning or argument delta continuing
        the last content of the message its id names, is folded right here,
        in a few steps (a method call costs as much as several of them): it
        does exactly what ``_apply_update`` would. Anything else, or any
        doubt, takes ``_apply_update``.
        """
        try:
            (chunk,) = update.contents  # (cheaper than a len() test, in the usual case)
        except ValueError:
            return self._apply_update(update)  # no content, or several
        if update.merge_mode is not None or update.additional_properties:
            return self._apply_update(update)
        st = self.state
        index = st.keyed.get(update.message_id)  # type: ignore[arg-type]
        if index is None or chunk.merge_mode is not None:
            return self._apply_update(update)  # id-less, a message not seen yet, or a snapshot
        inner = update.response_id
        if not inner or inner == st.response_id:
            inner = ""
        if inner not in self._block_of:
            return self._apply_update(update)  # a new inner response: its block is created first
        seg = st.segments[index]
        held = seg.contents
        if not held:
            return self._apply_update(update)
        target = held[-1]
        kind = chunk.type
        if target.type != kind:
            return self._apply_update(update)
        key = (index, len(held) - 1)
        if kind == "text" or kind == "text_reasoning":
            piece = chunk.text or ""
        elif kind == "function_call":
            # A chunk of the trailing call (_call_target finds it first),
            # string arguments joined to string (or no) arguments.
            piece = chunk.arguments  # type: ignore[assignment]
            if piece.__class__ is not str or (chunk.call_id and chunk.call_id != target.call_id):
                return self._apply_update(update)
            if not (
                key in self._parts or target.arguments is None or isinstance(target.arguments, str)
            ):
                return self._apply_update(update)
            if chunk.name and not target.name:
                target.name = chunk.name
        else:
            return self._apply_update(update)
        # What _apply_update does for it, in the same order (the call's
        # name above touches only the call: no step below reads it).
        st.updates += 1
        if update.finish_reason is not None:
            st.finish_reason = update.finish_reason
        # (A Struct field write costs several reads: skipped when unchanged.)
        agent_id = update.agent_id
        if agent_id is not None and agent_id != st.agent_id:
            st.agent_id = agent_id
        if st.open_run != -1:
            st.open_run = -1
        # (A message named late renders anew: its mark goes. Not created_at,
        # which no live event says.)
        if seg.role is None and update.role is not None:
            seg.role, self.mark = update.role, 0
        if seg.author_name is None and update.author_name is not None:
            seg.author_name, self.mark = update.author_name, 0
        if seg.agent_id is None and update.agent_id is not None:
            seg.agent_id, self.mark = update.agent_id, 0
        if seg.created_at is None:
            seg.created_at = update.created_at
        parts = self._parts.get(key)
        if parts is None:
            current = target.arguments if kind == "function_call" else target.text
            self._parts[key] = [current if isinstance(current, str) else "", piece]
        else:
            parts.append(piece)
        grown = self.grown
        if grown is not None:
            pieces = grown.get(index)
            if pieces is None:
                grown[index] = [piece]
            else:
                pieces.append(piece)
        if kind != "text" or chunk.additional_properties or chunk.annotations:
            merge_extras(target, chunk)  # (a no-op for a bare text delta)

    def _take_ids(self, ids: dict[str, str]) -> None:
        for name, value in ids.items():
            # Only turn-level ids belong to the turn; entry-level ids
            # (step_id, ...) describe one entry and stay on its progress event.
            if name in TURN_IDS:
                self.state.ids.setdefault(name, value)

    def _apply_update(self, update: Update) -> None:
        # A quarter of the updates come here (a message's first update,
        # results, usage, id-less runs): the usual steps are written out
        # inline, as each helper call costs about as much as its body.
        st = self.state
        self.mark = 0  # (anything may change: processor.engine.live_growth renders it)
        inner = update.response_id
        if not inner or inner == st.response_id:
            inner = ""  # the turn's own block
        contents = update.contents
        for content in contents:
            if content.type == "usage":  # rare: taken out only then
                # First: a usage that does not fit raises before any change.
                usage = usage_after(self.state, contents, inner)
                if usage is not None:
                    st.block_usage[inner] = usage
                contents = [c for c in contents if c.type != "usage"]
                break
        ordinal = st.updates
        st.updates += 1
        if update.finish_reason is not None:
            st.finish_reason = update.finish_reason
        agent_id = update.agent_id
        if agent_id is not None and agent_id != st.agent_id:
            st.agent_id = agent_id
        if update.additional_properties:
            merge_properties(st.properties, update.additional_properties)
        block = self._block_of.get(inner)
        if block is None:
            block = self._new_block(inner)
        message_id = update.message_id
        if message_id:
            # A message id names one message in the whole turn (rule 3).
            seg = st.keyed.get(message_id)
            if seg is None:
                seg = st.keyed[message_id] = self._new_segment(block, ordinal, message_id)
            if st.open_run != -1:
                st.open_run = -1
            if st.calls:  # (no call yet: no result can answer one)
                moved = self._result_after_call(seg, contents, ordinal, message_id)
                if moved != seg:
                    # Its contents move, but it is still one of the message's
                    # updates: the names it gives count for the message too.
                    take_names(st.segments[seg], update)
                    seg = moved
        else:
            if st.calls:
                block = self._result_block(block, contents)
            seg = self._idless_segment(update, block, ordinal)
        # Role, author, agent and created_at: the first ones named win
        # (take_names, written out).
        target = st.segments[seg]
        if target.role is None:
            target.role = update.role
        if target.author_name is None:
            target.author_name = update.author_name
        if target.agent_id is None:
            target.agent_id = update.agent_id
        if target.created_at is None:
            target.created_at = update.created_at
        if update.merge_mode == "replace":
            self._clear(seg)
        for content in contents:
            self._append(seg, content)

    def usage_overflow(self, update: Update) -> UsageOverflow | None:
        """What folding ``update`` would raise because of its usage, if
        anything. Changes nothing."""
        inner = update.response_id
        if not inner or inner == self.state.response_id:
            inner = ""
        for content in update.contents:
            if content.type == "usage":
                try:
                    usage_after(self.state, update.contents, inner)
                except UsageOverflow as refused:
                    return refused
                break
        return None

    def _clear(self, seg: int) -> None:
        """An update with ``merge_mode="replace"`` restarts its message's
        contents (Agent Framework's ``from_updates`` does the same)."""
        self.state.segments[seg].contents = []
        for key in [k for k in self._parts if k[0] == seg]:
            del self._parts[key]

    def _new_block(self, key: str) -> int:
        """The block of an inner response id seen for the first time."""
        index = len(self.state.blocks)
        self.state.blocks.append(Block(key, []))
        self._block_of[key] = index
        return index

    def _new_segment(self, block: int, ordinal: int, message_id: str | None) -> int:
        index = len(self.state.segments)
        self.state.segments.append(Segment(ordinal, block, message_id))
        self.state.blocks[block].segments.append(index)
        return index

    def _idless_segment(self, update: Update, block: int, ordinal: int) -> int:
        """A contiguous id-less run stays in place, split on role/author (rule 4)."""
        run = self.state.open_run
        if run >= 0:
            seg = self.state.segments[run]
            # same_role() and same_author(), written out (a call each costs more).
            role, author = update.role, update.author_name
            if (
                seg.block == block
                and (role is None or (seg.role or "assistant") == role)
                and (author is None or seg.author_name is None or seg.author_name == author)
            ):
                return run
        run = self._new_segment(block, ordinal, None)
        self.state.open_run = run
        return run

    def _result_block(self, block: int, contents: list[Content]) -> int:
        """Never move a function result before its call (rule 5), id-less case.

        An id-less update lands at the end of its block, after every call
        there; only a call in a later block could end up after it, so a result
        answering such a call joins that block instead.
        """
        owners = call_owners(self.state, contents)
        if not owners:
            return block
        return max([block, *(self.state.segments[seg].block for seg in owners)])

    def _result_after_call(
        self, seg: int, contents: list[Content], ordinal: int, message_id: str
    ) -> int:
        """Never move a function result before its call (rule 5), keyed case.

        A keyed update can rejoin a message that sits before the message
        holding the call its result answers; then the update starts a new
        id-less message at the end of the call's block instead (the
        producer's id names the earlier message, and the role and author the
        update names count for it, rule 3). The new message remembers that
        id: it takes it if the earlier message ends up empty
        (``combine.keep_moved_ids``).
        """
        owners = call_owners(self.state, contents)
        if not owners:
            return seg
        st = self.state
        last = max(owners, key=lambda owner: position(st, owner))
        if position(st, last) <= position(st, seg):
            return seg
        moved = self._new_segment(st.segments[last].block, ordinal, None)
        st.segments[moved].moved_from = message_id
        return moved

    def _append(self, index: int, content: Content) -> None:
        contents = self.state.segments[index].contents
        last = len(contents) - 1
        if content.type in FOLDABLE_TEXT:
            if last >= 0 and contents[last].type == content.type:
                self._extend(index, last, content.text or "", content)
                return
        elif content.type == "function_call":
            target = self._call_target(index, content)
            if target is not None:
                self._extend_call(index, target, content)
                return
            if content.call_id:
                self.state.calls.setdefault(content.call_id, index)
        contents.append(copy_content(content))

    def _call_target(self, index: int, content: Content) -> int | None:
        """The call a function-call chunk continues, if any."""
        contents = self.state.segments[index].contents
        if content.call_id:
            for i in range(len(contents) - 1, -1, -1):
                c = contents[i]
                if c.type == "function_call" and c.call_id == content.call_id:
                    return i
            return None
        # A chunk without call_id continues the trailing call.
        if contents and contents[-1].type == "function_call":
            return len(contents) - 1
        return None

    def _extend(self, seg: int, idx: int, piece: str, chunk: Content) -> None:
        target = self.state.segments[seg].contents[idx]
        parts = self._parts.get((seg, idx))
        if chunk.merge_mode == "replace":
            # A snapshot, not a delta: it replaces what came before.
            self._parts[(seg, idx)] = [piece]
        elif parts is None:
            current = target.arguments if target.type == "function_call" else target.text
            self._parts[(seg, idx)] = [current if isinstance(current, str) else "", piece]
        else:
            parts.append(piece)
        merge_extras(target, chunk)

    def _extend_call(self, seg: int, idx: int, chunk: Content) -> None:
        target = self.state.segments[seg].contents[idx]
        if chunk.name and (not target.name or chunk.merge_mode == "replace"):
            target.name = chunk.name
        pending = (seg, idx) in self._parts
        args = chunk.arguments
        if chunk.merge_mode == "replace" and not isinstance(args, str):
            self._parts.pop((seg, idx), None)
            target.arguments = args
            merge_extras(target, chunk)
        elif isinstance(args, str) and (
            pending or target.arguments is None or isinstance(target.arguments, str)
        ):
            self._extend(seg, idx, args, chunk)
        elif isinstance(args, dict) and not pending and isinstance(target.arguments, dict):
            target.arguments = {**target.arguments, **args}
            merge_extras(target, chunk)
        elif args is not None:
            # Mixed string/object arguments cannot be joined: keep the chunk whole.
            self.state.segments[seg].contents.append(copy_content(chunk))
        else:
            merge_extras(target, chunk)

    # ------------------------------------------------------------ rendering

    def finish(self) -> Response:
        """The merged response of everything folded so far."""
        self.compact()
        return merged_response(self.state)

"""The AI SDK's UI message stream as a stream ``Format``
(``GET /v1/turns/{id}/stream``): each chunk one SSE ``data:`` JSON line,
``data: [DONE]`` after the last. Pure: items in, SSE frames out; the
rendering is ``processor.engine.ui_messages``'s.

SSE ids: the last frame of each live event's chunks carries its seq, as on
the native stream. The AI SDK sends none back (``reconnectToStream`` is a
plain ``fetch``, no ``Last-Event-ID``) and replays a resumed stream from its
``start`` chunk, so every connection is a fresh join: the route ignores
``Last-Event-ID``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from processor.client.turns import LiveEvent, MergedOutput, Snapshot, TurnRef
from processor.engine.ui_messages import Ending, UiStream
from processor.engine.ui_parts import Chunk
from processor.serve import sse
from processor.wire.outputs import Response

#: The response header that names the protocol (``UI_MESSAGE_STREAM_HEADERS`` in ``ai``).
HEADER = ("x-vercel-ai-ui-message-stream", "v1")
DONE = sse.frame(b"[DONE]")

_response = msgspec.json.Decoder(Response)
_encode = msgspec.json.Encoder().encode


class UiMessages:
    """One open UI message stream: the turn's message, as the client builds it."""

    def __init__(self, turn: TurnRef) -> None:
        self.ui = UiStream(turn.key.synthesis_id())

    def fold(self, event: LiveEvent) -> None:
        pass  # never resumed from an id: nothing the client has is folded

    def snapshot(self, snapshot: Snapshot, first: LiveEvent | None) -> list[bytes]:
        return _frames(self.ui.snapshot(_response.decode(snapshot.response)), snapshot.seq)

    def event(self, event: LiveEvent, merged: MergedOutput | None) -> list[bytes]:
        data: dict[str, Any] = msgspec.json.decode(event.data)
        if not event.terminal:
            return _frames(self.ui.event(data), event.seq)
        ending = Ending.of_event(data)
        response, finish, meta = _merged(merged)
        if ending.cancel_reason is None and isinstance(meta.get("cancel_reason"), str):
            ending = Ending(ending.status, ending.error_message, meta["cancel_reason"])
        return [*_frames(self.ui.end(ending, response, finish), event.seq), DONE]

    def gone(self, turn: TurnRef, merged: MergedOutput | None, status: str | None) -> list[bytes]:
        response, finish, meta = _merged(merged)
        error = meta.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        reason = meta.get("cancel_reason")
        ending = Ending(merged.status if merged is not None else status or "",
                        message if isinstance(message, str) else None,
                        reason if isinstance(reason, str) else None)
        return [*_frames(self.ui.end(ending, response, finish), None), DONE]

    def notice(self, body: dict[str, Any]) -> bytes:
        """A server notice (``dropped``): a transient data chunk, which a
        client hands to ``onData`` and keeps out of the message."""
        return sse.frame(_encode({"type": "data-processor-notice", "data": body,
                                  "transient": True}))


def _merged(merged: MergedOutput | None) -> tuple[Response | None, str | None, dict[str, Any]]:
    """The merged response, its finish reason and its meta (as JSON: fields
    added later, such as ``cancel_reason``, are read when present)."""
    if merged is None:
        return None, None, {}
    response = _response.decode(merged.response)
    meta = msgspec.json.decode(merged.meta) if merged.meta else {}
    return response, response.finish_reason, meta if isinstance(meta, dict) else {}


def _frames(chunks: list[Chunk], seq: int | None) -> list[bytes]:
    """One ``data:`` frame per chunk; the last one carries ``seq`` as its id."""
    last = len(chunks) - 1
    return [sse.frame(_encode(chunk), id=str(seq) if i == last and seq is not None else None)
            for i, chunk in enumerate(chunks)]

"""What ``processor serve`` reads of an AG-UI request: the ``RunAgentInput``
an AG-UI client posts, and whether a request takes an event stream."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from processor.serve.edge import refusal, too_large

#: The largest ``RunAgentInput`` body an AG-UI client may post (its whole
#: conversation rides along), in bytes.
MAX_RUN_INPUT = 4 * 1024 * 1024


@dataclass
class RunInput:
    """What ``processor serve`` reads of a posted ``RunAgentInput``: its
    ``runId`` (checked) and ``messages`` (what the client holds); its
    ``threadId``, ``tools``, ``state``, ``context`` and ``forwardedProps``
    are ignored (the turn is the path's)."""

    run_id: str | None
    messages: list[dict[str, Any]] | None


async def run_input(request: web.Request) -> RunInput:
    """The posted body, read to its end up to ``MAX_RUN_INPUT`` bytes (413 over)."""
    if request.content_length is not None and request.content_length > MAX_RUN_INPUT:
        raise too_large(MAX_RUN_INPUT, "too_large", f"the body is over {MAX_RUN_INPUT} bytes")
    parts: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):  # read() may stop short: to EOF
        size += len(chunk)
        if size > MAX_RUN_INPUT:
            raise too_large(MAX_RUN_INPUT, "too_large",
                            f"the body is over {MAX_RUN_INPUT} bytes")
        parts.append(chunk)
    raw = b"".join(parts)
    if not raw.strip():
        return RunInput(None, None)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise refusal(400, "bad_request", "the body must be JSON: AG-UI's RunAgentInput "
                      "({threadId, runId, messages, ...})") from None
    if not isinstance(body, dict):
        raise refusal(400, "bad_request", "the body must be a JSON object (RunAgentInput)")
    for name in ("threadId", "runId"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise refusal(400, "bad_request", f"{name} must be a string")
    given = body.get("messages")
    if given is None:
        return RunInput(body.get("runId"), None)
    if not isinstance(given, list):
        raise refusal(400, "bad_request", "messages must be a list of AG-UI messages")
    for i, message in enumerate(given):
        if not isinstance(message, dict):
            raise refusal(400, "bad_request", f"messages[{i}] must be an object (an AG-UI "
                          "message)")
    # A message without a string id and role cannot be named by a snapshot:
    # not kept (Agent Framework's AGUIChatClient posts its prompt without an id).
    given = [m for m in given if isinstance(m.get("id"), str) and isinstance(m.get("role"), str)]
    return RunInput(body.get("runId"), given)


def accepts_event_stream(request: web.Request) -> bool:
    """Whether the request's ``Accept`` (absent: anything) takes ``text/event-stream``."""
    accept = request.headers.get("Accept")
    if not accept:
        return True
    for part in accept.split(","):
        media, _, params = part.strip().partition(";")
        if media.strip().lower() in ("text/event-stream", "text/*", "*/*") \
                and params.replace(" ", "").lower() not in ("q=0", "q=0.0", "q=0.00", "q=0.000"):
            return True
    return False

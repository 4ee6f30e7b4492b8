"""Agent Framework's own AG-UI client (``agent-framework-ag-ui`` 1.7,
``AGUIChatClient``) following one turn of ``processor serve``: run in a
venv of its own (it pins ``ag-ui-protocol`` < 0.2, the suite has 1.0; see
tests/serve/test_agui_clients.py), not imported by the suite.

    python agui_chat_client.py URL TOKEN

Prints one JSON line: the response's messages (role, author, text, calls,
results), as ``get_response`` gives them."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
from agent_framework_ag_ui import AGUIChatClient


async def main(url: str, token: str) -> dict[str, Any]:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                 timeout=60) as http:
        client = AGUIChatClient(endpoint=url, http_client=http)
        response = await client.get_response("(attach to the turn)")
    messages = []
    for message in response.messages:
        messages.append({
            "role": str(message.role), "message_id": message.message_id,
            "text": "".join(c.text or "" for c in message.contents if c.type == "text"),
            "calls": [[c.call_id, c.name, c.arguments] for c in message.contents
                      if c.type == "function_call"],
            "results": [[c.call_id, c.result] for c in message.contents
                        if c.type == "function_result"],
            "errors": [getattr(c, "message", None) for c in message.contents
                       if c.type == "error"],
        })
    return {"text": response.text, "messages": messages,
            "finish_reason": str(response.finish_reason) if response.finish_reason else None}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2])), default=str))

"""Valid entries close to the entry size limit: an update carrying one
``data`` content whose URI is ~0.93 MB of base64 (the shape of the backlog
in the "memory bounded in bytes" issue)."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

#: Bytes of base64 in one update's data URI: the entry is ~0.93 MB, under
#: the 1 MiB --max-entry-bytes.
DATA_CHARS = 930_000


def data_uri(seed: str, chars: int = DATA_CHARS) -> str:
    """A data URI of ``chars`` base64 characters, different for each seed."""
    raw = hashlib.shake_256(seed.encode()).digest(chars * 3 // 4)
    return "data:application/octet-stream;base64," + base64.b64encode(raw).decode()


def big_update(rid: str, n: int, chars: int = DATA_CHARS,
               uri: str | None = None) -> dict[str, Any]:
    """The ``n``-th big update of turn ``rid`` (its ``update`` as JSON text),
    carrying ``uri`` (``data_uri(f"{rid}/{n}", chars)`` unless given)."""
    update = {"type": "agent_response_update", "role": "assistant", "message_id": f"m{n}",
              "contents": [{"type": "data", "uri": uri or data_uri(f"{rid}/{n}", chars),
                            "media_type": "application/octet-stream"}]}
    return {"response_id": rid, "update": json.dumps(update)}


def digest(uri: str) -> bytes:
    """What a test keeps of a big URI to compare it with another."""
    return hashlib.sha256(uri.encode()).digest()


def uris_of(response: str) -> list[str]:
    """The data URIs of a merged response, in order."""
    return [c["uri"] for m in json.loads(response)["messages"] for c in m["contents"]
            if c.get("type") == "data"]

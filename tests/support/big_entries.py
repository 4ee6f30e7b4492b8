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
#: Base64 characters drawn from a seed; a URI repeats them (cut to size),
#: so that each is as different from any other as a random one, at a
#: fraction of the cost (the 512 MiB backlog makes 600 of them).
BLOCK_CHARS = 16_384
_PREFIX = "data:application/octet-stream;base64,"


def data_uri(seed: str, chars: int = DATA_CHARS) -> str:
    """A data URI of ``chars`` base64 characters, different for each seed."""
    block = base64.b64encode(hashlib.shake_256(seed.encode()).digest(BLOCK_CHARS * 3 // 4))
    body = (block * (chars // len(block) + 1))[:chars]
    return _PREFIX + body.decode()


def big_update(rid: str, n: int, chars: int = DATA_CHARS,
               uri: str | None = None) -> dict[str, Any]:
    """The ``n``-th big update of turn ``rid`` (its ``update`` as JSON text),
    carrying ``uri`` (``data_uri(f"{rid}/{n}", chars)`` unless given). The
    URI is spliced into the JSON text (base64 needs no escaping) rather
    than encoded by ``json.dumps``, which scans all of it."""
    update = {"type": "agent_response_update", "role": "assistant", "message_id": f"m{n}",
              "contents": [{"type": "data", "uri": "@URI@",
                            "media_type": "application/octet-stream"}]}
    text = json.dumps(update).replace("@URI@", uri or data_uri(f"{rid}/{n}", chars), 1)
    return {"response_id": rid, "update": text}


def digest(uri: str) -> bytes:
    """What a test keeps of a big URI to compare it with another."""
    return hashlib.sha256(uri.encode()).digest()


def uris_of(response: str) -> list[str]:
    """The data URIs of a merged response, in order."""
    return [c["uri"] for m in json.loads(response)["messages"] for c in m["contents"]
            if c.get("type") == "data"]

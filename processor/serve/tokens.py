"""Turn tokens: what lets a browser read one turn, and only that turn.

A token names one ``response_id`` and an expiry (Unix seconds), signed with
HMAC-SHA256 under the server's secret::

    v1.<base64url(JSON {"rid": response_id, "exp": seconds})>.<base64url(MAC)>

The MAC covers ``v1.`` and the payload's text. A backend that holds the
secret mints tokens (``issue``, or ``processor token``); every replica
of ``processor serve`` checks them with the same secret and no state
(``verify``). The MAC is compared in constant time, and checked before
anything in the payload is believed.

Pure functions: the clock is an argument.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from enum import Enum

VERSION = "v1"
#: The shortest secret accepted: shorter ones are guessable offline from one token.
MIN_SECRET_LENGTH = 16


class Verdict(Enum):
    """What ``verify`` found; each refusal has its HTTP status."""

    OK = "ok"
    MISSING = "missing"  # no token at all (401)
    BAD = "bad"  # not a token of this server: malformed, or the MAC does not match (401)
    EXPIRED = "expired"  # a good token past its expiry (401)
    FORBIDDEN = "forbidden"  # a good token of another turn (403)

    @property
    def status(self) -> int:
        return {"ok": 200, "forbidden": 403}.get(self.value, 401)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text.isascii():
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, signed: str) -> bytes:
    return hmac.new(secret.encode("utf-8"), signed.encode("ascii"), hashlib.sha256).digest()


def issue(secret: str, response_id: str, expires: int) -> str:
    """A token for ``response_id`` valid until ``expires`` (Unix seconds)."""
    payload = json.dumps({"rid": response_id, "exp": int(expires)}, separators=(",", ":"),
                         ensure_ascii=True)
    signed = f"{VERSION}.{_b64(payload.encode('ascii'))}"
    return f"{signed}.{_b64(_mac(secret, signed))}"


def verify(secret: str, token: str | None, response_id: str, now: float) -> Verdict:
    """Whether ``token`` lets its bearer read ``response_id`` at time ``now``.

    Checked in this order: present, well formed with a matching MAC, not
    expired (an expiry equal to ``now`` is past), then for this turn."""
    if not token:
        return Verdict.MISSING
    version, _, rest = token.partition(".")
    payload_text, _, mac_text = rest.partition(".")
    if version != VERSION or not payload_text or not mac_text or not token.isascii():
        return Verdict.BAD
    # Compared as text: base64 leaves spare bits in its last character, and
    # a token has one spelling only.
    expected = _b64(_mac(secret, f"{version}.{payload_text}"))
    if not hmac.compare_digest(mac_text.encode("ascii"), expected.encode("ascii")):
        return Verdict.BAD
    try:  # signed by us: well formed unless the secret signed something else
        claims = json.loads(_unb64(payload_text))
        rid, expires = claims["rid"], claims["exp"]
    except (ValueError, binascii.Error, KeyError, TypeError):
        return Verdict.BAD
    if not isinstance(rid, str) or not isinstance(expires, int) or isinstance(expires, bool):
        return Verdict.BAD
    if expires <= now:
        return Verdict.EXPIRED
    if not hmac.compare_digest(rid.encode("utf-8", "surrogatepass"),
                               response_id.encode("utf-8", "surrogatepass")):
        return Verdict.FORBIDDEN
    return Verdict.OK

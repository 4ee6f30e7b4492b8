"""The watch page, ``GET /v1/turns/{response_id}/view``: a static page
(static/view.html) that follows the turn's event stream."""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from processor.serve.edge import SERVER, turn_of

_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)
_STYLE = re.compile(r"<style>(.*?)</style>", re.S)


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@dataclass(frozen=True)
class Page:
    """The watch page (static/view.html) and its Content-Security-Policy:
    only its own inline script and style run, and it talks only to this origin."""

    html: bytes
    policy: str

    @classmethod
    def load(cls) -> Page:
        text = (resources.files("processor.serve") / "static" / "view.html").read_text("utf-8")
        scripts = " ".join(_sha256(s) for s in _SCRIPT.findall(text))
        styles = " ".join(_sha256(s) for s in _STYLE.findall(text))
        policy = (f"default-src 'none'; script-src {scripts}; style-src {styles}; "
                  "connect-src 'self'; base-uri 'none'; form-action 'none'; "
                  "frame-ancestors 'none'")
        return cls(text.encode("utf-8"), policy)


PAGE = web.AppKey("page", Page)


async def view(request: web.Request) -> web.Response:
    """The page, also for a request the stream would refuse (a bad or expired
    token, a bad turn_id): then with the refusal's status, and the page says
    what happened in words, from its event stream's answer (one place for
    those words: the page, for a first load and a reconnect alike). The page
    holds no data of the turn: its stream is authorised on its own."""
    server = request.app[SERVER]
    status, headers = 200, {}
    try:
        turn = turn_of(request)
        server.authorize(request, turn.response_id)
    except web.HTTPException as refused:
        status = refused.status
        if "WWW-Authenticate" in refused.headers:
            headers["WWW-Authenticate"] = refused.headers["WWW-Authenticate"]
    page = request.app[PAGE]
    return web.Response(status=status, body=page.html, content_type="text/html",
                        charset="utf-8", headers={
        **headers,
        "Content-Security-Policy": page.policy,
        "Referrer-Policy": "no-referrer",  # the URL holds the token
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
    })

"""The watch page's SSE parser (the JavaScript in
processor/serve/static/view.html, run by Node.js) reads any stream, cut
into chunks anywhere, as ``processor.serve.sse.Parser`` (the
``EventSource`` reading of the HTML standard) does: the same events, each
with the same last id, and the same retry values. The page resumes from
that id, so this is what makes its resume exact."""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from support.node_clients import run

from processor.serve import sse

PAGE = Path(__file__).resolve().parents[2] / "processor" / "serve" / "static" / "view.html"

_value = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\0"),
                 max_size=12)
_line = st.one_of(
    st.builds(lambda v: "data:" + v, _value),
    st.builds(lambda v: "data: " + v, _value),
    st.builds(lambda v: "id: " + v, _value),
    st.builds(lambda v: "id:" + v, _value),
    st.builds(lambda n: f"retry: {n}", st.integers(0, 5000)),
    st.builds(lambda v: ": " + v, _value),  # a comment
    st.just("data"),  # a field without a colon
    st.just("retry: soon"),  # ignored
    st.just(""),  # dispatch
)


@st.composite
def _streams(draw: st.DrawFn) -> list[str]:
    """A stream's text (lines with any of the three line breaks) cut into chunks."""
    lines = draw(st.lists(_line, max_size=30))
    breaks = draw(st.lists(st.sampled_from(["\n", "\r", "\r\n"]), min_size=len(lines),
                           max_size=len(lines)))
    text = "".join(line + end for line, end in zip(lines, breaks, strict=True))
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def _python(chunks: list[str]) -> dict[str, Any]:
    parser = sse.Parser()
    events: list[list[str | None]] = []
    for chunk in chunks:
        events += [[item.data, item.last_event_id or None]
                   for item in parser.feed(chunk.encode()) if isinstance(item, sse.Event)]
    return {"events": events, "retry": parser.retry_ms}


# 60 streams per Node.js run; no shrinking (each step a run): the failing
# stream's chunks are in the assertion's message.
@settings(max_examples=20, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(st.lists(_streams(), min_size=60, max_size=60))
def test_the_pages_parser_reads_any_chunking_as_eventsource_does(cases: list[list[str]]) -> None:
    with tempfile.TemporaryDirectory() as where:
        path = Path(where) / "cases.json"
        path.write_text(json.dumps(cases))
        found = asyncio.run(run("view_parser.mjs", str(PAGE), str(path)))
    for chunks, page in zip(cases, found, strict=True):
        retries = page["retries"]
        assert {"events": page["events"], "retry": retries[-1] if retries else None} == \
            _python(chunks), chunks

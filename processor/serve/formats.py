"""How a stream's items are written: the worker's events as they are
(``Native``), or as AG-UI 1.0 events (``Agui``, ``?format=agui``).

Both put a seq on one SSE event at most, as its ``id:``, so a resume
(``Last-Event-ID``) is the same in both: every seq after it, once. Native
sends one event per seq; AG-UI a group per seq whose last event alone
carries the id. What has no seq of its own (the native ``merged``, AG-UI's
final ``MESSAGES_SNAPSHOT``) goes just before the terminal event without an
id, so a client cut off between the two gets both again. Pure: items in, SSE
frames out; the AG-UI rendering itself is ``processor.engine.agui``'s.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import msgspec

from processor.client import joining
from processor.client.turns import LiveEvent, MergedOutput, Snapshot, TurnRef
from processor.engine import agui
from processor.engine.agui_live import LiveRun
from processor.serve import sse
from processor.wire.outputs import Counts, Meta, Response, Status

FORMATS = ("native", "agui")

_response = msgspec.json.Decoder(Response)
_meta = msgspec.json.Decoder(Meta)
_encode = msgspec.json.Encoder().encode


class Format(Protocol):
    """Frames for one open stream, in the order they are written."""

    def fold(self, event: LiveEvent) -> None:
        """An event the client already has (before its resume id)."""

    def snapshot(self, snapshot: Snapshot, first: LiveEvent | None) -> list[bytes]:
        """A running turn's merge so far, for a client that has nothing
        (``first``: the turn's earliest event known, for its ids)."""

    def event(self, event: LiveEvent, merged: MergedOutput | None) -> list[bytes]:
        """One event not sent yet (``merged``: the turn's merged output, given
        with its terminal event when known)."""

    def gone(self, turn: TurnRef, merged: MergedOutput | None, status: str | None) -> list[bytes]:
        """A finished turn whose terminal event is no longer retained."""

    def notice(self, body: dict[str, Any]) -> bytes:
        """A notice of the server's (``dropped``) that has no seq."""


class Native:
    """The worker's events exactly as published (docs/serve.md, "The event stream")."""

    def fold(self, event: LiveEvent) -> None:
        pass

    def snapshot(self, snapshot: Snapshot, first: LiveEvent | None) -> list[bytes]:
        return [sse.frame(snapshot.data, id=str(snapshot.seq))]

    def event(self, event: LiveEvent, merged: MergedOutput | None) -> list[bytes]:
        head = [sse.frame(merged.data)] if merged is not None and event.terminal else []
        return [*head, sse.frame(event.data, id=str(event.seq))]

    def gone(self, turn: TurnRef, merged: MergedOutput | None, status: str | None) -> list[bytes]:
        notice = json.dumps({"type": "gone", "response_id": turn.response_id, "status": status})
        return [*([sse.frame(merged.data)] if merged else []),
                sse.frame(notice, id=str(joining.GONE_ID))]

    def notice(self, body: dict[str, Any]) -> bytes:
        return sse.frame(json.dumps(body))


class Agui:
    """AG-UI 1.0 events (``processor.engine.agui_live.LiveRun``), for one
    connection: every connection is one AG-UI run, as a stock client
    (``HttpAgent``) sees a request. It starts with ``RUN_STARTED``: the
    turn's own (id 0) from its start, else one without an id and what is
    open at the client's point opened again; then, for a client that has
    nothing, the merge so far as ``--agui``'s run of it (the group's id: the
    snapshot's seq);
    then each worker event as a group of AG-UI events whose last one alone
    carries the seq; the terminal group ends with the merged response's
    ``MESSAGES_SNAPSHOT`` and ``RUN_FINISHED`` (``success``, ``cancelled``)
    or ``RUN_ERROR``. Server notices are ``CUSTOM`` events (``processor.*``).

    ``given``: the messages a client posted (``RunAgentInput.messages``):
    what it holds, which its snapshots keep (docs/serve.md, "AG-UI")."""

    def __init__(self, fresh: bool, given: list[dict[str, Any]] | None = None) -> None:
        self.live = LiveRun()
        self.needs_start = True  # this connection has no RUN_STARTED yet (fresh or not)
        self.resumed = not fresh
        self.given = given
        self.attached = False

    def fold(self, event: LiveEvent) -> None:
        self.live.fold(_decode(event))

    def snapshot(self, snapshot: Snapshot, first: LiveEvent | None) -> list[bytes]:
        self.live.forget_open()
        start = self._start(_decode(first) if first else None, snapshot.turn)
        body = self.live.join(_response.decode(snapshot.response), _bare_meta(snapshot.turn))
        return [*start, *_group(body, snapshot.seq)]

    def event(self, event: LiveEvent, merged: MergedOutput | None) -> list[bytes]:
        data = _decode(event)
        frames = self._start(data, None) if data.get("type") != "synthesis.started" else []
        self._attach()
        self.needs_start = False
        if event.terminal and merged is not None:
            reason = data.get("cancel_reason")
            group = self._finish(merged, reason if isinstance(reason, str) else None)
        else:
            group = self.live.event(data)
        return [*frames, *_group(group, event.seq)]

    def gone(self, turn: TurnRef, merged: MergedOutput | None, status: str | None) -> list[bytes]:
        if merged is not None:
            start = self._start(None, turn, _meta.decode(merged.meta))
            return [*start, *_group(self._finish(merged), None)]
        thread, run = agui.thread_and_run_of({}, turn.response_id, turn.key.synthesis_id())
        end = agui.ending(thread, run, status or "", None, None, None)
        return [*self._start(None, turn), *_group([*self.live.close(steps=True), end], None)]

    def notice(self, body: dict[str, Any]) -> bytes:
        kind = body.get("type", "notice")
        return _frame({"type": "CUSTOM", "name": f"processor.{kind}", "value": body})

    def _attach(self) -> None:
        if not self.attached:
            self.attached = True
            self.live.attach(self.given, self.resumed)

    def _finish(self, merged: MergedOutput, reason: str | None = None) -> list[dict[str, Any]]:
        status: Status = merged.status  # type: ignore[assignment]  # the worker wrote it
        return self.live.finish(_response.decode(merged.response), _meta.decode(merged.meta),
                                status, reason)

    def _start(self, first: dict[str, Any] | None, turn: TurnRef | None,
               meta: Meta | None = None) -> list[bytes]:
        """``RUN_STARTED`` (without an id) and what is open, opened again,
        when this connection has no ``RUN_STARTED`` yet."""
        if not self.needs_start:
            return []
        self.needs_start = False
        self._attach()
        if meta is not None:
            thread, run = agui.thread_and_run(meta)
            ts = meta.started_ms
        elif first is not None:
            thread, run = agui.thread_and_run_of(first, first["response_id"],
                                                 first["synthesis_id"])
            ts = first.get("ts")
        else:
            assert turn is not None
            thread, run = agui.thread_and_run_of({}, turn.response_id, turn.key.synthesis_id())
            ts = None
        body = {"type": "RUN_STARTED", "timestamp": ts, "threadId": thread, "runId": run,
                "protocolVersion": agui.PROTOCOL_VERSION}
        started = {k: v for k, v in body.items() if v is not None}
        return [_frame(e) for e in [started, *self.live.reopen()]]


def make(name: str, fresh: bool, given: list[dict[str, Any]] | None = None) -> Format:
    """The format ``?format=`` names (one of ``FORMATS``); ``given``: the
    messages an AG-UI client posted."""
    return Agui(fresh, given) if name == "agui" else Native()


def _decode(event: LiveEvent) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.json.decode(event.data)
    return data


def _frame(body: dict[str, Any], seq: int | None = None) -> bytes:
    return sse.frame(_encode(body), id=None if seq is None else str(seq))


def _group(events: list[dict[str, Any]], seq: int | None) -> list[bytes]:
    """One worker event's AG-UI events: only the last carries the seq (its
    SSE id, and ``rawEvent.seq`` for a client that sees events, not SSE
    ids), so a client that has the id has the whole group (docs/serve.md,
    "AG-UI")."""
    last = len(events) - 1
    return [_frame({**e, "rawEvent": {"seq": seq}} if i == last and seq is not None else e,
                   seq if i == last else None) for i, e in enumerate(events)]


def _bare_meta(turn: TurnRef) -> Meta:
    """A meta with only the turn's ids: enough to project a snapshot's messages."""
    return Meta(turn.response_id, turn.attempt_id or None, turn.key.synthesis_id(), {},
                Counts(), None, None, None, None)

"""An oracle for turns made by ``support.strategies``: ``check_deltas``.

Every delta token appears exactly once, in its message, in arrival order, and
the rest of docs/contract.md §4 holds (block order, ids, results after calls,
usage, finish reason). ``tokens`` lists the tokens of any JSON value.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from support.strategies import TOKEN


def tokens(value: Any) -> list[str]:
    """Every ``<n>`` token in a JSON value, in document order."""
    return TOKEN.findall(value if isinstance(value, str) else json.dumps(value))


@dataclass
class _Update:
    """What the oracle needs of one input update."""

    index: int
    group: tuple[str, Any]  # ("k", message_id) or ("r", run number)
    block: str  # the inner response block its message sits in
    own_block: str  # the inner response the update itself names
    streams: list[tuple[Any, list[str]]]  # (stream, tokens): "seq" or ("call", call_id)
    results: list[str] = field(default_factory=list)
    message_id: str | None = None
    role: str | None = None
    author: str | None = None


def _updates(entries: Iterable[dict[str, Any]], response_id: str) -> list[_Update]:
    """Group the turn's updates as docs/contract.md §4.3/§4.4 say: a message id is one
    message; an id-less run continues while the previous update was id-less,
    in the same inner response, with no role or author change (an unnamed role
    or author continues; a run that has not named its role yet is assistant).

    A function result never goes before its call (4.5): an id-less update
    answering a call that sits in a later inner-response block joins that
    block instead of its own.
    """
    out: list[_Update] = []
    first_seen: dict[str, int] = {}
    group_block: dict[tuple[str, Any], str] = {}
    call_block: dict[str, str] = {}
    run: tuple[int, str | None, str | None, str] | None = None  # number, role, author, block
    runs = 0
    for entry in entries:
        if entry.get("kind", "update") != "update":
            continue
        update = entry["update"]
        if isinstance(update, str):
            update = json.loads(update)
        inner = update.get("response_id")
        block = own = "" if not inner or inner == response_id else inner
        first_seen.setdefault(block, len(first_seen))
        role, author = update.get("role"), update.get("author_name")
        if update.get("message_id"):
            group: tuple[str, Any] = ("k", update["message_id"])
            run = None
        else:
            answered = [
                call_block[c["call_id"]]
                for c in update.get("contents", [])
                if c.get("type") == "function_result" and c.get("call_id") in call_block
            ]
            block = max([block, *answered], key=first_seen.__getitem__)
            if run is None or not (
                block == run[3]
                and (role is None or role == (run[1] or "assistant"))
                and (author is None or run[2] is None or author == run[2])
            ):
                run, runs = (runs, None, None, block), runs + 1
            run = (run[0], run[1] or role, run[2] or author, block)
            group = ("r", run[0])
        group_block.setdefault(group, block)
        parsed = _parse_update(len(out), group, (group_block[group], own), update)
        for stream, _ in parsed.streams:
            if isinstance(stream, tuple) and stream[1] is not None:
                call_block.setdefault(stream[1], group_block[group])
        out.append(parsed)
    return out


def _parse_update(
    index: int, group: tuple[str, Any], blocks: tuple[str, str], update: dict[str, Any]
) -> _Update:
    parsed = _Update(index, group, *blocks, [], message_id=update.get("message_id") or None,
                     role=update.get("role"), author=update.get("author_name"))
    for content in update.get("contents", []):
        kind = content.get("type")
        if kind == "function_call":
            stream = ("call", content.get("call_id"))
            parsed.streams.append((stream, tokens(content.get("arguments"))))
        elif kind == "function_result":
            parsed.results.extend(tokens(content))
        elif kind != "usage":
            parsed.streams.append(("seq", tokens(content)))
    return parsed


def _positions(response: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    """token -> (message index, content index, offset); each token once."""
    where: dict[str, tuple[int, int, int]] = {}
    for m, message in enumerate(response["messages"]):
        for c, content in enumerate(message["contents"]):
            for o, token in enumerate(tokens(content)):
                assert token not in where, f"token <{token}> appears twice"
                where[token] = (m, c, o)
    return where


def check_deltas(entries: list[dict[str, Any]], response: dict[str, Any]) -> None:
    """docs/contract.md §4 on a turn built by ``support.strategies``."""
    response_id = response["response_id"]
    updates = _updates(entries, response_id)
    where = _positions(response)
    sent = [t for u in updates for _, toks in u.streams for t in toks] + [
        t for u in updates for t in u.results
    ]
    assert sorted(sent, key=int) == sorted(where, key=int), "tokens lost or invented"
    home = _check_groups(updates, where, response)
    _check_names(updates, home, response)
    _check_ids(updates, response)
    _check_no_missed_fold(updates, home, response)
    _check_order(updates, home, response, response_id)
    _check_results_after_calls(response)
    _check_turn_fields(entries, response)


def _check_groups(
    updates: list[_Update], where: dict[str, tuple[int, int, int]], response: dict[str, Any]
) -> dict[tuple[str, Any], int]:
    """Each group's deltas live in one message, in arrival order; a call's
    chunks in one content; a folded id-less run sits in front of the keyed
    message it folded into."""
    home: dict[tuple[str, Any], int] = {}
    seq: dict[tuple[str, Any], list[str]] = defaultdict(list)
    calls: dict[tuple[tuple[str, Any], Any], list[str]] = defaultdict(list)
    for u in updates:
        for stream, toks in u.streams:
            target = seq[u.group] if stream == "seq" else calls[(u.group, stream)]
            target.extend(toks)
    for group, toks in [*seq.items(), *((g, t) for (g, _), t in calls.items())]:
        for token in toks:
            message = where[token][0]
            assert home.setdefault(group, message) == message, f"{group} split over messages"
    for group, toks in seq.items():
        spots = [where[t][1:] for t in toks]
        assert spots == sorted(spots), f"{group}: deltas out of arrival order"
    for (group, call), toks in calls.items():
        spots = [where[t] for t in toks]
        assert len({s[:2] for s in spots}) <= 1, f"{group}: call {call} split"
        assert spots == sorted(spots), f"{group}: call {call} chunks out of order"
    keyed_homes = [m for g, m in home.items() if g[0] == "k"]
    assert len(keyed_homes) == len(set(keyed_homes)), "two message ids merged into one message"
    for group, message in home.items():
        if group[0] == "k":
            assert response["messages"][message]["message_id"] == group[1], f"{group}: id"
    _check_folds(home, where, seq, calls)
    return home


def _check_names(
    updates: list[_Update], home: dict[tuple[str, Any], int], response: dict[str, Any]
) -> None:
    """A message's role and author are the first ones its updates name (role
    defaults to assistant); a folded message is its keyed message."""
    role: dict[tuple[str, Any], str] = {}
    author: dict[tuple[str, Any], str] = {}
    for u in updates:
        if u.role is not None:
            role.setdefault(u.group, u.role)
        if u.author is not None:
            author.setdefault(u.group, u.author)
    for index, message in enumerate(response["messages"]):
        groups = [g for g, m in home.items() if m == index]
        keyed = [g for g in groups if g[0] == "k"]
        if not keyed:
            assert len(groups) <= 1, f"id-less runs {groups} merged into one message"
        if not groups:
            continue
        group = keyed[0] if keyed else groups[0]
        assert message["role"] == role.get(group, "assistant"), f"{group}: role"
        assert message.get("author_name") == author.get(group), f"{group}: author"
        # Folding never mixes speakers: one role, at most one named author.
        assert {role.get(g, "assistant") for g in groups} == {message["role"]}, groups
        assert len({author[g] for g in groups if g in author}) <= 1, f"{groups}: authors"


def _check_folds(
    home: dict[tuple[str, Any], int],
    where: dict[str, tuple[int, int, int]],
    seq: dict[tuple[str, Any], list[str]],
    calls: dict[tuple[tuple[str, Any], Any], list[str]],
) -> None:
    spots: dict[tuple[str, Any], list[tuple[int, int]]] = defaultdict(list)
    for group, toks in seq.items():
        spots[group].extend(where[t][1:] for t in toks)
    for (group, _), toks in calls.items():
        spots[group].extend(where[t][1:] for t in toks)
    by_message: dict[int, list[tuple[str, Any]]] = defaultdict(list)
    for group, message in home.items():
        by_message[message].append(group)
    for groups in by_message.values():
        keyed = [g for g in groups if g[0] == "k"]
        if not keyed:
            continue
        first_keyed = min(spots[keyed[0]])
        for group in groups:
            if group[0] == "r":
                assert max(spots[group]) <= first_keyed, f"run {group} not folded in front"


def _check_no_missed_fold(
    updates: list[_Update], home: dict[tuple[str, Any], int], response: dict[str, Any]
) -> None:
    """Rule 4's exception: an id-less message right before a keyed message of
    the same role and author (or no author) is folded into it, so no such
    pair is left in the output. A keyed message's author counts the runs it
    already took in (it never takes in a second speaker)."""
    producer_ids = {u.message_id for u in updates if u.message_id}
    named: dict[tuple[str, Any], str] = {}
    for u in updates:
        if u.author is not None:
            named.setdefault(u.group, u.author)
    speaker: dict[int, str] = {}
    for group, message in home.items():
        if group in named:
            speaker.setdefault(message, named[group])
    messages = response["messages"]
    for i, (a, b) in enumerate(pairwise(messages)):
        if a["message_id"] in producer_ids or b["message_id"] not in producer_ids:
            continue
        authors = (a.get("author_name"), b.get("author_name") or speaker.get(i + 1))
        same_author = None in authors or authors[0] == authors[1]
        assert not (a["role"] == b["role"] and same_author), f"{a['message_id']} not folded"


def _check_ids(updates: list[_Update], response: dict[str, Any]) -> None:
    """A message carries a producer's id only if it holds something of that
    producer message: an assigned id never equals a producer id (rule 6).
    Ids are unique, and every producer message that holds anything is there
    under its id (a result moved after its call included)."""
    owner = {t: u.message_id for u in updates for _, toks in u.streams for t in toks}
    owner.update({t: u.message_id for u in updates for t in u.results})
    producer_ids = {u.message_id for u in updates if u.message_id}
    ids = [m["message_id"] for m in response["messages"]]
    assert len(ids) == len(set(ids)), f"message ids not unique: {ids}"
    holding = {u.message_id for u in updates if u.message_id and (u.streams or u.results)}
    assert holding <= set(ids), f"producer ids lost: {sorted(holding - set(ids))}"
    for message in response["messages"]:
        message_id = message["message_id"]
        if message_id in producer_ids:
            mine = [t for t in tokens(message["contents"]) if owner[t] == message_id]
            assert mine, f"message {message_id} holds nothing of that producer message"


def _check_order(
    updates: list[_Update],
    home: dict[tuple[str, Any], int],
    response: dict[str, Any],
    response_id: str,
) -> None:
    """Blocks contiguous in first-seen order; within a block, messages in the
    order their first update arrived (a folded message is where its keyed
    message is)."""
    first_seen: dict[str, int] = {}
    first_update: dict[tuple[str, Any], int] = {}
    for u in updates:
        first_seen.setdefault(u.own_block, len(first_seen))
        first_update.setdefault(u.group, u.index)
    blocks: list[str] = []
    for i in range(len(response["messages"])):
        inner = _inner(response, i)
        assert inner != response_id, "the turn's own id is not an inner response id"
        if not blocks or blocks[-1] != inner:
            blocks.append(inner)
    assert len(blocks) == len(set(blocks)), f"inner responses interleaved: {blocks}"
    assert blocks == sorted(blocks, key=first_seen.__getitem__), f"block order {blocks}"
    identity: dict[int, int] = {}
    for group, message in sorted(home.items(), key=lambda item: item[0][0] != "k"):
        identity.setdefault(message, first_update[group])
    per_block: dict[str, list[int]] = defaultdict(list)
    for message in sorted(identity):
        per_block[_inner(response, message)].append(identity[message])
    for block, arrivals in per_block.items():
        assert arrivals == sorted(set(arrivals)), f"block {block!r}: order {arrivals}"


def _inner(response: dict[str, Any], index: int) -> str:
    return response["messages"][index].get("additional_properties", {}).get("response_id", "")


def _check_results_after_calls(response: dict[str, Any]) -> None:
    calls: dict[str, tuple[int, int]] = {}
    for m, message in enumerate(response["messages"]):
        for c, content in enumerate(message["contents"]):
            if content["type"] == "function_call" and content.get("call_id"):
                calls.setdefault(content["call_id"], (m, c))
    for m, message in enumerate(response["messages"]):
        for c, content in enumerate(message["contents"]):
            if content["type"] == "function_result" and content.get("call_id") in calls:
                call = calls[content["call_id"]]
                assert call < (m, c), f"result of {content['call_id']} before its call"


def _check_turn_fields(entries: list[dict[str, Any]], response: dict[str, Any]) -> None:
    """Usage summed per counter (a ``replace`` usage resets what its inner
    response reported so far); finish_reason the last non-null one."""
    per_block: dict[str, dict[str, int]] = {}
    finish = None
    for entry in entries:
        update = entry.get("update")
        if not isinstance(update, dict):
            continue
        finish = update.get("finish_reason") or finish
        inner = update.get("response_id")
        block = "" if not inner or inner == response["response_id"] else inner
        for content in update.get("contents", []):
            if content.get("type") != "usage":
                continue
            details = content.get("usage_details") or {}
            if content.get("merge_mode") == "replace":
                per_block[block] = dict(details)
                continue
            mine = per_block.setdefault(block, {})
            for name, value in details.items():
                mine[name] = mine.get(name, 0) + value
    usage: dict[str, int] = {}
    for counters in per_block.values():
        for name, value in counters.items():
            usage[name] = usage.get(name, 0) + value
    assert (response.get("usage_details") or {}) == usage, "usage not summed per counter"
    assert response.get("finish_reason") == finish, "finish_reason is not the last one"

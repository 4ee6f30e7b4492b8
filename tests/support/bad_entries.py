"""Malformed input entries, each with the DLQ reason it must get and a piece
of the detail that names the field: the table the decode tests run through
``decode_entry`` (tests/ingest/test_decode.py) and ``decode_stream_entry``
(tests/ingest/test_decode_stream.py), with the builders they share."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from processor.ingest.decode import MAX_DEPTH

TEXT = {"type": "text", "text": "hi"}


def update_json(**fields: Any) -> bytes:
    return json.dumps({"contents": [TEXT], **fields}).encode()


def deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def entry(update: Any, **fields: Any) -> dict[str, Any]:
    """Stream fields as a worker reads them: bytes."""
    out = {"response_id": b"r1", **fields}
    if update is not None:
        out["update"] = update
    return out



# (name, fields, reason, a piece the detail must contain)
CASES: list[tuple[str, dict[Any, Any], str, str]] = [
    ("bad json", entry(b'{"contents": [{"type": "text"'), "bad_encoding", "'update'"),
    ("json garbage", entry(b"not json at all"), "bad_encoding", "'update'"),
    ("invalid utf-8 in update", entry(b'{"contents": [{"type": "text", "text": "\xff\xfe"}]}'),
     "bad_encoding", "'update'"),
    ("invalid utf-8 in a field", {b"response_id": b"r-\xff", b"update": update_json()},
     "bad_encoding", "'response_id'"),
    ("invalid utf-8 in kind", entry(update_json(), kind=b"\xc3"), "bad_encoding", "'kind'"),
    ("text not a string", entry(json.dumps({"contents": [{"type": "text", "text": 5}]})),
     "invalid_update", "$.update.contents[0].text"),
    ("contents not a list", entry(json.dumps({"contents": "nope"})),
     "invalid_update", "$.update.contents"),
    ("content not an object", entry(json.dumps({"contents": [TEXT, 7]})),
     "invalid_update", "$.update.contents[1]"),
    ("content without type", entry(json.dumps({"contents": [{"text": "x"}]})),
     "invalid_update", "$.update.contents[0]"),
    ("role not a string", entry(update_json(role=3)), "invalid_update", "$.update.role"),
    ("usage not an integer",
     entry(json.dumps({"contents": [{"type": "usage", "usage_details": {"input": 1.5}}]})),
     "invalid_update", "$.update.contents[0].usage_details"),
    ("properties not an object", entry(update_json(unknown=1, additional_properties=[])),
     "invalid_update", "$.update.additional_properties"),
    ("update is an array", entry(b"[1, 2]"), "invalid_update", "$.update"),
    ("update is a number", entry(b"5"), "invalid_update", "$.update"),
    ("update is a string", entry(b'"text"'), "invalid_update", "$.update"),
    ("update is null", entry(b"null"), "invalid_update", "$.update"),
    ("update missing", entry(None), "invalid_update", "'update'"),
    ("no turn key", {b"update": update_json()}, "missing_turn_key", "response_id"),
    ("empty turn key", {b"response_id": b"", b"update": update_json()},
     "missing_turn_key", "turn_id"),
    ("unknown kind", entry(update_json(), kind=b"explode"), "invalid_entry", "'kind'"),
    ("unknown encoding", entry(update_json(), enc=b"xml"), "bad_encoding", "'enc'"),
    ("id too long", entry(update_json(), attempt_id=b"a" * 600), "invalid_entry", "'attempt_id'"),
    ("msgpack garbage", entry(b"\xc1\xc1\xc1", enc=b"msgpack"), "bad_encoding", "msgpack"),
    ("msgpack truncated", entry(msgspec.msgpack.encode({"contents": [TEXT]})[:-3], enc=b"msgpack"),
     "bad_encoding", "msgpack"),
    ("msgpack not a map", entry(msgspec.msgpack.encode([1, 2]), enc=b"msgpack"),
     "invalid_update", "$.update"),
    ("msgpack extension type", entry(msgspec.msgpack.encode(
        {"contents": [{"type": "function_result", "call_id": "c",
                       "result": {"x": msgspec.msgpack.Ext(3, b"?")}}]}), enc=b"msgpack"),
     "invalid_update", "$.update.contents[0].result.x"),
    ("msgpack integer keys", entry(msgspec.msgpack.encode(
        {"contents": [{"type": "function_result", "call_id": "c", "result": {1: "one"}}]}),
        enc=b"msgpack"), "invalid_update", "$.update.contents[0].result"),
    ("integer too big to store", entry(
        b'{"contents": [{"type": "function_result", "call_id": "c", "result": [1, '
        + str(1 << 70).encode() + b"]}]}"),
     "invalid_update", "$.update.contents[0].result[1]"),
    ("usage too big to store", entry(
        b'{"contents": [{"type": "usage", "usage_details": {"n": ' + str(1 << 70).encode()
        + b"}}]}"), "invalid_update", "$.update.contents[0].usage_details.n"),
    ("usage past what JSON readers hold", entry(json.dumps({"contents": [
        {"type": "usage", "usage_details": {"input_token_count": 1, "output_token_count": 1 << 53}}
    ]})), "invalid_update",
     "$.update.contents[0].usage_details.output_token_count: a usage count must be an integer "
     "from 0 to 9007199254740991"),
    ("usage negative", entry(json.dumps({"contents": [
        {"type": "usage", "usage_details": {"input_token_count": -1}}]})),
     "invalid_update", "$.update.contents[0].usage_details.input_token_count"),
    ("usage of the largest uint64", entry(json.dumps({"contents": [
        {"type": "usage", "usage_details": {"n": (1 << 64) - 1}}]})),
     "invalid_update", "$.update.contents[0].usage_details.n"),
    ("usage nested in a result", entry(json.dumps({"contents": [
        {"type": "function_result", "call_id": "c",
         "items": [{"type": "usage", "usage_details": {"n": 1 << 60}}]}]})),
     "invalid_update", "$.update.contents[0].items[0].usage_details.n"),
    ("usage of the .NET shape", entry(json.dumps({"contents": [
        {"$type": "usage", "details": {"inputTokenCount": 1 << 53}}]})),
     "invalid_update", "usage_details.input_token_count"),
    ("nested deeper than allowed", entry(json.dumps(
        {"contents": [{"type": "function_result", "call_id": "c", "result": deep(MAX_DEPTH)}]})),
     "invalid_update", "$.update.contents[0].result[0]"),
    ("nested beyond the parser", entry(b'{"contents": [{"type": "text", "x": '
                                       + b"[" * 100_000 + b"]" * 100_000 + b"}]}"),
     "invalid_update", "nested deeper"),
    ("unknown field nested beyond the parser", entry(b'{"extra": ' + b"[" * 100_000
                                                     + b"]" * 100_000 + b"}"),
     "invalid_update", "nested deeper"),
    ("msgpack nested beyond the parser",
     entry(b"\x81\xa8contents" + b"\x91" * 100_000 + b"\xc0", enc=b"msgpack"),
     "invalid_update", "nested deeper"),
    ("nested content without type", entry(json.dumps({"contents": [
        {"type": "function_result", "call_id": "c", "items": [{"text": "x"}]}]})),
     "invalid_update", "$.update.contents[0].items[0].type"),
    ("nested content with a bad field", entry(json.dumps({"contents": [
        {"type": "function_approval_request", "id": "a",
         "function_call": {"type": "function_call", "call_id": 5}}]})),
     "invalid_update", "$.update.contents[0].function_call.call_id"),
    ("oversize", entry(update_json(), padding=b"x" * (1 << 20)), "too_large", "limit is 1048576"),
    ("oversize in UTF-8 bytes", {"response_id": "r1", "update": json.dumps(
        {"contents": [{"type": "text", "text": "é" * 600_000}]}, ensure_ascii=False)},
     "too_large", "limit is 1048576"),
    ("offline field of the wrong type", {"response_id": "r1", "kind": 5, "update": "{}"},
     "invalid_entry", "'kind'"),
    ("offline id of the wrong type", {"response_id": ["r1"], "update": "{}"},
     "invalid_entry", "'response_id'"),
    ("offline update of the wrong type", {"response_id": "r1", "update": 5},
     "invalid_update", "'update'"),
]

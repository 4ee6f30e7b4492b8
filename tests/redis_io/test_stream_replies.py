"""``connections.parse_stream_read``, the worker's parser of XREADGROUP
replies, gives exactly what redis-py's own callback gives: for any reply,
and for a real server's replies through a worker's client."""

from __future__ import annotations

from typing import Any

import redis.asyncio
from hypothesis import given
from hypothesis import strategies as st
from redis._parsers.helpers import parse_xread, parse_xread_resp3_to_resp2_legacy

from processor.redis_io.connections import (
    RedisOptions,
    connect,
    fast_stream_reads,
    parse_stream_read,
)

values = st.binary(max_size=6)
flat_fields = st.none() | st.lists(values, max_size=7)  # odd lengths and repeated names too
entry_ids = st.binary(min_size=1, max_size=5)
entries = st.lists(st.none() | st.tuples(entry_ids, flat_fields).map(list), max_size=6)
streams = st.dictionaries(st.binary(min_size=1, max_size=4), entries, max_size=3)
claimed = st.lists(st.none() | st.tuples(entry_ids, flat_fields, st.integers(), st.integers())
                   .map(list), max_size=6)


@given(streams)
def test_a_resp3_reply_parses_as_redis_py_parses_it(reply: dict[bytes, Any]) -> None:
    assert parse_stream_read(reply) == parse_xread_resp3_to_resp2_legacy(reply)


@given(streams)
def test_a_resp2_reply_parses_as_redis_py_parses_it(reply: dict[bytes, Any]) -> None:
    as_list = [[name, found] for name, found in reply.items()]
    assert parse_stream_read(as_list) == parse_xread(as_list)


@given(st.dictionaries(st.binary(min_size=1, max_size=4), claimed, max_size=3))
def test_a_claim_reply_keeps_its_extra_values(reply: dict[bytes, Any]) -> None:
    options = {"claim_min_idle_time": 1000}
    assert (parse_stream_read(reply, **options)
            == parse_xread_resp3_to_resp2_legacy(reply, **options))


async def test_a_workers_client_reads_what_a_plain_client_reads(
    redis_url: str, namespace: str
) -> None:
    stream = f"{{{namespace}:0}}:updates"
    plain = redis.asyncio.Redis.from_url(redis_url)
    fast = redis.asyncio.Redis.from_url(redis_url)
    fast_stream_reads(fast)
    try:
        await plain.xadd(stream, {"response_id": "r1", "update": "{}"})
        await plain.xadd(stream, {"response_id": "r1", "kind": "end", "attempt_id": "a"})
        deleted = await plain.xadd(stream, {"response_id": "r2", "update": "{}"})
        for name in ("g1", "g2"):
            await plain.xgroup_create(stream, name, id="0")
        expected = await plain.xreadgroup("g1", "c", {stream: ">"}, count=10)
        assert await fast.xreadgroup("g2", "c", {stream: ">"}, count=10) == expected
        assert len(expected[0][1]) == 3
        # Pending entries read again with id 0, one of them deleted meanwhile.
        await plain.xdel(stream, deleted)
        expected = await plain.xreadgroup("g1", "c", {stream: "0"})
        assert await fast.xreadgroup("g2", "c", {stream: "0"}) == expected
        assert expected[0][1][-1] == (deleted, {})
    finally:
        await plain.delete(stream)
        await plain.aclose()
        await fast.aclose()


async def test_the_workers_connection_parses_reads_with_it(redis_url: str) -> None:
    client = await connect(RedisOptions(redis_url))
    try:
        assert client.response_callbacks["XREADGROUP"] is parse_stream_read
    finally:
        await client.aclose()

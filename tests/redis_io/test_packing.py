"""``redis_io.packing``: a command packed by hiredis is the same bytes as
redis-py's own asyncio packer writes, for every kind of argument our calls
send; what hiredis does not take is packed (or refused) by redis-py as
before; and the worker's client, as ``connect`` makes it, packs with it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from processor.redis_io.connections import connect
from processor.redis_io.options import RedisOptions
from processor.redis_io.packing import packed_by_hiredis

_ARG = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",))),  # (what UTF-8 can encode)
    st.binary(),
    st.integers(),
    st.floats(allow_nan=False),
)
_NAME = st.sampled_from(["EVALSHA", "XADD", b"XACK", "CONFIG GET", b"CLIENT SETNAME", "hset"])


def _bytes(conn: Any, args: tuple[Any, ...]) -> bytes:
    return b"".join(bytes(part) for part in conn.pack_command(*args))


@given(_NAME, st.lists(_ARG, max_size=40))
def test_hiredis_packs_the_bytes_redis_py_packs(name: str | bytes, rest: list[Any]) -> None:
    args = (name, *rest)
    ours = packed_by_hiredis(Connection)()
    assert _bytes(ours, args) == _bytes(Connection(), args)


def test_what_hiredis_does_not_take_is_packed_or_refused_by_redis_py() -> None:
    ours, theirs = packed_by_hiredis(Connection)(), Connection()
    args = ("SET", "k", bytearray(b"value"))
    assert _bytes(ours, args) == _bytes(theirs, args)
    for bad in (None, True, object()):
        with pytest.raises(DataError):
            ours.pack_command("SET", "k", bad)
    for packer in (ours, theirs):  # (text UTF-8 cannot spell: refused alike)
        with pytest.raises(UnicodeEncodeError):
            packer.pack_command("SET", "k", "\ud800")


def test_each_kind_of_connection_keeps_its_kind() -> None:
    for cls in (Connection, SSLConnection, UnixDomainSocketConnection):
        packed = packed_by_hiredis(cls)
        assert issubclass(packed, cls) and packed is packed_by_hiredis(cls)


async def test_the_workers_client_packs_with_hiredis_and_a_long_call_round_trips(
    redis_url: str, namespace: str
) -> None:
    client = await connect(RedisOptions(redis_url))
    try:
        assert client.connection_pool.connection_class is packed_by_hiredis(Connection)
        script = client.register_script(
            "redis.call('SET', KEYS[1], ARGV[#ARGV]) return #ARGV")
        args: list[Any] = [f"a{i}" if i % 3 else i for i in range(2_999)] + ["é" * 10_000]
        assert await script(keys=[f"{namespace}:long"], args=args) == 3_000
        assert (await client.get(f"{namespace}:long")).decode() == "é" * 10_000
    finally:
        await client.aclose()

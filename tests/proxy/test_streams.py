from __future__ import annotations

import trio
import trio.testing

from mqproxy.streams import CountingStream, PrefixedStream


async def _prefixed_pair() -> tuple[PrefixedStream, PrefixedStream]:
    a, b = trio.testing.memory_stream_pair()
    return PrefixedStream(a), PrefixedStream(b)


async def _counting_pair() -> tuple[CountingStream, CountingStream]:
    a, b = trio.testing.memory_stream_pair()
    return CountingStream(a), CountingStream(b)


async def test_prefixed_stream_is_a_conforming_two_way_stream() -> None:
    await trio.testing.check_two_way_stream(_prefixed_pair, None)


async def test_counting_stream_is_a_conforming_two_way_stream() -> None:
    await trio.testing.check_two_way_stream(_counting_pair, None)


async def test_prefix_is_replayed_first_respecting_max_bytes() -> None:
    a, b = trio.testing.memory_stream_pair()
    stream = PrefixedStream(a, b"hello")
    await b.send_all(b" world")
    assert await stream.receive_some(3) == b"hel"
    assert stream.pending == b"lo"
    assert await stream.receive_some() == b"lo"
    assert await stream.receive_some() == b" world"


async def test_counting_stream_counts_both_directions() -> None:
    a, b = trio.testing.memory_stream_pair()
    counted = CountingStream(a)
    await counted.send_all(b"12345")
    assert await b.receive_some() == b"12345"
    await b.send_all(b"abc")
    assert await counted.receive_some() == b"abc"
    assert (counted.bytes_in, counted.bytes_out) == (3, 5)

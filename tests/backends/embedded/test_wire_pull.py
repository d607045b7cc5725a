"""A pull asked for as a remoting body (``wire=True``): the embedded store answers with the records
transcoded from its log, byte for byte what encoding the messages of an ordinary pull gives."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.record_shared import is_shared
from mqproxy.codecs.message_record import encode_records
from mqproxy.model.types import Message, PullStatus, TagFilter


def _message(n: int, **kw: object) -> Message:
    props = {"UNIQ_KEY": f"ID{n}", "TAGS": "a" if n % 2 else "b", "WAIT": "true"}
    return Message("T", b"m%d" % n, queue_id=0, properties=props, **kw)  # type: ignore[arg-type]


async def test_a_wire_pull_is_the_encoded_ordinary_pull(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path / "s") as store:
        await store.create_topic("T", 1)
        for n in range(40):
            await store.send(_message(n))
        wired = await store.pull("T", 0, 3, 32, wire=True)
        plain = await store.pull("T", 0, 3, 32)
        assert wired.records is not None
        assert plain.records is None
        assert wired.records.data == encode_records(plain.messages)
        assert (wired.status, wired.next_offset, wired.min_offset, wired.max_offset) == (
            PullStatus.FOUND, 35, 0, 40,
        )  # fmt: skip
        assert [m.body for m in wired.messages] == [m.body for m in plain.messages]  # decoded on demand
        small = await store.pull("T", 0, 0, 32, max_bytes=1, wire=True)  # past the first: within bytes
        assert (len(small.messages), small.next_offset) == (1, 1)
        # out of range and filtered pulls answer as before
        assert (await store.pull("T", 0, 40, 32, wire=True)).status is PullStatus.NO_NEW_MSG
        assert (await store.pull("T", 0, 99, 32, wire=True)).status is PullStatus.OFFSET_ILLEGAL
        tagged = await store.pull("T", 0, 0, 32, tag_filter=TagFilter(frozenset({"a"})), wire=True)
        assert tagged.records is None
        assert {m.properties["TAGS"] for m in tagged.messages} == {"a"}


async def test_records_the_fast_path_does_not_cover_take_the_ordinary_pull(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path / "s") as store:
        await store.create_topic("T", 1)
        await store.send(_message(0))
        await store.send(_message(1, born_host=("::1", 7)))  # an IPv6 born host
        wired = await store.pull("T", 0, 0, 32, wire=True)
        assert wired.records is None
        assert [m.born_host for m in wired.messages] == [("127.0.0.1", 0), ("::1", 7)]


async def test_a_handed_off_message_is_encoded_as_the_ordinary_pull_encodes_it(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path / "s") as store:
        await store.create_topic("T", 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.wait_for_message, "T", 0, 0, 30.0)
            await trio.testing.wait_all_tasks_blocked()
            await store.send(_message(0))
        assert len(store._handoff) == 1
        served = store._handoff.served
        wired = await store.pull("T", 0, 0, 32, wire=True)
        assert store._handoff.served == served + 1  # not read back from the log
        plain = await store.pull("T", 0, 0, 32)
        assert wired.records is not None
        assert wired.records.data == encode_records(plain.messages)


async def test_shared_records_are_pulled_as_the_ordinary_pull_gives_them(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path / "s") as store:
        await store.create_topic("T", 1)
        async with trio.open_nursery() as nursery:  # one coalesced append: the records share their fields
            for n in range(40):
                nursery.start_soon(store.send, Message("T", b"m%d" % n, queue_id=0, properties={"TAGS": "a"}))
        qid, _, _ = store._bounds("T", 0)
        payloads = [store._log.read(clo, size) for _, clo, size, _, _ in store._index.entries(qid, 0, 40)]
        assert sum(map(is_shared, payloads)) > 0
        store._handoff.clear()  # read back from the log, not handed off
        wired = await store.pull("T", 0, 0, 32, wire=True)
        plain = await store.pull("T", 0, 0, 32)
        assert [m.body for m in wired.messages] == [m.body for m in plain.messages]
        data = wired.records.data if wired.records is not None else encode_records(wired.messages)
        assert data == encode_records(plain.messages)

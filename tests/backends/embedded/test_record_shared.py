"""SHARED compact records (issue 18, round 4): a record whose born host, topic, LMQ names and properties
equal an earlier one's of the same append refers to it; it reads back the same, through pulls, message
ids, recovery (from any checkpoint, or with the index deleted) and retention moving it."""

from __future__ import annotations

import contextlib
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqproxy.backends.embedded.commitlog import frame
from mqproxy.backends.embedded.embedded import EmbeddedStore, open_embedded_store
from mqproxy.backends.embedded.index import Index
from mqproxy.backends.embedded.record_layout import MAX_BASE_BYTES
from mqproxy.backends.embedded.record_shared import is_shared
from mqproxy.backends.embedded.records import (
    KIND_COMPACT,
    SharedBases,
    decode_message,
    decode_moved,
    encode_message,
    expand_shared,
)
from mqproxy.backends.embedded.retention import DiskUsage, RetentionPolicy
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.types import Message

_MQTT = {"MQTT_TOPIC": "bench/disk", "MQTT_QOS": "1", "MQTT_CLIENT_ID": "pub"}
_DISPATCH = ("%LMQ%bench%disk", "%LMQ%bench%|23")


class _Buffer:
    """Frames appended back to back, as one append writes them; a :class:`BaseSource`."""

    def __init__(self) -> None:
        self.data = b""

    def add(self, payload: bytes) -> int:
        at = len(self.data)
        self.data += frame(payload)
        return at

    def payload_at(self, offset: int) -> bytes:
        (length,) = struct.unpack_from(">I", self.data, offset)
        return self.data[offset + 8 : offset + length]


def _fields(i: int, **changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "topic": "bench",
        "queue_id": 0,
        "queue_offset": i,
        "flag": 0,
        "sys_flag": 0,
        "born_timestamp_ms": 1_795_865_770_000 + i,
        "store_timestamp_ms": 1_795_865_770_100,
        "reconsume_times": 0,
        "born_host": ("127.0.0.1", 40000 + i),
        "lmqs": [(name, 100 + i) for name in _DISPATCH],
        "properties": dict(_MQTT),
        "body": b"%d" % i * 8,
        "lmq_properties": True,
    }
    fields.update(changes)
    return fields


def _check(record: Any, fields: dict[str, Any]) -> None:
    for name in ("topic", "queue_id", "queue_offset", "flag", "sys_flag", "born_timestamp_ms"):
        assert getattr(record, name) == fields[name]
    assert (record.store_timestamp_ms, record.reconsume_times, record.born_host, record.body) == (
        fields["store_timestamp_ms"],
        fields["reconsume_times"],
        fields["born_host"],
        fields["body"],
    )
    assert record.lmqs == tuple(fields["lmqs"])
    want = dict(fields["properties"])
    if fields["lmqs"] and fields.get("lmq_properties"):
        want["INNER_MULTI_DISPATCH"] = ",".join(n for n, _ in fields["lmqs"])
        want["INNER_MULTI_QUEUE_OFFSET"] = ",".join(str(o) for _, o in fields["lmqs"])
    assert list(record.properties.items()) == list(want.items())


def test_records_after_the_first_refer_to_it_and_read_back_the_same() -> None:
    shared, log = SharedBases(), _Buffer()
    sent = [_fields(i) for i in range(5)]
    sent.insert(
        2, _fields(9, properties={"MQTT_QOS": "1", "MQTT_TOPIC": "bench/disk", "MQTT_CLIENT_ID": "pub"})
    )
    sent.insert(4, _fields(10, flag=3, born_timestamp_ms=0, queue_offset=2**40))  # EXT, BORN_ABS, WIDE
    payloads = [encode_message(**f, shared=shared) for f in sent]
    offsets = [log.add(p) for p in payloads]
    assert [is_shared(p) for p in payloads] == [False, True, False, True, True, True, True]  # order matters
    plain = encode_message(**sent[1])
    # host 4, topic 6, LMQ names 21, properties 21 left out; a 1-byte reference in; LMQ offsets 1 byte each
    # (the difference from the base's) instead of 4
    assert (len(plain), len(payloads[1])) == (88, 31)
    for payload, offset, fields in zip(payloads, offsets, sent, strict=True):
        record = decode_message(payload, offset, log)
        _check(record, fields)
        whole = expand_shared(payload, offset, log)
        assert not is_shared(whole)
        assert decode_message(whole) == record
    with pytest.raises(StoreUnavailable):  # without the log holding its base
        decode_message(payloads[1])


def test_only_small_records_become_bases() -> None:
    shared = SharedBases()
    big = [encode_message(**_fields(i, body=bytes(MAX_BASE_BYTES)), shared=shared) for i in range(2)]
    assert [is_shared(p) for p in big] == [False, False]
    small = encode_message(**_fields(2), shared=shared)
    bigger = encode_message(**_fields(3, body=bytes(4 * MAX_BASE_BYTES)), shared=shared)
    assert (is_shared(small), is_shared(bigger)) == (False, True)


def test_a_send_that_failed_is_forgotten_as_a_base() -> None:
    shared = SharedBases()
    encode_message(**_fields(0), shared=shared)
    position = shared.position
    encode_message(**_fields(1, topic="other"), shared=shared)
    shared.rollback(position)
    assert not is_shared(encode_message(**_fields(2, topic="other"), shared=shared))
    assert is_shared(encode_message(**_fields(3), shared=shared))


_batch = st.lists(
    st.fixed_dictionaries(
        {
            "topic": st.sampled_from(["a", "b"]),
            "host": st.sampled_from(["127.0.0.1", "::1"]),
            "lmqs": st.sampled_from([(), ("%LMQ%a",), ("%LMQ%a", "plain"), ("%LMQ%a", "%LMQ%b", "%LMQ%c")]),
            "props": st.sampled_from([{}, {"k": "v"}, {"k": "v", "TAGS": "t"}, {"TAGS": "t", "k": "v"}]),
            "hint": st.sampled_from([True, False, None]),
            "offset": st.sampled_from([0, 5, 2**33]),
        }
    ),
    min_size=1,
    max_size=12,
)


@given(_batch)
def test_any_batch_reads_back(batch: list[dict[str, Any]]) -> None:
    shared, log = SharedBases(), _Buffer()
    sent = []
    for i, m in enumerate(batch):
        lmqs = [(name, m["offset"] + i) for name in m["lmqs"]]
        fields = _fields(
            i,
            topic=m["topic"],
            born_host=(m["host"], i),
            lmqs=lmqs,
            properties=dict(m["props"]),
            lmq_properties=m["hint"],
        )
        sent.append((log.add(encode_message(**fields, shared=shared)), fields))
    for offset, fields in sent:
        payload = log.payload_at(offset)
        record = decode_message(payload, offset, log)
        if fields["lmq_properties"] is None:
            fields = dict(fields, lmq_properties=False)
        _check(record, fields)


@given(st.binary(max_size=60), st.sampled_from([64, 68, 76, 100, 127]), st.binary(max_size=60))
def test_shared_decoder_only_raises_store_unavailable(data: bytes, bits: int, base: bytes) -> None:
    log = _Buffer()
    log.add(bytes((KIND_COMPACT, 4)) + base)
    log.add(encode_message(**_fields(0)))
    for offset in (-1, 0, 7, 40, 1 << 20):
        with contextlib.suppress(StoreUnavailable, struct.error):
            decode_message(bytes((KIND_COMPACT, bits)) + data, offset, log)


def _batch_of(n: int, topic: str = "bench", dispatch: tuple[str, ...] = _DISPATCH) -> list[Message]:
    return [
        Message(topic, b"m%d" % i, queue_id=0, properties=dict(_MQTT), dispatch=dispatch) for i in range(n)
    ]


async def _check_store(store: EmbeddedStore, n: int) -> None:
    for topic in ("bench", *_DISPATCH):
        got = await store.pull(topic, 0, 0, 64)
        assert [m.body for m in got.messages] == [b"m%d" % i for i in range(n)]
        for i, m in enumerate(got.messages):
            assert m.properties == dict(
                _MQTT, INNER_MULTI_DISPATCH=",".join(_DISPATCH), INNER_MULTI_QUEUE_OFFSET=f"{i},{i}"
            )
            assert await store.get_message(m.commitlog_offset) == m


def _shared_records(store: EmbeddedStore) -> int:
    return sum(is_shared(p) for _, _, p in store._log.iter_records(store._log.start))


async def test_a_batch_is_stored_shared_and_survives_reopen_and_rebuild(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.create_topic("bench", 1)
        await store.send_batch(_batch_of(20))
        assert _shared_records(store) == 19
        await _check_store(store, 20)
    async with open_embedded_store(tmp_path) as store:
        await _check_store(store, 20)
    shutil.rmtree(tmp_path / "index")
    async with open_embedded_store(tmp_path) as store:  # every queue re-dispatched from the log
        await _check_store(store, 20)


async def test_recovery_from_a_checkpoint_past_the_base(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.create_topic("bench", 1)
        results = await store.send_batch(_batch_of(10))
    index = Index(tmp_path / "index", map_size=1 << 24)
    # as if a crash came while recovery re-dispatched this append: the checkpoint lies past its base
    index.commit([], [], index.next_qid(), results[5].commitlog_offset, results[5].store_timestamp_ms)
    index.close()
    async with open_embedded_store(tmp_path) as store:
        await _check_store(store, 10)


async def test_retention_moves_a_shared_live_record_whole(tmp_path: Path) -> None:
    policy = RetentionPolicy(file_reserved_ms=0, delete_hours=None)
    opts: dict[str, Any] = {
        "segment_bytes": 4096,
        "retention": policy,
        "clean_interval_s": 3600.0,
        "disk_probe": lambda _: DiskUsage(total=100 << 30, free=90 << 30),
    }
    retained = ("%LMQ%|RETAINED",)  # a state queue: its records live on when their segment goes
    async with open_embedded_store(tmp_path, **opts) as store:
        await store.create_topic("bench", 1)
        sent = await store.send_batch(_batch_of(3, dispatch=retained))
        for _ in range(40):
            await store.send(Message("T", b"x" * 300, queue_id=0))
        assert await store.enforce_retention()
        assert store._log.start > sent[-1].commitlog_offset
        kept = await store.pull(retained[0], 0, 0, 10)
        assert [m.body for m in kept.messages] == [b"m0", b"m1", b"m2"]
        assert [m.commitlog_offset for m in kept.messages] == [r.commitlog_offset for r in sent]
        copies = [decode_moved(p) for _, _, p in store._log.iter_records(store._log.start)]
        assert [is_shared(c.payload) for c in copies if c is not None] == [False, False, False]
    async with open_embedded_store(tmp_path, **opts) as store:
        kept = await store.pull(retained[0], 0, 0, 10)
        assert [m.properties["INNER_MULTI_QUEUE_OFFSET"] for m in kept.messages] == ["0", "1", "2"]

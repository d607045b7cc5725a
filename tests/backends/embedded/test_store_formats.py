"""Stores written before issue 18 (kind 1 records, 24-byte consume-queue values) still open and read the
same, also once new (compact) records join them; the compact record and consume-queue value codecs."""

from __future__ import annotations

import contextlib
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqproxy.backends.embedded.cq_entry import (
    QID,
    pack_entry,
    pack_row,
    put_rows,
    unpack_entry,
    unpack_row,
)
from mqproxy.backends.embedded.embedded import EmbeddedStore, open_embedded_store
from mqproxy.backends.embedded.index import Index
from mqproxy.backends.embedded.records import KIND_COMPACT, decode_message, encode_message
from mqproxy.backends.embedded.sending import stored_properties
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.types import Message, StoredMessage

from .v1_store import MESSAGES  # type: ignore[import-not-found]

FIXTURES = Path(__file__).parent / "fixtures"
#: v1: kind 1 records, ``cq`` rows (before issue 18); v2: compact records without SHARED, ``cqd`` rows
#: (issue 18's round 3, main as of 3999a0c). Both written by ``v1_store.py``.
STORES = ("v1_store.tar.gz", "v2_store.tar.gz")


def unpack_fixture(tmp_path: Path, name: str = STORES[0]) -> tuple[Path, list[list[Any]]]:
    data_dir = tmp_path / "store"
    with tarfile.open(FIXTURES / name) as tar:
        tar.extractall(data_dir, filter="data")
    expected = json.loads((data_dir / "expected.json").read_text())
    (data_dir / "expected.json").unlink()
    return data_dir, expected


async def pull_one(store: EmbeddedStore, topic: str, queue_id: int, offset: int) -> StoredMessage:
    result = await store.pull(topic, queue_id, offset, 1)
    (message,) = result.messages
    return message


async def check_v1_messages(store: EmbeddedStore, expected: list[list[Any]]) -> None:
    for fields, (topic, queue_id, queue_offset, clo, store_ms, lmq_offsets) in zip(
        MESSAGES, expected, strict=True
    ):
        got = await pull_one(store, topic, queue_id, queue_offset)
        targets = tuple(fields.get("dispatch", ()))
        want_properties = stored_properties(fields["properties"], targets, [lmq_offsets[t] for t in targets])
        assert list(got.properties.items()) == list(want_properties.items())
        assert (got.commitlog_offset, got.store_timestamp_ms, got.body) == (clo, store_ms, fields["body"])
        assert (got.flag, got.sys_flag, got.reconsume_times) == (
            fields.get("flag", 0),
            fields.get("sys_flag", 0),
            fields.get("reconsume_times", 0),
        )
        assert (got.born_timestamp_ms, got.born_host) == (fields["born_timestamp_ms"], fields["born_host"])
        for name, offset in lmq_offsets.items():
            via_lmq = await pull_one(store, name, 0, offset)
            assert via_lmq.commitlog_offset == clo
        assert (await store.get_message(clo)) == got


@pytest.mark.parametrize("fixture", STORES)
async def test_store_written_before_opens_and_reads(tmp_path: Path, fixture: str) -> None:
    data_dir, expected = unpack_fixture(tmp_path, fixture)
    async with open_embedded_store(data_dir, segment_bytes=1 << 16) as store:
        await check_v1_messages(store, expected)
        # a new (compact) record joins the old ones in the same queues
        sent = await store.send(
            Message("bench", b"new", queue_id=0, properties={"MQTT_QOS": "1"}, dispatch=("%LMQ%bench%disk",))
        )
        assert (sent.queue_offset, sent.lmq_offsets) == (2, {"%LMQ%bench%disk": 2})
        lmq = await store.pull("%LMQ%bench%disk", 0, 0, 32)
        assert [m.body for m in lmq.messages] == [MESSAGES[1]["body"], b"second", b"new"]
        assert lmq.messages[2].properties == {
            "MQTT_QOS": "1",
            "INNER_MULTI_DISPATCH": "%LMQ%bench%disk",
            "INNER_MULTI_QUEUE_OFFSET": "2",
        }
    async with open_embedded_store(data_dir, segment_bytes=1 << 16) as store:  # reopened: same answers
        await check_v1_messages(store, expected)


@pytest.mark.parametrize("fixture", STORES)
async def test_index_rebuilt_from_old_records(tmp_path: Path, fixture: str) -> None:
    data_dir, expected = unpack_fixture(tmp_path, fixture)
    shutil.rmtree(data_dir / "index")  # recovery re-dispatches every kind 1 record
    async with open_embedded_store(data_dir, segment_bytes=1 << 16) as store:
        await check_v1_messages(store, expected)


_text = st.text(max_size=40)
_fields = st.fixed_dictionaries(
    {
        "topic": st.text("abcXYZ09_-%|", min_size=1, max_size=127),
        "queue_id": st.integers(0, 2**31 - 1),
        "queue_offset": st.integers(0, 2**63 - 1),
        "flag": st.integers(-(2**31), 2**31 - 1),
        "sys_flag": st.integers(-(2**31), 2**31 - 1),
        "born_timestamp_ms": st.integers(0, 2**62),
        "store_timestamp_ms": st.integers(0, 2**62),
        "reconsume_times": st.integers(-(2**31), 2**31 - 1),
        "born_host": st.tuples(
            st.sampled_from(["127.0.0.1", "10.1.2.3", "::1", "127.1", "host"]), st.integers(0, 65535)
        ),
        "lmqs": st.lists(
            st.tuples(st.sampled_from(["%LMQ%a/b", "%LMQ%x", "plain"]), st.integers(0, 2**63 - 1)), max_size=3
        ),
        "properties": st.dictionaries(
            st.sampled_from(["MQTT_TOPIC", "TAGS", "WAIT", "k", "\u00fc"]) | _text, _text, max_size=6
        ),
        "body": st.binary(max_size=300),
    }
)


@given(_fields, st.booleans())
def test_compact_record_round_trips_every_field(fields: dict[str, Any], add_lmq_properties: bool) -> None:
    if add_lmq_properties and fields["lmqs"]:
        names, offsets = zip(*fields["lmqs"], strict=True)
        fields["properties"] = stored_properties(fields["properties"], tuple(names), list(offsets))
    payload = encode_message(**fields)
    assert payload[0] == KIND_COMPACT
    record = decode_message(payload)
    for name in ("topic", "queue_id", "queue_offset", "flag", "sys_flag", "born_timestamp_ms"):
        assert getattr(record, name) == fields[name]
    assert (record.store_timestamp_ms, record.reconsume_times) == (
        fields["store_timestamp_ms"],
        fields["reconsume_times"],
    )
    assert (record.born_host, record.body, record.lmqs) == (
        fields["born_host"],
        fields["body"],
        tuple(fields["lmqs"]),
    )
    assert list(record.properties.items()) == list(fields["properties"].items())


def test_compact_record_is_small() -> None:
    properties = {"MQTT_TOPIC": "bench/disk", "MQTT_QOS": "1", "MQTT_CLIENT_ID": "disk-pub"}
    lmqs = [("%LMQ%bench%disk", 7), ("%LMQ%bench%|23", 7)]
    payload = encode_message(
        topic="bench",
        queue_id=0,
        queue_offset=7,
        flag=0,
        sys_flag=0,
        born_timestamp_ms=1_795_865_770_125,
        store_timestamp_ms=1_795_865_770_126,
        reconsume_times=0,
        born_host=("127.0.0.1", 37036),
        lmqs=lmqs,
        properties=stored_properties(properties, ("%LMQ%bench%disk", "%LMQ%bench%|23"), [7, 7]),
        body=bytes(64),
    )
    assert len(payload) == 149  # was 344 as a kind 1 record


@pytest.mark.parametrize(
    ("entry", "size"),
    [
        ((0, 100, 0, 1_795_865_770_126), 16),
        ((2**48 - 1, 2**32 - 1, 0xDEADBEEF, 2**48 - 1), 20),
        ((2**48, 5, 1, 1), 24),
        ((5, 5, 0, -1), 24),
    ],
)
def test_consume_queue_values(entry: tuple[int, int, int, int], size: int) -> None:
    value = pack_entry(*entry)
    assert len(value) == size
    assert unpack_entry(value) == entry


def test_consume_queue_rows_replace_instead_of_duplicating(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path), max_dbs=2, map_size=1 << 24)
    db = env.open_db(b"cqd", dupsort=True, dupfixed=True)
    key = QID.pack(7)
    with env.begin(write=True, db=db) as txn:
        cursor = txn.cursor()
        put_rows(cursor, [(key, pack_row(o, 100 + o, 10, 0, 5)) for o in range(3)])
        put_rows(cursor, [(key, pack_row(2, 999, 10, 0, 5)), (key, pack_row(3, 103, 10, 0, 5))])
        put_rows(cursor, [(key, pack_row(1, 555, 10, 1, 6))])
        cursor.set_key(key)
        rows = [unpack_row(v) for v in cursor.iternext_dup()]
    assert rows == [(0, 100, 10, 0, 5), (1, 555, 10, 1, 6), (2, 999, 10, 0, 5), (3, 103, 10, 0, 5)]
    env.close()


@given(st.binary(max_size=120), st.sampled_from([0, 4, 8, 16, 32, 36, 44, 63]))
def test_compact_decoder_only_raises_store_unavailable(data: bytes, bits: int) -> None:
    with contextlib.suppress(StoreUnavailable):
        decode_message(bytes((KIND_COMPACT, bits)) + data)


def test_consume_queue_look_ups_past_48_bit_offsets(tmp_path: Path) -> None:
    index = Index(tmp_path / "index", map_size=1 << 24)
    index.commit([(QID.pack(3), pack_row(o, 10 * o, 10, 0, 5)) for o in range(4)], [], 4, 40, 5)
    assert index.entries(3, 2**62, 10) == []
    assert index.entries(3, 2, 10) == [(2, 20, 10, 0, 5), (3, 30, 10, 0, 5)]
    assert index.entry(3, 2**63 - 1) is None
    assert index.next_offset(3) == 4
    assert index.rewrite(3, [3], 4, 9) == (4, 5)  # offsets 0-3 go, offset 3's record kept as offset 4
    assert index.entries(3, 0, 10) == [(4, 30, 10, 0, 9)]
    assert index.rewrite(3, [], 2**64 - 1, 10) == (5, 5)  # a floor past 48 bits empties the queue
    assert index.entries(3, 0, 10) == []
    index.close()

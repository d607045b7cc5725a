"""Pull bodies rewritten in place (:mod:`mqproxy.codecs.record_patch`): byte for byte what decoding,
changing the fields and re-encoding gives, or None whenever that would differ."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from mqproxy.codecs.message_record import encode_records
from mqproxy.codecs.record_patch import RecordBody, relocate_records
from mqproxy.model.types import StoredMessage

from ..conftest import stored_message  # type: ignore[import-not-found]

ADVERTISED = ("10.1.2.3", 9876)
#: (topic, real queue) -> client queue of the test's topic map
QUEUES = {("T", 0): 4, ("T", 1): 5, ("U", 2): 0}


def _msg(**overrides: object) -> StoredMessage:
    fields: dict[str, object] = dict(
        topic="T",
        queue_id=0,
        queue_offset=17,
        commitlog_offset=4096,
        body=b"hello",
        properties={"TAGS": "TagA", "UNIQ_KEY": "AB", "KEYS": "k1 k2"},
        born_timestamp_ms=1_700_000_000_000,
        born_host=("192.0.2.2", 54321),
        store_timestamp_ms=1_700_000_001_000,
        store_host=("127.0.0.1", 10911),
        reconsume_times=2,
        flag=7,
        sys_flag=0x2,
    )
    return stored_message(**(fields | overrides))


def _packed(offset: int) -> int:
    return 3 << 48 | offset


def _relocate(data: bytes, host: tuple[str, int] = ADVERTISED) -> bytes | None:
    return relocate_records(
        data, queue_id=lambda t, q: QUEUES.get((t, q)), commitlog_offset=_packed, store_host=host
    )


def _as_client(message: StoredMessage) -> StoredMessage:
    return dataclasses.replace(
        message,
        queue_id=QUEUES[message.topic, message.queue_id],
        commitlog_offset=_packed(message.commitlog_offset),
        store_host=ADVERTISED,
    )


def _with_prepared_offset(data: bytes, record_start: int, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(">q", out, record_start + 76, value)
    return bytes(out)


BATCH = [
    _msg(),
    _msg(queue_id=1, queue_offset=18, commitlog_offset=9_999_999, body=b"x" * 300, properties={}),
    _msg(topic="U", queue_id=2, commitlog_offset=1 << 40, body=b"z", properties={"A": "\u00e9t\u00e9"}),
]


@pytest.mark.parametrize("legacy", [True, False])
def test_relocated_body_is_the_reencoding_byte_for_byte(legacy: bool) -> None:
    body = encode_records(BATCH)
    second = len(encode_records(BATCH[:1]))
    body = _with_prepared_offset(body, second, 123456)  # a re-encoding writes 0
    patched = _relocate(body)
    assert patched is not None
    assert patched == encode_records([_as_client(m) for m in RecordBody(body).messages()], legacy=legacy)
    assert len(patched) == len(body)


def test_record_body_decodes_the_client_view() -> None:
    patched = _relocate(encode_records(BATCH))
    assert patched is not None
    got = RecordBody(patched).messages()
    assert [dataclasses.replace(m, store_size=0) for m in got] == [
        dataclasses.replace(_as_client(m), store_size=0, body_crc=g.body_crc)
        for m, g in zip(BATCH, got, strict=True)
    ]
    assert [m.store_host for m in got] == [ADVERTISED] * 3
    assert [m.queue_id for m in got] == [4, 5, 0]


def test_fields_land_at_their_positions() -> None:
    (patched,) = [_relocate(encode_records(BATCH[:1]))]
    assert patched is not None
    assert struct.unpack_from(">i", patched, 12) == (4,)
    assert struct.unpack_from(">q", patched, 28) == (_packed(4096),)
    assert patched[64:72] == bytes([10, 1, 2, 3]) + struct.pack(">i", 9876)
    assert struct.unpack_from(">q", patched, 76) == (0,)


def _zero_crc(data: bytes) -> bytes:
    out = bytearray(data)
    out[8:12] = b"\x00\x00\x00\x00"
    return bytes(out)


def _bad_properties(data: bytes) -> bytes:
    out = bytearray(data)
    out[-2] = 0xFF  # inside the properties string: not UTF-8
    return bytes(out)


@pytest.mark.parametrize(
    ("body", "host"),
    [
        pytest.param(encode_records([_msg(topic="T" * 128)]), ADVERTISED, id="v2-record"),
        pytest.param(
            encode_records([_msg(born_host=("2001:db8::1", 1))], legacy=False), ADVERTISED, id="v6-born"
        ),
        pytest.param(
            encode_records([_msg(store_host=("2001:db8::1", 1))], legacy=False), ADVERTISED, id="v6-store"
        ),
        pytest.param(_zero_crc(encode_records([_msg()])), ADVERTISED, id="crc-0"),
        pytest.param(encode_records([_msg()]), ("2001:db8::2", 9876), id="v6-advertised"),
        pytest.param(encode_records([_msg()]), ("node-a", 9876), id="hostname-advertised"),
        pytest.param(encode_records([_msg(queue_id=3)]), ADVERTISED, id="unmapped-queue"),
        pytest.param(encode_records([_msg(topic="V")]), ADVERTISED, id="unmapped-topic"),
        pytest.param(encode_records([_msg()])[:-1], ADVERTISED, id="truncated"),
        pytest.param(encode_records([_msg()]) + b"\x00\x00", ADVERTISED, id="trailing-bytes"),
        pytest.param(_bad_properties(encode_records([_msg()])), ADVERTISED, id="properties-not-utf8"),
    ],
)
def test_records_a_reencoding_would_change_are_left_to_the_decoder(
    body: bytes, host: tuple[str, int]
) -> None:
    assert _relocate(body, host) is None


def test_empty_body_stays_empty() -> None:
    assert _relocate(b"") == b""

"""Decoding remoting frames: golden frames from real clients, split at every offset, header kinds,
and chunks of any buffer type."""

from __future__ import annotations

import struct

import orjson
import pytest

from mqproxy.codecs.remoting import (
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RemotingCommand,
    decode_frame,
)
from mqproxy.codecs.remoting_codes import RequestCode

from .remoting_frames import (  # type: ignore[import-not-found]
    ALI_SEND_FRAME,
    BINARY_PULL_FRAME,
    CPP_SEND_FRAME,
    GOLDEN_FRAMES,
    JAVA_HEARTBEAT_FRAME,
    json_frame,
)


def test_golden_length_prefixes_are_consistent() -> None:
    for frame in GOLDEN_FRAMES:
        length, word = struct.unpack_from(">ii", frame)
        assert length == len(frame) - 4
        assert word & 0xFFFFFF <= length - 4


def test_cpp_send_message_numbers_become_strings() -> None:
    (cmd,) = FrameDecoder().receive_data(CPP_SEND_FRAME)
    assert cmd.code == RequestCode.SEND_MESSAGE
    assert cmd.language == "CPP"
    assert cmd.version == 63
    assert cmd.opaque == 0
    assert cmd.flag == 0
    assert cmd.remark == ""
    assert cmd.serialize_type == SERIALIZE_JSON
    assert cmd.body == b"hello from python-cpp"
    assert cmd.ext_fields["queueId"] == "2"
    assert cmd.ext_fields["defaultTopicQueueNums"] == "4"
    assert cmd.ext_fields["sysFlag"] == "0"
    assert cmd.ext_fields["bornTimestamp"] == "1700000000000"
    assert cmd.ext_fields["OnsChannel"] == "ALIYUN"
    assert cmd.ext_fields["AccessKey"] == ""
    assert cmd.ext_fields["properties"].startswith("KEYS\x01k1\x02TAGS\x01TagA\x02")
    assert all(type(v) is str for v in cmd.ext_fields.values())
    assert not cmd.is_response
    assert not cmd.is_oneway


def test_ali_ons_send_v2_booleans_and_numbers() -> None:
    (cmd,) = FrameDecoder().receive_data(ALI_SEND_FRAME)
    assert cmd.code == RequestCode.SEND_MESSAGE_V2
    assert cmd.opaque == 1
    assert cmd.version == 121
    assert cmd.remark is None
    assert cmd.body == b"hello"
    assert cmd.ext_fields == {
        "a": "PG",
        "b": "T",
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "i": "TAGS\x01TagA\x02KEYS\x01k1\x02",
        "j": "0",
        "k": "false",
    }


def test_java_heartbeat_without_ext_fields() -> None:
    (cmd,) = FrameDecoder().receive_data(JAVA_HEARTBEAT_FRAME)
    assert cmd.code == RequestCode.HEART_BEAT
    assert cmd.ext_fields == {}
    assert cmd.remark is None
    assert cmd.version == 401
    assert orjson.loads(cmd.body)["clientID"] == "192.0.2.2@4242#1"


def test_binary_header_pull() -> None:
    (cmd,) = FrameDecoder().receive_data(BINARY_PULL_FRAME)
    assert cmd == RemotingCommand(
        code=11,
        opaque=7,
        flag=0,
        language="JAVA",
        version=401,
        remark=None,
        ext_fields={"consumerGroup": "G", "topic": "T", "queueId": "0"},
        body=b"",
        serialize_type=SERIALIZE_ROCKETMQ,
    )


@pytest.mark.parametrize("frame", GOLDEN_FRAMES, ids=["cpp", "ali-ons", "java-heartbeat", "binary"])
def test_golden_frame_split_at_every_offset(frame: bytes) -> None:
    (expected,) = FrameDecoder().receive_data(frame)
    for cut in range(len(frame) + 1):
        decoder = FrameDecoder()
        first = decoder.receive_data(frame[:cut])
        assert decoder.buffered == (cut if cut < len(frame) else 0)
        second = decoder.receive_data(frame[cut:])
        assert first + second == [expected]
        assert decoder.buffered == 0


def test_byte_at_a_time_and_all_in_one_chunk() -> None:
    stream = b"".join(GOLDEN_FRAMES) * 2
    expected = FrameDecoder().receive_data(stream)
    assert [c.code for c in expected] == [10, 310, 34, 11] * 2
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    for i in range(len(stream)):
        got += decoder.receive_data(stream[i : i + 1])
    assert got == expected


def test_language_as_ordinal_and_unknown() -> None:
    cmd = decode_frame(json_frame(b'{"code":34,"language":9,"opaque":5}')[4:])
    assert cmd.language == "GO"
    cmd = decode_frame(json_frame(b'{"code":34,"language":"COBOL"}')[4:])
    assert cmd.language == "OTHER"
    cmd = decode_frame(json_frame(b'{"code":34}')[4:])
    assert (cmd.language, cmd.opaque, cmd.flag, cmd.version) == ("JAVA", 0, 0, 0)


def test_ext_field_value_kinds() -> None:
    header = b'{"code":11,"extFields":{"n":-1,"t":true,"x":null,"f":1.5,"g":2.0,"o":{"a":[1]},"s":"v"}}'
    cmd = decode_frame(json_frame(header)[4:])
    assert cmd.ext_fields == {"n": "-1", "t": "true", "f": "1.5", "g": "2", "o": '{"a":[1]}', "s": "v"}


def test_numeric_string_code_and_whitespace() -> None:
    cmd = decode_frame(json_frame(b' {"code":"105","opaque":"3","extFields":null} \r\n\t')[4:])
    assert (cmd.code, cmd.opaque, cmd.ext_fields) == (105, 3, {})


# --- sans-IO discipline ------------------------------------------------------------------------------

_FORBIDDEN = {"trio", "socket", "ssl", "time", "asyncio"}


def test_accepts_bytearray_and_memoryview_chunks() -> None:
    stream = bytearray(b"".join(GOLDEN_FRAMES))
    expected = FrameDecoder().receive_data(bytes(stream))
    decoder = FrameDecoder()
    got = decoder.receive_data(memoryview(stream)[:100])
    got += decoder.receive_data(bytearray(stream[100:300]))
    tail = bytearray(stream[300:])
    got += decoder.receive_data(tail)
    tail[:] = b"\x00" * len(tail)  # the caller reusing its buffer must not change decoded commands
    assert got == expected

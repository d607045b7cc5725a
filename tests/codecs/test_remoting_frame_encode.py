"""Encoding remoting commands: golden responses, both header serializations, limits, round trips."""

from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs.remoting import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RemotingCodecError,
    RemotingCommand,
    decode_frame,
    encode_command,
)
from mqproxy.codecs.remoting_codes import LanguageCode, RequestCode, ResponseCode

from .remoting_frames import BINARY_PULL_FRAME  # type: ignore[import-not-found]

# --- encoding ----------------------------------------------------------------------------------------

#: The send response a Java broker emits (remoting.md §1.2), as this codec writes it.
SEND_RESPONSE_FRAME = (
    b"\x00\x00\x01\x02\x00\x00\x00\xfe"
    b'{"code":0,"extFields":{"msgId":"7F00000100004DC30000000000000000","queueId":"2","queueOffset":"17",'
    b'"transactionId":"U1","MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"flag":1,"language":"JAVA",'
    b'"opaque":42,"serializeTypeCurrentRPC":"JSON","version":479}'
)


def test_encode_golden_send_response() -> None:
    request = RemotingCommand(code=310, opaque=42, language="CPP", version=333)
    response = RemotingCommand.response_to(
        request,
        ResponseCode.SUCCESS,
        ext_fields={
            "msgId": "7F00000100004DC30000000000000000",
            "queueId": "2",
            "queueOffset": "17",
            "transactionId": "U1",
            "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
        },
    )
    assert encode_command(response) == SEND_RESPONSE_FRAME


def test_encode_remark_and_body() -> None:
    cmd = RemotingCommand(code=3, opaque=-5, flag=FLAG_RESPONSE, remark=" request type 999 not supported")
    frame = encode_command(cmd)
    header = frame[8 : 8 + struct.unpack_from(">i", frame, 4)[0]]
    assert header == (
        b'{"code":3,"extFields":{},"flag":1,"language":"JAVA","opaque":-5,'
        b'"remark":" request type 999 not supported","serializeTypeCurrentRPC":"JSON","version":479}'
    )


def test_encode_coerces_non_string_ext_values() -> None:
    cmd = RemotingCommand(code=0, ext_fields={"queueId": 3, "ok": True, "gone": None, "s": "x"})  # type: ignore[dict-item]
    frame = encode_command(cmd)
    header = orjson.loads(frame[8 : 8 + struct.unpack_from(">i", frame, 4)[0]])
    assert header["extFields"] == {"queueId": "3", "ok": "true", "s": "x"}


def test_response_to_keeps_opaque_and_serialize_type() -> None:
    request = RemotingCommand(code=11, opaque=77, flag=0, serialize_type=SERIALIZE_ROCKETMQ)
    response = RemotingCommand.response_to(request, ResponseCode.PULL_NOT_FOUND, remark="NO_NEW_MSG")
    assert (response.opaque, response.flag, response.serialize_type) == (
        77,
        FLAG_RESPONSE,
        SERIALIZE_ROCKETMQ,
    )
    assert response.is_response
    assert not response.is_oneway
    assert response.ext_fields == {}
    frame = encode_command(response)
    assert frame[4] == SERIALIZE_ROCKETMQ
    (decoded,) = FrameDecoder().receive_data(frame)
    assert decoded.code == ResponseCode.PULL_NOT_FOUND
    assert decoded.remark == "NO_NEW_MSG"
    assert decoded.opaque == 77


def test_binary_falls_back_to_json_for_wide_codes() -> None:
    cmd = RemotingCommand(code=RequestCode.POP_MESSAGE, opaque=1, serialize_type=SERIALIZE_ROCKETMQ)
    frame = encode_command(cmd)
    assert frame[4] == SERIALIZE_JSON
    assert decode_frame(frame[4:]).code == 200050


def test_encode_binary_golden() -> None:
    cmd = RemotingCommand(
        code=11,
        opaque=7,
        version=401,
        ext_fields={"consumerGroup": "G", "topic": "T", "queueId": "0"},
        serialize_type=SERIALIZE_ROCKETMQ,
    )
    assert encode_command(cmd) == BINARY_PULL_FRAME


def test_encode_language_enum_and_ordinal() -> None:
    for language in (LanguageCode.GO, 9):
        cmd = RemotingCommand(code=34, language=language)  # type: ignore[arg-type]
        assert decode_frame(encode_command(cmd)[4:]).language == "GO"
        cmd.serialize_type = SERIALIZE_ROCKETMQ
        assert decode_frame(encode_command(cmd)[4:]).language == "GO"


def test_encode_rejects_oversized_frame() -> None:
    cmd = RemotingCommand(code=0, body=b"\x00" * 100)
    with pytest.raises(RemotingCodecError) as info:
        encode_command(cmd, max_frame_bytes=64)
    assert info.value.reason == "frame_too_large"


@pytest.mark.parametrize(
    "cmd",
    [
        RemotingCommand(code=2**70),
        RemotingCommand(code=0, ext_fields={"k": object()}),  # type: ignore[dict-item]
        RemotingCommand(code=0, ext_fields={1: "v"}),  # type: ignore[dict-item]
        RemotingCommand(code=0, ext_fields={1: "v"}, serialize_type=SERIALIZE_ROCKETMQ),  # type: ignore[dict-item]
        RemotingCommand(code=0, ext_fields={"k" * 40000: "v"}, serialize_type=SERIALIZE_ROCKETMQ),
        RemotingCommand(code=0, body="text"),  # type: ignore[arg-type]
        RemotingCommand(code="0"),  # type: ignore[arg-type]
        RemotingCommand(code=0, remark=b"bytes", serialize_type=SERIALIZE_ROCKETMQ),  # type: ignore[arg-type]
    ],
)
def test_encode_rejects_unencodable_command(cmd: RemotingCommand) -> None:
    with pytest.raises(RemotingCodecError) as info:
        encode_command(cmd)
    assert info.value.reason == "bad_command"


SAMPLE_COMMANDS = [
    RemotingCommand(code=0),
    RemotingCommand(code=105, opaque=2**31 - 1, ext_fields={"topic": "T"}, version=401),
    RemotingCommand(
        code=17, opaque=-(2**31), flag=FLAG_RESPONSE, remark="topic not exist, 主题", body=b"\x00\xff"
    ),
    RemotingCommand(
        code=15, flag=FLAG_ONEWAY, language="CPP", ext_fields={"k": "v\x01\x02", "ключ": "значение"}
    ),
    RemotingCommand(code=1500, flag=FLAG_RESPONSE, remark="please go away", body=b"x" * 70000),
]


@pytest.mark.parametrize("serialize_type", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ])
@pytest.mark.parametrize("cmd", SAMPLE_COMMANDS)
def test_round_trip(cmd: RemotingCommand, serialize_type: int) -> None:
    cmd = RemotingCommand(**{s: getattr(cmd, s) for s in RemotingCommand.__slots__})  # type: ignore[attr-defined]
    cmd.serialize_type = serialize_type
    (decoded,) = FrameDecoder().receive_data(encode_command(cmd))
    assert decoded == cmd


_text = st.text(max_size=20)


@settings(max_examples=100, deadline=None)
@given(
    code=st.integers(-(2**15), 2**15 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    language=st.sampled_from([m.name for m in LanguageCode]),
    version=st.integers(0, 2**15 - 1),
    remark=st.none() | st.text(min_size=1, max_size=20),
    ext=st.dictionaries(_text, _text.filter(bool), max_size=6),
    body=st.binary(max_size=64),
    serialize_type=st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]),
)
def test_round_trip_property(
    code: int,
    opaque: int,
    flag: int,
    language: str,
    version: int,
    remark: str | None,
    ext: dict[str, str],
    body: bytes,
    serialize_type: int,
) -> None:
    cmd = RemotingCommand(code, opaque, flag, language, version, remark, ext, body, serialize_type)
    (decoded,) = FrameDecoder().receive_data(encode_command(cmd))
    assert decoded == cmd


def test_binary_empty_value_and_empty_remark() -> None:
    cmd = RemotingCommand(code=1, remark="", ext_fields={"empty": ""}, serialize_type=SERIALIZE_ROCKETMQ)
    decoded = decode_frame(encode_command(cmd)[4:])
    assert decoded.remark is None  # length 0 means null in the binary header
    assert decoded.ext_fields == {"empty": ""}

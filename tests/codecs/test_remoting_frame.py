from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs.remoting import (
    DEFAULT_MAX_FRAME_BYTES,
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

# --- golden frames (remoting-clients.md §3 fingerprints) ---------------------------------------------

#: rocketmq 0.4.4 (C++ core): SEND_MESSAGE (10), long keys, ints as JSON numbers, remark "", ONS keys,
#: jsoncpp's trailing "\n".
CPP_SEND_HEADER = (
    b'{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"c2lnbmF0dXJl",'
    b'"batch":"false","bornTimestamp":"1700000000000","defaultTopic":"TBW102","defaultTopicQueueNums":4,'
    b'"flag":0,"producerGroup":"PG","properties":"KEYS\\u0001k1\\u0002TAGS\\u0001TagA\\u0002UNIQ_KEY'
    b'\\u00010100007F00002A9F0000000000000000\\u0002WAIT\\u0001true\\u0002",'
    b'"queueId":2,"reconsumeTimes":"0","sysFlag":0,"topic":"T","unitMode":"false"},'
    b'"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}\n'
)
CPP_SEND_FRAME = b"\x00\x00\x01\xfb" + b"\x00\x00\x01\xe2" + CPP_SEND_HEADER + b"hello from python-cpp"

#: ali-ons 3.12: SEND_MESSAGE_V2 (310), keys a..k, numbers and a boolean, no remark.
ALI_SEND_HEADER = (
    b'{"code":310,"language":"JAVA","opaque":1,"flag":0,"version":121,"extFields":{"a":"PG","b":"T",'
    b'"c":"TBW102","d":4,"e":0,"f":0,"g":1700000000000,"h":0,'
    b'"i":"TAGS\\u0001TagA\\u0002KEYS\\u0001k1\\u0002","j":0,"k":false}}'
)
ALI_SEND_FRAME = b"\x00\x00\x00\xdc" + b"\x00\x00\x00\xd3" + ALI_SEND_HEADER + b"hello"

#: Java 4.9.4: HEART_BEAT (34) with no extFields key at all, JSON body.
JAVA_HEARTBEAT_HEADER = (
    b'{"code":34,"flag":0,"language":"JAVA","opaque":0,"serializeTypeCurrentRPC":"JSON","version":401}'
)
JAVA_HEARTBEAT_BODY = (
    b'{"clientID":"192.0.2.2@4242#1","consumerDataSet":[],"producerDataSet":[{"groupName":"PG"}]}'
)
JAVA_HEARTBEAT_FRAME = b"\x00\x00\x00\xbf" + b"\x00\x00\x00\x60" + JAVA_HEARTBEAT_HEADER + JAVA_HEARTBEAT_BODY

#: Java with -Drocketmq.serialize.type=ROCKETMQ: PULL_MESSAGE (11), binary header, no body.
BINARY_PULL_FRAME = bytes.fromhex(
    "00000047"  # length = 4 + 67
    "01000043"  # serialize type 1, header length 67
    "000b"  # code 11
    "00"  # language JAVA
    "0191"  # version 401
    "00000007"  # opaque 7
    "00000000"  # flag 0
    "00000000"  # remark length 0 -> None
    "0000002e"  # extFields: 46 bytes
    "000d"
    + b"consumerGroup".hex()
    + "00000001"
    + b"G".hex()
    + "0005"
    + b"topic".hex()
    + "00000001"
    + b"T".hex()
    + "0007"
    + b"queueId".hex()
    + "00000001"
    + b"0".hex()
)

GOLDEN_FRAMES = [CPP_SEND_FRAME, ALI_SEND_FRAME, JAVA_HEARTBEAT_FRAME, BINARY_PULL_FRAME]


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
    cmd = decode_frame(_json_frame(b'{"code":34,"language":9,"opaque":5}')[4:])
    assert cmd.language == "GO"
    cmd = decode_frame(_json_frame(b'{"code":34,"language":"COBOL"}')[4:])
    assert cmd.language == "OTHER"
    cmd = decode_frame(_json_frame(b'{"code":34}')[4:])
    assert (cmd.language, cmd.opaque, cmd.flag, cmd.version) == ("JAVA", 0, 0, 0)


def test_ext_field_value_kinds() -> None:
    header = b'{"code":11,"extFields":{"n":-1,"t":true,"x":null,"f":1.5,"g":2.0,"o":{"a":[1]},"s":"v"}}'
    cmd = decode_frame(_json_frame(header)[4:])
    assert cmd.ext_fields == {"n": "-1", "t": "true", "f": "1.5", "g": "2", "o": '{"a":[1]}', "s": "v"}


def test_numeric_string_code_and_whitespace() -> None:
    cmd = decode_frame(_json_frame(b' {"code":"105","opaque":"3","extFields":null} \r\n\t')[4:])
    assert (cmd.code, cmd.opaque, cmd.ext_fields) == (105, 3, {})


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


def test_binary_empty_value_and_empty_remark() -> None:
    cmd = RemotingCommand(code=1, remark="", ext_fields={"empty": ""}, serialize_type=SERIALIZE_ROCKETMQ)
    decoded = decode_frame(encode_command(cmd)[4:])
    assert decoded.remark is None  # length 0 means null in the binary header
    assert decoded.ext_fields == {"empty": ""}


# --- bad input ---------------------------------------------------------------------------------------


def _json_frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), serialize_type << 24 | len(header)) + header + body


def _reason(data: bytes, **kwargs: int) -> str:
    decoder = FrameDecoder(**kwargs)
    with pytest.raises(RemotingCodecError) as info:
        decoder.receive_data(data)
    return info.value.reason


def test_2gib_prefix_fails_on_first_four_bytes() -> None:
    decoder = FrameDecoder()
    assert decoder.receive_data(b"\x7f\xff") == []
    with pytest.raises(RemotingCodecError) as info:
        decoder.receive_data(b"\xff\xff")
    assert info.value.reason == "frame_too_large"
    assert decoder.buffered == 0


def test_negative_length() -> None:
    assert _reason(b"\x80\x00\x00\x00") == "bad_frame_length"
    assert _reason(b"\xff\xff\xff\xff\x00\x00\x00\x00") == "bad_frame_length"


def test_length_below_header_word() -> None:
    assert _reason(b"\x00\x00\x00\x03abc") == "bad_frame_length"


def test_header_length_past_frame() -> None:
    assert _reason(b"\x00\x00\x00\x08\x00\x00\x00\x05{}{}") == "bad_header_length"
    assert _reason(b"\x00\x00\x00\x04\x00\xff\xff\xff") == "bad_header_length"


def test_20mib_frame_with_16mib_limit() -> None:
    body = b"\x00" * (20 * 1024 * 1024)
    frame = _json_frame(b'{"code":10}', body)
    decoder = FrameDecoder(max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
    with pytest.raises(RemotingCodecError) as info:
        decoder.receive_data(frame[:4])
    assert info.value.reason == "frame_too_large"
    assert _reason(frame) == "frame_too_large"


def test_frame_exactly_at_limit_is_accepted() -> None:
    frame = _json_frame(b'{"code":10}', b"b" * 100)
    assert len(FrameDecoder(max_frame_bytes=len(frame)).receive_data(frame)) == 1
    assert _reason(frame, max_frame_bytes=len(frame) - 1) == "frame_too_large"


@pytest.mark.parametrize(
    "header",
    [
        b'{"code":10,"extFields":{"a":"b"}',  # truncated
        b"",  # empty
        b'[{"code":10}]',  # not an object
        b'"code"',
        b'{"code":10,"remark":"\xff\xfe"}',  # invalid UTF-8
        b'{"code":10,"remark":"\xed\xa0\x80"}',  # UTF-8 encoded surrogate
        b"\xef\xbb\xbf{}",  # BOM
        b'{"opaque":1}',  # no code
        b'{"code":"ten"}',
        b'{"code":1.5}',
        b'{"code":true}',
        b'{"code":4294967296}',
        b'{"code":10,"extFields":[]}',
        b'{"code":10,"extFields":"a=b"}',
        b'{"code":10,"remark":["x"]}',
        b'{"code":10}\x00',
        b"[" * 5000,
    ],
)
def test_bad_json_header(header: bytes) -> None:
    assert _reason(_json_frame(header)) == "bad_json_header"


def test_bad_serialize_type() -> None:
    assert _reason(_json_frame(b'{"code":10}', serialize_type=2)) == "bad_serialize_type"
    assert _reason(_json_frame(b'{"code":10}', serialize_type=0x80)) == "bad_serialize_type"


def _binary_header(remark_len: int, remark: bytes, ext_len: int, ext: bytes) -> bytes:
    return (
        struct.pack(">hBhii", 11, 0, 401, 1, 0)
        + struct.pack(">i", remark_len)
        + remark
        + struct.pack(">i", ext_len)
        + ext
    )


@pytest.mark.parametrize(
    "header",
    [
        b"\x00" * 20,  # shorter than the fixed part
        _binary_header(100, b"abc", 0, b""),  # remark past the end
        _binary_header(-1, b"", 0, b""),  # negative remark length
        _binary_header(2, b"\xff\xfe", 0, b""),  # invalid UTF-8 remark
        _binary_header(0, b"", 500, b""),  # extFields past the end
        _binary_header(0, b"", -4, b""),
        _binary_header(0, b"", 1, b"\x00"),  # truncated key length
        _binary_header(0, b"", 4, b"\x00\x10ab"),  # key past the extFields region
        _binary_header(0, b"", 5, b"\x00\x01k\x00\x00"),  # truncated value length
        _binary_header(0, b"", 9, b"\x00\x01k\x00\x00\x00\x09v"),  # value past the end
        _binary_header(0, b"", 8, b"\x00\x01k\xff\xff\xff\xff"),  # negative value length
        _binary_header(0, b"", 8, b"\xff\xff\x00\x00\x00\x00\x00\x00"),  # negative key length
        _binary_header(0, b"", 9, b"\x00\x01\xc3\x00\x00\x00\x00\x00\x00"),  # invalid UTF-8 key
        struct.pack(">hBhii", 11, 0, 401, 1, 0) + b"\x00\x00\x00\x00",  # no extFields length
    ],
)
def test_bad_binary_header(header: bytes) -> None:
    assert _reason(_json_frame(header, serialize_type=SERIALIZE_ROCKETMQ)) == "bad_binary_header"


def test_decoder_stays_failed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(RemotingCodecError):
        decoder.receive_data(b"\x80\x00\x00\x00")
    with pytest.raises(RemotingCodecError) as info:
        decoder.receive_data(JAVA_HEARTBEAT_FRAME)
    assert info.value.reason == "bad_frame_length"


def test_partial_frame_stays_buffered() -> None:
    decoder = FrameDecoder()
    assert decoder.receive_data(JAVA_HEARTBEAT_FRAME + ALI_SEND_FRAME[:10]) != []
    assert decoder.buffered == 10


# --- fuzzing -----------------------------------------------------------------------------------------

DECODE_REASONS = {
    "bad_frame_length",
    "frame_too_large",
    "bad_header_length",
    "bad_serialize_type",
    "bad_json_header",
    "bad_binary_header",
}


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=256), st.integers(min_value=8, max_value=4096))
def test_random_bytes_raise_only_codec_error(data: bytes, limit: int) -> None:
    decoder = FrameDecoder(max_frame_bytes=limit)
    reason: str | None = None
    commands: list[RemotingCommand] = []
    try:
        commands = decoder.receive_data(data)
    except RemotingCodecError as exc:
        reason = exc.reason
    assert reason is None or reason in DECODE_REASONS
    for command in commands:
        assert all(type(k) is str and type(v) is str for k, v in command.ext_fields.items())


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([0, 1]), st.binary(max_size=200), st.binary(max_size=16))
def test_random_headers_raise_only_codec_error(serialize_type: int, header: bytes, body: bytes) -> None:
    reason: str | None = None
    try:
        decode_frame(_json_frame(header, body, serialize_type)[4:])
    except RemotingCodecError as exc:
        reason = exc.reason
    assert reason in (None, "bad_json_header", "bad_binary_header")


_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["code", "opaque", "flag", "version", "language", "remark", "extFields", "x"]),
        _json_scalars | st.dictionaries(st.text(max_size=4), _json_scalars, max_size=4),
    )
)
def test_random_json_objects_raise_only_codec_error(obj: dict[str, object]) -> None:
    try:
        header = orjson.dumps(obj)
    except orjson.JSONEncodeError:
        return  # hypothesis produced an integer JSON cannot carry
    reason: str | None = None
    try:
        cmd = decode_frame(_json_frame(header)[4:])
    except RemotingCodecError as exc:
        reason = exc.reason
    if reason is None:
        assert all(type(v) is str for v in cmd.ext_fields.values())
    else:
        assert reason == "bad_json_header"


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

"""Bad remoting frames: each malformed length, header or limit fails with its reason, and random
input raises only the codec's error."""

from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs.remoting import (
    DEFAULT_MAX_FRAME_BYTES,
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RemotingCodecError,
    RemotingCommand,
    decode_frame,
)

from .remoting_frames import (  # type: ignore[import-not-found]
    ALI_SEND_FRAME,
    JAVA_HEARTBEAT_FRAME,
    binary_header,
    json_frame,
)

# --- bad input ---------------------------------------------------------------------------------------


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
    frame = json_frame(b'{"code":10}', body)
    decoder = FrameDecoder(max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
    with pytest.raises(RemotingCodecError) as info:
        decoder.receive_data(frame[:4])
    assert info.value.reason == "frame_too_large"
    assert _reason(frame) == "frame_too_large"


def test_frame_exactly_at_limit_is_accepted() -> None:
    frame = json_frame(b'{"code":10}', b"b" * 100)
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
    assert _reason(json_frame(header)) == "bad_json_header"


def test_bad_serialize_type() -> None:
    assert _reason(json_frame(b'{"code":10}', serialize_type=2)) == "bad_serialize_type"
    assert _reason(json_frame(b'{"code":10}', serialize_type=0x80)) == "bad_serialize_type"


@pytest.mark.parametrize(
    "header",
    [
        b"\x00" * 20,  # shorter than the fixed part
        binary_header(100, b"abc", 0, b""),  # remark past the end
        binary_header(-1, b"", 0, b""),  # negative remark length
        binary_header(2, b"\xff\xfe", 0, b""),  # invalid UTF-8 remark
        binary_header(0, b"", 500, b""),  # extFields past the end
        binary_header(0, b"", -4, b""),
        binary_header(0, b"", 1, b"\x00"),  # truncated key length
        binary_header(0, b"", 4, b"\x00\x10ab"),  # key past the extFields region
        binary_header(0, b"", 5, b"\x00\x01k\x00\x00"),  # truncated value length
        binary_header(0, b"", 9, b"\x00\x01k\x00\x00\x00\x09v"),  # value past the end
        binary_header(0, b"", 8, b"\x00\x01k\xff\xff\xff\xff"),  # negative value length
        binary_header(0, b"", 8, b"\xff\xff\x00\x00\x00\x00\x00\x00"),  # negative key length
        binary_header(0, b"", 9, b"\x00\x01\xc3\x00\x00\x00\x00\x00\x00"),  # invalid UTF-8 key
        struct.pack(">hBhii", 11, 0, 401, 1, 0) + b"\x00\x00\x00\x00",  # no extFields length
    ],
)
def test_bad_binary_header(header: bytes) -> None:
    assert _reason(json_frame(header, serialize_type=SERIALIZE_ROCKETMQ)) == "bad_binary_header"


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
        decode_frame(json_frame(header, body, serialize_type)[4:])
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
        cmd = decode_frame(json_frame(header)[4:])
    except RemotingCodecError as exc:
        reason = exc.reason
    if reason is None:
        assert all(type(v) is str for v in cmd.ext_fields.values())
    else:
        assert reason == "bad_json_header"

"""
mqproxy.fuzz.remoting_target
~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Fuzz target for the remoting codec: :class:`~mqproxy.codecs.remoting.FrameDecoder` (JSON and ROCKETMQ
binary headers), then for each decoded command what the session layer reads from untrusted bytes: every
typed request header (long and short keys), the ``properties`` string, SEND_BATCH bodies, compressed
bodies and, for responses, the record list of a pull body (what the cluster backend reads from a broker).

Documented errors: :class:`~mqproxy.codecs.remoting.RemotingCodecError` (``RecordError`` included) and,
per header, :class:`~mqproxy.remoting.errors.HeaderError`.
"""

from __future__ import annotations

import dataclasses
import inspect
import struct
import zlib

from mqproxy.codecs.message_record import (
    BatchEntry,
    RecordError,
    decode_batch_body,
    decode_properties,
    decode_records,
    decompress_body,
    encode_batch_body,
    encode_properties,
    encode_records,
)
from mqproxy.codecs.remoting import (
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RemotingCodecError,
    RemotingCommand,
    encode_command,
)
from mqproxy.codecs.remoting_codes import RequestCode
from mqproxy.fuzz.mutator import Field, Seed
from mqproxy.model.types import StoredMessage
from mqproxy.remoting import headers
from mqproxy.remoting.errors import HeaderError

__all__ = ["ERRORS", "run", "seeds"]

ERRORS: tuple[type[BaseException], ...] = (RemotingCodecError,)

_MAX_FRAME_BYTES = 64 * 1024
_HEADER_CLASSES = tuple(
    cls for _, cls in inspect.getmembers(headers, inspect.isclass)
    if dataclasses.is_dataclass(cls) and cls.__module__ == headers.__name__
    and not cls.__name__.startswith("_")
)
_I32 = struct.Struct(">i")


def run(data: bytes, split: int) -> None:
    """Decode ``data`` (fed in two calls cut at ``split``) and everything the commands carry."""
    decoder = FrameDecoder(_MAX_FRAME_BYTES)
    commands = decoder.receive_data(data[:split]) if split else []
    commands += decoder.receive_data(data[split:])
    for command in commands:
        _command(command)


def _command(command: RemotingCommand) -> None:
    ext = command.ext_fields
    for cls in _HEADER_CLASSES:
        for short in (False, True):
            try:
                headers.parse_header(cls, ext, short_keys=short)
            except HeaderError:
                pass
    for key in ("properties", "i"):
        if key in ext:
            decode_properties(ext[key])
    body = command.body
    try:
        if command.flag & FLAG_RESPONSE:
            decode_records(body)
        elif command.code == RequestCode.SEND_BATCH_MESSAGE:
            decode_batch_body(body)
        else:
            decompress_body(body, 0x1, max_bytes=1 << 20)
    except RecordError:
        pass


# --- seeds ---------------------------------------------------------------------------------------


def _stored(queue_offset: int, body: bytes) -> StoredMessage:
    return StoredMessage(
        topic="TopicA", queue_id=1, queue_offset=queue_offset, commitlog_offset=4096 * queue_offset,
        store_size=0, body=body, flag=0, properties={"TAGS": "t", "KEYS": "k1 k2", "UNIQ_KEY": "AB01"},
        sys_flag=0, born_timestamp_ms=1_700_000_000_000, born_host=("127.0.0.1", 4242),
        store_timestamp_ms=1_700_000_000_001, store_host=("127.0.0.1", 10911), reconsume_times=0, body_crc=0,
    )


def _commands() -> list[RemotingCommand]:
    props = encode_properties({"TAGS": "TagA", "KEYS": "k1", "UNIQ_KEY": "0100007F0000"})
    short = {"a": "PG", "b": "TopicA", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000000",
             "h": "0", "i": props, "j": "0", "k": "false", "m": "false", "n": "2"}
    pull = {"consumerGroup": "CG", "topic": "TopicA", "queueId": "0", "queueOffset": "12", "maxMsgNums": "32",
            "sysFlag": "2", "commitOffset": "0", "suspendTimeoutMillis": "15000", "subscription": "*",
            "subVersion": "0", "expressionType": "TAG"}
    pop = {"consumerGroup": "CG", "topic": "TopicA", "queueId": "-1", "maxMsgNums": "8",
           "invisibleTime": "60000", "pollTime": "1000", "bornTime": "1700000000000", "initMode": "0",
           "expType": "TAG", "exp": "*", "order": "false", "extraInfo": "0 1 2", "offset": "3",
           "ackOffset": "4", "commitLogOffset": "5", "tranStateTableOffset": "6", "commitOrRollback": "8",
           "producerGroup": "PG", "fromTransactionCheck": "true", "msgId": "AB", "transactionId": "T1",
           "offsetNew": "7", "timestamp": "1700000000000", "delayLevel": "3", "originMsgId": "ID",
           "originTopic": "TopicA", "maxReconsumeTimes": "16", "clientID": "c@1", "unitMode": "false"}
    batch = encode_batch_body(
        [BatchEntry(body=b"one", flag=0, properties={"KEYS": "a"}), BatchEntry(b"two", 0, {})]
    )
    records = encode_records([_stored(0, b"hello"), _stored(1, b"world" * 3)])
    heartbeat = b'{"clientID":"c@1","consumerDataSet":[],"producerDataSet":[{"groupName":"PG"}]}'
    out = []
    for serialize in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
        out += [
            RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=1, ext_fields=short, body=b"payload",
                            serialize_type=serialize),
            RemotingCommand(RequestCode.PULL_MESSAGE, opaque=2, ext_fields=pull, serialize_type=serialize),
            RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, opaque=3, ext_fields=short, body=batch,
                            serialize_type=serialize),
            RemotingCommand(200050, opaque=4, ext_fields=pop, remark="r", serialize_type=serialize),
            RemotingCommand(0, opaque=5, flag=FLAG_RESPONSE, remark="ok",
                            ext_fields={"nextBeginOffset": "2", "minOffset": "0", "maxOffset": "2"},
                            body=records, serialize_type=serialize),
            RemotingCommand(RequestCode.HEART_BEAT, opaque=6, body=heartbeat, serialize_type=serialize),
            RemotingCommand(RequestCode.SEND_MESSAGE, opaque=7, ext_fields={"sysFlag": "1"},
                            body=zlib.compress(b"compressed body " * 8), serialize_type=serialize),
        ]
    return out


def _fields(frame: bytes, at: int) -> list[Field]:
    """Length fields of one frame starting at ``at``: total, header length, binary remark/ext lengths."""
    fields = [Field(at, 4), Field(at + 5, 3)]
    if frame[4] == SERIALIZE_ROCKETMQ:
        remark_at = at + 8 + 13
        fields.append(Field(remark_at, 4))
        (remark_len,) = _I32.unpack_from(frame, 8 + 13)
        fields.append(Field(remark_at + 4 + max(remark_len, 0), 4))
    return fields


def seeds() -> list[Seed]:
    """Every seed command alone, plus pairs of frames in one buffer (the lies then desynchronise)."""
    frames = [encode_command(cmd) for cmd in _commands()]
    out = [Seed(frame, tuple(_fields(frame, 0))) for frame in frames]
    for first, second in zip(frames, frames[1:] + frames[:1], strict=True):
        out.append(Seed(first + second, tuple(_fields(first, 0) + _fields(second, len(first)))))
    return out

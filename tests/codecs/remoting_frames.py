"""Golden remoting frames captured from real clients, and builders of raw frames for the codec tests."""

from __future__ import annotations

import struct

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


def json_frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), serialize_type << 24 | len(header)) + header + body


def binary_header(remark_len: int, remark: bytes, ext_len: int, ext: bytes) -> bytes:
    return (
        struct.pack(">hBhii", 11, 0, 401, 1, 0)
        + struct.pack(">i", remark_len)
        + remark
        + struct.pack(">i", ext_len)
        + ext
    )

"""Tests for mqproxy.negotiation.sniff: golden first frames, split feeding, bad input, fuzzing."""

from __future__ import annotations

import ast
import random
import ssl
from pathlib import Path

import h2.connection
import h11
import paho.mqtt.client as mqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs.proxy_protocol import parse_proxy_header
from mqproxy.negotiation import (
    ALL,
    DETECTORS,
    MAX_SNIFF_BYTES_NEEDED,
    Detected,
    NeedMore,
    Protocol,
    Unknown,
    sniff,
)

REPO = Path(__file__).resolve().parents[2]
INNER = ALL - {Protocol.PROXY, Protocol.TLS}


def _client_hello(**options: object) -> bytes:
    """A real ClientHello from Python's ssl module, produced in memory (no socket)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if "maximum_version" in options:
        ctx.maximum_version = options["maximum_version"]  # type: ignore[assignment]
    if "alpn" in options:
        ctx.set_alpn_protocols(options["alpn"])  # type: ignore[arg-type]
    outgoing = ssl.MemoryBIO()
    tls = ctx.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="mq.example.test")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:  # waiting for the ServerHello: the ClientHello is in `outgoing`
        return outgoing.read()
    raise AssertionError("handshake cannot complete without a server")


def _paho_connect(protocol: int) -> bytes:
    """The CONNECT paho-mqtt would write first, captured before its socket layer (no socket)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="mqproxy-test", protocol=protocol)
    client.username_pw_set("user", "secret")
    client.will_set("devices/mqproxy-test/status", b"offline", qos=1, retain=True)
    packets: list[bytes] = []
    client._packet_queue = lambda command, packet, mid, qos, info=None: packets.append(bytes(packet))  # type: ignore[method-assign]
    client._send_connect(60)
    return packets[0]


def _h2_client_preface() -> bytes:
    """What the h2 library (as gRPC-over-h2 clients) writes first: preface, SETTINGS."""
    conn = h2.connection.H2Connection()
    conn.initiate_connection()
    return conn.data_to_send()


def _h11_request(method: str, target: str) -> bytes:
    conn = h11.Connection(h11.CLIENT)
    return conn.send(h11.Request(method=method, target=target, headers=[("Host", "127.0.0.1")]))


# -- golden first bytes ---------------------------------------------------------------------------------

# rocketmq-client-cpp (0.4.4 core): GET_ROUTEINFO_BY_TOPIC, jsoncpp header ending in "\n", ONS keys.
REMOTING_CPP = (
    b"\x00\x00\x00\xc1\x00\x00\x00\xbd"
    b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN",'
    b'"Signature":"pmt4b0Q1DU0Rn3hKZyyXmfdW4cE=","topic":"TopicTest"},'
    b'"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}\n'
)
# ali-ons: compact JSON in insertion order, opaque starts at 1.
REMOTING_ALI_ONS = (
    b"\x00\x00\x00\x66\x00\x00\x00\x62"
    b'{"code":105,"language":"JAVA","opaque":1,"flag":0,"version":121,"extFields":{"topic":"TopicTest"}}'
)
# Java 4.9.4 HEART_BEAT: no extFields key, JSON body.
REMOTING_JAVA_HEARTBEAT = (
    b"\x00\x00\x00\xd8\x00\x00\x00\x60"
    b'{"code":34,"flag":0,"language":"JAVA","opaque":0,"serializeTypeCurrentRPC":"JSON","version":401}'
    b'{"clientID":"192.0.2.2@4242#1234567","consumerDataSet":[],'
    b'"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}]}'
)
# Java with -Drocketmq.serialize.type=ROCKETMQ: GET_ROUTEINFO_BY_TOPIC, binary header (41 bytes).
REMOTING_BINARY = bytes.fromhex(
    "0000002d 01000029"  # length 45, serialize type 1, header length 41
    "0069 00 0191 00000000 00000000"  # code 105, JAVA, version 401, opaque 0, flag 0
    "00000000 00000014"  # remark length 0, extFields length 20
    "0005 746f706963 00000009 546f70696354657374"  # topic=TopicTest
)
# A frame whose length is far beyond any max frame: still remoting, so the codec can say so.
REMOTING_2GIB = b"\x80\x00\x00\x00\x00\x00\x00\x62" + REMOTING_ALI_ONS[8:]

MQTT_311 = b"\x10\x18\x00\x04MQTT\x04\x02\x00\x3c\x00\x0cmqproxy-test"
MQTT_5 = b"\x10\x1e\x00\x04MQTT\x05\x02\x00\x3c\x05\x11\x00\x00\x00\x3c\x00\x0cmqproxy-test"
MQTT_31 = b"\x10\x1a\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x0cmqproxy-test"
# 3.1.1 with username and password: remaining length 178 takes two bytes (0xb2 0x01).
MQTT_311_LONG = (
    b"\x10\xb2\x01\x00\x04MQTT\x04\xc2\x00\x3c\x00\x0cmqproxy-test"
    + b"\x00\x32"
    + b"u" * 50
    + b"\x00\x64"
    + b"p" * 100
)

# h2 prior knowledge: preface then an empty SETTINGS frame.
GRPC_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

TLS13_HELLO = _client_hello()
TLS12_HELLO = _client_hello(maximum_version=ssl.TLSVersion.TLSv1_2, alpn=["h2", "http/1.1"])

HTTP_GET = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9876\r\nAccept: */*\r\n\r\n"
HTTP_POST = b"POST /admin/topics HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
HTTP_OPTIONS = b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"

# haproxy doc/proxy-protocol.txt §2.1 example, followed by the proxied request.
PROXY_V1 = b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n" + HTTP_GET
# v2 PROXY TCP4 192.0.2.7:40000 -> 198.51.100.1:9876, then a remoting frame.
PROXY_V2 = bytes.fromhex("0d0a0d0a000d0a515549540a 21 11 000c c0000207 c6336401 9c40 2694") + REMOTING_ALI_ONS

# (id, bytes, protocol, bytes needed to decide, info the detector must report)
GOLDEN: list[tuple[str, bytes, Protocol, int, dict[str, object]]] = [
    ("remoting-cpp", REMOTING_CPP, Protocol.REMOTING, 10, {"serialize_type": 0, "frame_length": 193}),
    ("remoting-ali-ons", REMOTING_ALI_ONS, Protocol.REMOTING, 10, {"header_length": 98}),
    ("remoting-java-heartbeat", REMOTING_JAVA_HEARTBEAT, Protocol.REMOTING, 10, {"frame_length": 216}),
    ("remoting-binary", REMOTING_BINARY, Protocol.REMOTING, 25, {"serialize_type": 1, "header_length": 41}),
    ("remoting-2gib", REMOTING_2GIB, Protocol.REMOTING, 10, {"frame_length": 2**31}),
    ("mqtt-3.1.1", MQTT_311, Protocol.MQTT, 9, {"mqtt_level": 4}),
    ("mqtt-5", MQTT_5, Protocol.MQTT, 9, {"mqtt_level": 5}),
    ("mqtt-3.1", MQTT_31, Protocol.MQTT, 11, {"mqtt_level": 3}),
    ("mqtt-3.1.1-long", MQTT_311_LONG, Protocol.MQTT, 10, {"mqtt_level": 4}),
    ("grpc", GRPC_PREFACE, Protocol.GRPC, 24, {}),
    ("tls13", TLS13_HELLO, Protocol.TLS, 6, {"record_version": "3.1"}),
    ("tls12-alpn", TLS12_HELLO, Protocol.TLS, 6, {"record_version": "3.1"}),
    ("http-get", HTTP_GET, Protocol.HTTP, 5, {"method": "GET"}),
    ("http-post", HTTP_POST, Protocol.HTTP, 6, {"method": "POST"}),
    ("http-options", HTTP_OPTIONS, Protocol.HTTP, 9, {"method": "OPTIONS"}),
    ("paho-mqtt-3.1", _paho_connect(mqtt.MQTTv31), Protocol.MQTT, 11, {"mqtt_level": 3}),
    ("paho-mqtt-3.1.1", _paho_connect(mqtt.MQTTv311), Protocol.MQTT, 9, {"mqtt_level": 4}),
    ("paho-mqtt-5", _paho_connect(mqtt.MQTTv5), Protocol.MQTT, 9, {"mqtt_level": 5}),
    ("h2-library", _h2_client_preface(), Protocol.GRPC, 24, {}),
    ("h11-get", _h11_request("GET", "/healthz"), Protocol.HTTP, 5, {"method": "GET"}),
    ("h11-put", _h11_request("PUT", "http://x/y"), Protocol.HTTP, 5, {"method": "PUT"}),
    ("proxy-v1", PROXY_V1, Protocol.PROXY, 6, {"proxy_version": 1}),
    ("proxy-v2", PROXY_V2, Protocol.PROXY, 12, {"proxy_version": 2}),
]
GOLDEN_IDS = [g[0] for g in GOLDEN]


@pytest.mark.parametrize(("name", "data", "protocol", "decided_at", "info"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_prefix_at_every_split(
    name: str, data: bytes, protocol: Protocol, decided_at: int, info: dict[str, object]
) -> None:
    for k in range(len(data) + 1):
        verdict = sniff(data[:k])
        if k < decided_at:
            assert verdict == NeedMore(), (k, verdict)
        else:
            assert isinstance(verdict, Detected), (k, verdict)
            assert verdict.protocol is protocol
            assert {key: verdict.info[key] for key in info} == info
    assert decided_at <= MAX_SNIFF_BYTES_NEEDED


@pytest.mark.parametrize(("name", "data", "protocol", "decided_at", "info"), GOLDEN, ids=GOLDEN_IDS)
def test_exactly_one_detector_claims_each_golden(
    name: str, data: bytes, protocol: Protocol, decided_at: int, info: dict[str, object]
) -> None:
    claims = {p for p, detect in DETECTORS.items() if isinstance(detect(data), Detected)}
    assert claims == {protocol}
    others = {p: detect(data) for p, detect in DETECTORS.items() if p is not protocol}
    assert all(isinstance(v, Unknown) and v.reason for v in others.values()), others


@pytest.mark.parametrize(("name", "data", "protocol", "decided_at", "info"), GOLDEN, ids=GOLDEN_IDS)
def test_protocol_not_allowed_is_unknown(
    name: str, data: bytes, protocol: Protocol, decided_at: int, info: dict[str, object]
) -> None:
    verdict = sniff(data, ALL - {protocol})
    assert isinstance(verdict, Unknown)
    assert verdict.reason == "unknown_protocol"


@pytest.mark.parametrize(
    ("data", "protocol"),
    [(g[1], g[2]) for g in GOLDEN if g[2] not in (Protocol.PROXY, Protocol.TLS)],
    ids=[g[0] for g in GOLDEN if g[2] not in (Protocol.PROXY, Protocol.TLS)],
)
def test_inner_sniff_after_tls_or_proxy(data: bytes, protocol: Protocol) -> None:
    for k in range(len(data) + 1):
        verdict = sniff(data[:k], INNER)
        assert not isinstance(verdict, Unknown), (k, verdict)
    final = sniff(data, INNER)
    assert isinstance(final, Detected)
    assert final.protocol is protocol


@pytest.mark.parametrize(
    ("outer", "inner_protocol"),
    [(PROXY_V1, Protocol.HTTP), (PROXY_V2, Protocol.REMOTING)],
    ids=["v1-http", "v2-remoting"],
)
def test_proxy_header_then_inner_protocol(outer: bytes, inner_protocol: Protocol) -> None:
    header = parse_proxy_header(outer)
    assert header is not None
    rest = outer[header.consumed :]
    verdict = sniff(rest, ALL - {Protocol.PROXY})
    assert isinstance(verdict, Detected)
    assert verdict.protocol is inner_protocol
    # A second PROXY header inside is not accepted once PROXY was consumed.
    assert isinstance(sniff(PROXY_V1, ALL - {Protocol.PROXY}), Unknown)


def test_allowed_accepts_any_iterable() -> None:
    verdict = sniff(MQTT_311, iter([Protocol.REMOTING, Protocol.MQTT]))
    assert verdict == Detected(Protocol.MQTT, {"mqtt_level": 4})
    assert isinstance(sniff(MQTT_311, []), Unknown)


# -- bad and borderline input ---------------------------------------------------------------------------


def test_empty_and_one_byte_need_more() -> None:
    assert sniff(b"") == NeedMore()
    assert sniff(b"\x00") == NeedMore()
    assert sniff(b"P") == NeedMore()  # PROXY, PRI, POST/PUT/PATCH, or a huge remoting length


def test_huge_remoting_length_is_remoting_with_length() -> None:
    verdict = sniff(REMOTING_2GIB)
    assert verdict == Detected(
        Protocol.REMOTING, {"serialize_type": 0, "frame_length": 2147483648, "header_length": 98}
    )
    max_u32 = sniff(b"\xff\xff\xff\xff\x00\x00\x00\x02{}")
    assert isinstance(max_u32, Detected)
    assert max_u32.info["frame_length"] == 0xFFFFFFFF


def test_random_64k_is_unknown_with_short_printable_detail() -> None:
    data = random.Random(20261122).randbytes(64 * 1024)
    verdict = sniff(data)
    assert isinstance(verdict, Unknown)
    assert verdict.reason == "unknown_protocol"
    assert verdict.detail.isprintable()
    assert verdict.detail == "65536 bytes: " + data[:16].hex(" ")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\x00\x00\x04\x00\x00\x00\x00", "remoting_bad_length"),
        (b"\x00\x00\x00\x00", "remoting_bad_length"),
        (b"\x00\x00\x00\x66\x02", "remoting_bad_serialize_type"),
        (b"\x00\x00\x00\x66\x00\x00\x00\x63{", "remoting_header_exceeds_frame"),
        (b"\x00\x00\x00\x66\x00\x00\x00\x01{", "remoting_bad_header_length"),
        (b"\x00\x00\x00\x66\x00\x00\x00\x62[1,2]", "remoting_json_header_not_object"),
        (b"\x00\x00\x00\x66\x00\x00\x00\x62{x", "remoting_json_header_not_object"),
        (b"\x00\x00\x00\x66\x00\x00\x00\x03 { ", "remoting_json_header_not_object"),
        (b"\x00\x00\x00\x66\x00\x00\x00\x62" + b" " * 56, "remoting_json_header_not_object"),
        (b"\x00\x00\x00\x66\x01\x00\x00\x14" + bytes(17), "remoting_bad_header_length"),
        (REMOTING_BINARY[:10] + b"\x0e" + REMOTING_BINARY[11:], "remoting_bad_language"),
        (REMOTING_BINARY[:20] + b"\x04" + REMOTING_BINARY[21:], "remoting_bad_flag"),
        (REMOTING_BINARY[:21] + b"\x00\x00\x00\x15" + REMOTING_BINARY[25:], "remoting_bad_remark_length"),
        (REMOTING_BINARY[:21] + b"\xff\xff\xff\xff" + REMOTING_BINARY[25:], "remoting_bad_remark_length"),
    ],
)
def test_remoting_rejections(data: bytes, reason: str) -> None:
    assert DETECTORS[Protocol.REMOTING](data) == Unknown(reason)
    assert isinstance(sniff(data + bytes(MAX_SNIFF_BYTES_NEEDED)), Unknown)


def test_remoting_json_whitespace_before_and_inside_object() -> None:
    header = b'\n\t {\r\n "code":105}'
    frame = (4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header
    assert sniff(frame) == Detected(
        Protocol.REMOTING, {"serialize_type": 0, "frame_length": 22, "header_length": 18}
    )
    assert sniff(frame[:15]) == NeedMore()
    assert isinstance(sniff(frame[:16]), Detected)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x12\x18\x00\x04MQTT\x04", "mqtt_not_connect"),  # CONNECT with reserved flags set
        (b"\x20\x02\x00\x00", "mqtt_not_connect"),  # CONNACK
        (b"\x10\x80\x80\x80\x80\x01", "mqtt_bad_remaining_length"),  # fifth length byte
        (b"\x10\x18\x00\x04MQTT\x03", "mqtt_unsupported_level"),
        (b"\x10\x18\x00\x04MQTT\x06", "mqtt_unsupported_level"),
        (b"\x10\x1a\x00\x06MQIsdp\x04", "mqtt_unsupported_level"),
        (b"\x10\x18\x00\x04MQTX\x04", "mqtt_bad_protocol_name"),
        (b"\x10\x18\x00\x04mqtt\x04", "mqtt_bad_protocol_name"),
        (b"\x10\x0b\x00\x04MQTT\x04", "mqtt_remaining_length_too_short"),
        (b"\x10\x0c\x00\x04MQTT\x05", "mqtt_remaining_length_too_short"),
        (b"\x10\x0d\x00\x06MQIsdp\x03", "mqtt_remaining_length_too_short"),
    ],
)
def test_mqtt_rejections(data: bytes, reason: str) -> None:
    assert DETECTORS[Protocol.MQTT](data) == Unknown(reason)
    assert isinstance(sniff(data + bytes(MAX_SNIFF_BYTES_NEEDED)), Unknown)


def test_mqtt_four_byte_remaining_length() -> None:
    data = b"\x10\xff\xff\xff\x7f\x00\x04MQTT\x05"
    assert sniff(data[:-1]) == NeedMore()
    assert sniff(data) == Detected(Protocol.MQTT, {"mqtt_level": 5})


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x16\x02\x01\x02\x00\x01", "tls_bad_record_version"),
        (b"\x16\x03\x04\x02\x00\x01", "tls_bad_record_version"),
        (b"\x16\x03\x01\x00\x00\x01", "tls_bad_record_length"),
        (b"\x16\x03\x01\x40\x01\x01", "tls_bad_record_length"),
        (b"\x16\x03\x03\x00\x31\x02", "tls_not_client_hello"),  # ServerHello
        (b"\x15\x03\x03\x00\x02\x02\x28", "tls_not_handshake"),  # alert
        (b"\x17\x03\x03\x00\x10", "tls_not_handshake"),  # application data
    ],
)
def test_tls_rejections(data: bytes, reason: str) -> None:
    assert DETECTORS[Protocol.TLS](data) == Unknown(reason)


@pytest.mark.parametrize(
    "hello",
    [
        # SSLv2-format CLIENT-HELLO offering SSL 3.0/TLS 1.0 (old OpenSSL), and a pure SSL 2.0 one.
        bytes.fromhex("802e0103010015000000100700c0050080030080010080060040040080020080") + bytes(16),
        bytes.fromhex("802e0100020015000000100700c0050080030080010080060040040080020080") + bytes(16),
    ],
    ids=["sslv2-compatible", "sslv2"],
)
def test_sslv2_hello_is_unknown(hello: bytes) -> None:
    assert isinstance(DETECTORS[Protocol.TLS](hello), Unknown)
    assert isinstance(sniff(hello), Unknown)


@pytest.mark.parametrize(
    "data",
    [
        b"PRI * HTTP/1.1\r\n",  # neither the h2 preface nor an HTTP/1 method
        b"PRI * HTTP/2.0\r\n\r\nXX",
        b"get / HTTP/1.1\r\n",  # methods are case-sensitive
        b"GET  / HTTP/1.1\r\n",
        b"GETX / HTTP/1.1\r\n",
        b"BREW /pot HTTP/1.1\r\n",
        b"PROXYX TCP4",
        b"\r\n\r\n\x00\r\nQUIX\n\x21",
    ],
)
def test_near_misses_are_unknown(data: bytes) -> None:
    assert isinstance(sniff(data + bytes(MAX_SNIFF_BYTES_NEEDED)), Unknown)


def test_h2_preface_is_not_http() -> None:
    assert isinstance(DETECTORS[Protocol.HTTP](GRPC_PREFACE), Unknown)
    assert sniff(GRPC_PREFACE[:4]) == NeedMore()
    assert sniff(GRPC_PREFACE[:24], ALL - {Protocol.GRPC}) == Unknown(
        "unknown_protocol", "24 bytes: " + GRPC_PREFACE[:16].hex(" ")
    )


def test_half_proxy_header_is_detected_as_proxy() -> None:
    assert sniff(b"PROXY TCP4 192.0") == Detected(Protocol.PROXY, {"proxy_version": 1})
    assert sniff(PROXY_V2[:11]) == NeedMore()
    # A wrong version after the signature is still PROXY to the sniffer; the codec rejects it.
    assert sniff(PROXY_V2[:12] + b"\x11") == Detected(Protocol.PROXY, {"proxy_version": 2})


# -- fuzzing ---------------------------------------------------------------------------------------------

_VERDICTS = (Detected, NeedMore, Unknown)
_near_golden = st.builds(
    lambda golden, cut, tail: golden[:cut] + tail,
    st.sampled_from([g[1] for g in GOLDEN]),
    st.integers(0, 40),
    st.binary(max_size=MAX_SNIFF_BYTES_NEEDED),
)


# No hypothesis deadline: timing varies on shared cores; these tests check correctness only.
@settings(deadline=None)
@given(data=st.one_of(st.binary(max_size=2 * MAX_SNIFF_BYTES_NEEDED), _near_golden))
def test_fuzz_sniff_is_total_and_bounded(data: bytes) -> None:
    verdict = sniff(data)
    assert isinstance(verdict, _VERDICTS)
    if len(data) >= MAX_SNIFF_BYTES_NEEDED:
        assert not isinstance(verdict, NeedMore)
    for detect in DETECTORS.values():
        one = detect(data)
        assert isinstance(one, _VERDICTS)
        if len(data) >= MAX_SNIFF_BYTES_NEEDED:
            assert not isinstance(one, NeedMore)


@settings(deadline=None)
@given(
    data=st.one_of(st.binary(max_size=2 * MAX_SNIFF_BYTES_NEEDED), _near_golden),
    allowed=st.frozensets(st.sampled_from(list(Protocol))),
)
def test_fuzz_sniff_respects_allowed(data: bytes, allowed: frozenset[Protocol]) -> None:
    verdict = sniff(data, allowed)
    if isinstance(verdict, Detected):
        assert verdict.protocol in allowed
        assert isinstance(DETECTORS[verdict.protocol](data), Detected)
    elif isinstance(verdict, Unknown):
        assert verdict.reason == "unknown_protocol"
        assert verdict.detail.isprintable()


@settings(deadline=None)
@given(
    data=st.one_of(st.binary(max_size=MAX_SNIFF_BYTES_NEEDED), _near_golden),
    extra=st.binary(min_size=1, max_size=MAX_SNIFF_BYTES_NEEDED),
)
def test_fuzz_detectors_are_monotone(data: bytes, extra: bytes) -> None:
    """Growing a prefix never revokes a decision (the I/O layer and the first-byte table rely on it)."""
    for detect in DETECTORS.values():
        before, after = detect(data), detect(data + extra)
        if isinstance(before, Unknown):
            assert isinstance(after, Unknown)
        elif isinstance(before, Detected):
            assert after == before


def _reference_sniff(data: bytes, allowed: frozenset[Protocol]) -> Detected | NeedMore | Unknown:
    """The contract spelled out: ask every allowed detector, in DETECTORS order."""
    verdicts = [detect(data) for p, detect in DETECTORS.items() if p in allowed]
    detected = [v for v in verdicts if isinstance(v, Detected)]
    if detected:
        return detected[0]
    if any(isinstance(v, NeedMore) for v in verdicts) and len(data) < MAX_SNIFF_BYTES_NEEDED:
        return NeedMore()
    return Unknown("unknown_protocol", f"{len(data)} bytes: {data[:16].hex(' ')}")


@settings(deadline=None)
@given(
    data=st.one_of(st.binary(max_size=2 * MAX_SNIFF_BYTES_NEEDED), _near_golden),
    allowed=st.frozensets(st.sampled_from(list(Protocol))),
)
def test_fuzz_sniff_matches_reference(data: bytes, allowed: frozenset[Protocol]) -> None:
    assert sniff(data, allowed) == _reference_sniff(data, allowed)


def test_every_first_byte_matches_reference() -> None:
    tails = (b"", bytes(9), b"\x00\x04MQTT\x04" + bytes(9), b"ET / HTTP/1.1", b"\x03\x01\x02\x00\x01")
    for first in range(256):
        for tail in tails:
            data = bytes([first]) + tail
            assert sniff(data) == _reference_sniff(data, ALL), data


# -- purity ----------------------------------------------------------------------------------------------

FORBIDDEN_IMPORTS = {"trio", "socket", "ssl", "time", "asyncio"}
PURE_SOURCES = [*sorted((REPO / "negotiation").rglob("*.py")), REPO / "codecs" / "proxy_protocol.py"]


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", PURE_SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_sans_io_modules_import_no_io(path: Path) -> None:
    assert not _imported_roots(path) & FORBIDDEN_IMPORTS


def test_import_scanner_catches_forbidden_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os, socket\nfrom trio import sleep\nimport time as t\n")
    assert _imported_roots(bad) & FORBIDDEN_IMPORTS == {"socket", "trio", "time"}

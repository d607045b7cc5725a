"""The real server with two embedded (memory) backends behind one port: a remoting client's send lands on
the backend its topic is routed to, an unrouted one is refused naming the rules."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
import trio

from mqproxy.codecs.mqtt import Connack, Connect, MqttDecoder, PubAck, Publish, QoS, ReasonCode, encode
from mqproxy.codecs.remoting import FrameDecoder
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.routing import RoutingFacade
from mqproxy.lag_sources import read_progress
from mqproxy.settings import Settings

pytestmark = pytest.mark.usefixtures("log_sink")

BACKENDS = {"a": {"kind": "embedded"}, "b": {"kind": "embedded"}}


def _send_frame(topic: str, body: bytes) -> bytes:
    ext = {"a": "PG", "b": topic, "c": "TBW102", "d": "2", "e": "0", "f": "0", "g": "1700000000001",
           "h": "0", "i": "TAGS\x01A\x02"}  # fmt: skip
    header = json.dumps({"code": RequestCode.SEND_MESSAGE_V2, "language": "JAVA", "version": 401,
                         "opaque": 1, "flag": 0, "extFields": ext}).encode()  # fmt: skip
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


async def _send(address: tuple[str, int], topic: str) -> Any:
    stream = await trio.open_tcp_stream(*address)
    decoder = FrameDecoder()
    async with stream:
        await stream.send_all(_send_frame(topic, b"hello"))
        with trio.fail_after(5):
            while True:
                found = decoder.receive_data(await stream.receive_some(65536))
                if found:
                    return found[0]


async def test_sends_land_on_the_routed_backend(start_server: Any) -> None:
    rules = [{"match": "prefix:a-", "backend": "a"}]
    settings = Settings.for_tests(backends=BACKENDS, routing={"rules": rules, "default": "b"})
    async with start_server(settings) as handle:
        routing = handle.state.broker
        assert isinstance(routing, RoutingFacade)
        assert set(routing.backends) == {"a", "b"}  # [backend] is named by nothing: not opened
        assert handle.state.backend_name == "routed"
        assert (await _send(handle.address, "a-orders")).code == ResponseCode.SUCCESS
        assert (await _send(handle.address, "misc")).code == ResponseCode.SUCCESS
        assert await routing.backends["a"].get_topic("a-orders") is not None
        assert await routing.backends["b"].get_topic("a-orders") is None
        assert await routing.backends["b"].get_topic("misc") is not None


async def test_unrouted_send_names_the_rules(start_server: Any, log_sink: Any) -> None:
    rules = [{"match": "exact:orders", "backend": "a"}]
    settings = Settings.for_tests(backends=BACKENDS, routing={"rules": rules})
    async with start_server(settings) as handle:
        response = await _send(handle.address, "misc")
        assert response.code == ResponseCode.TOPIC_NOT_EXIST
        assert "exact:orders -> a; no routing.default" in response.remark
        # the MQTT gateway, without a default backend, is refused its retained-message index too
        assert {e["topic"] for e in log_sink.named("backend.unrouted")} == {"misc", "%LMQ%|RETAINED"}


async def _mqtt_publish(address: tuple[str, int], topic: str, *, publish: bool = True) -> tuple[Any, Any]:
    """CONNECT (MQTT 5, clean start) then one QoS 1 PUBLISH (unless not ``publish``); (CONNACK, PUBACK or
    None if the connection closed first)."""
    stream = await trio.open_tcp_stream(*address)
    decoder = MqttDecoder(1 << 20, protocol_level=5)
    got: list[Any] = []
    async with stream:
        await stream.send_all(encode(Connect("dev1", 5), 5))
        if publish:
            await stream.send_all(encode(Publish(topic, b"hi", QoS.AT_LEAST_ONCE, packet_id=1), 5))
        with trio.fail_after(5):
            while len(got) < (2 if publish else 1):
                data = await stream.receive_some(65536)
                if not data:
                    break
                got += [p for p in decoder.receive_data(data) if isinstance(p, (Connack, PubAck))]
    return got[0], got[1] if len(got) > 1 else None


async def test_mqtt_uses_the_default_backend(start_server: Any) -> None:
    rules = [{"match": "prefix:a", "backend": "a"}]  # would cover MQTT's parent topic "a": not for MQTT
    settings = Settings.for_tests(backends=BACKENDS, routing={"rules": rules, "default": "b"})
    async with start_server(settings) as handle:
        connack, puback = await _mqtt_publish(handle.address, "a/b")
        assert connack.reason_code == ReasonCode.SUCCESS
        assert puback.reason_code == ReasonCode.SUCCESS
        routing = handle.state.broker
        assert await routing.backends["b"].get_topic("a") is not None
        assert await routing.backends["a"].get_topic("a") is None


async def test_mqtt_without_a_default_backend_is_refused(start_server: Any) -> None:
    settings = Settings.for_tests(
        backends=BACKENDS, routing={"rules": [{"match": "prefix:a", "backend": "a"}]}
    )
    async with start_server(settings) as handle:
        connack, puback = await _mqtt_publish(handle.address, "a/b", publish=False)
        # the session's state (the retained index first) has no backend: CONNACK 0x80 saying why
        assert connack.reason_code == ReasonCode.UNSPECIFIED_ERROR
        assert (
            "MQTT uses routing.default; prefix:a -> a; no routing.default" in connack.properties.reason_string
        )
        assert puback is None
        assert await handle.state.broker.backends["a"].get_topic("a") is None


async def test_lag_is_read_from_every_backend(start_server: Any) -> None:
    rules = [{"match": "prefix:a-", "backend": "a"}]
    settings = Settings.for_tests(backends=BACKENDS, routing={"rules": rules, "default": "b"})
    async with start_server(settings) as handle:
        for topic in ("a-orders", "misc"):
            assert (await _send(handle.address, topic)).code == ResponseCode.SUCCESS
            await handle.state.broker.commit_consumer_offset("G", topic, 0, 0)
        readings = await read_progress(handle.state.broker)
        lag = {(r.group, r.topic): r for r in readings if r.group == "G" and r.queue_id == 0}
        assert set(lag) == {("G", "a-orders"), ("G", "misc")}
        assert all(r.broker_offset == 1 and r.consumer_offset == 0 for r in lag.values())

"""MqttService: the protocol service the server builds, which reaches the broker only through the facade."""

from __future__ import annotations

from typing import Any

from mqproxy.codecs.mqtt import QoS
from mqproxy.facade.api import SendRequest
from mqproxy.model.types import Message
from mqproxy.mqtt.mapping import lmq_name
from mqproxy.mqtt.service import MqttService

from .conftest import connect, gateway_of, receive_publish, subscribe  # type: ignore[import-not-found]


async def test_the_server_builds_one_service_and_serves_mqtt_with_its_gateway(server: Any) -> None:
    service = server.state.protocols.mqtt
    assert isinstance(service, MqttService)
    assert service.max_packet_size == server.state.settings.mqtt.max_packet_size
    sub, _ = await connect(server.address, "svc")
    await subscribe(sub, ("svc/+", QoS.AT_MOST_ONCE))
    assert "svc" in gateway_of(server).sessions
    assert service.stats()["sessions_online"] == 1
    assert lmq_name("svc/+") in service.lmqs_in_use()


async def test_a_facade_send_naming_only_the_mqtt_topic_reaches_wildcard_subscribers(server: Any) -> None:
    """The service installs the gateway as the facade's light-queue dispatch: any protocol's send that
    names only ``MQTT_TOPIC`` reaches the topic's and every matching wildcard filter's subscribers."""
    sub, _ = await connect(server.address, "iot")
    await subscribe(sub, ("plant/+/temp", QoS.AT_LEAST_ONCE))
    message = Message("plant", b"from-rocketmq", properties={"MQTT_TOPIC": "plant/7/temp"})
    await server.state.broker.send(SendRequest(message))
    assert message.dispatch == (lmq_name("plant/7/temp"), lmq_name("plant/+/temp"))
    got = await receive_publish(sub)
    assert (got.topic, got.payload) == ("plant/7/temp", b"from-rocketmq")

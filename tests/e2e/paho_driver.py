"""A blocking paho-mqtt 2.x client for the MQTT end-to-end tests: TCP or WebSocket (ws, wss), MQTT 3.1.1/5.0.

:class:`PahoClient` connects in its constructor and runs paho's network loop on a thread. It never asserts
that the connection was accepted: the CONNACK lands in ``flags``/``rc`` (and its MQTT 5 properties in
``connack_properties``) for the test to check. Received
messages queue up in ``messages`` and DISCONNECT reasons in ``disconnected``. Every wait is bounded
(:data:`WAIT_S` unless given); a missing CONNACK or SUBACK fails the test with an ``AssertionError``.
The calls block, so tests against an in-process (trio) proxy run them in a worker thread.
"""

from __future__ import annotations

import queue
import ssl
from typing import Any, Literal

import paho.mqtt.client as mqtt
import pytest
import trustme
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

#: Protocol levels (paho's ``MQTTv311``/``MQTTv5`` are the wire values 4 and 5, as MQTT.js uses them).
V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5
PROTOCOLS = [pytest.param(V311, id="v311"), pytest.param(V5, id="v5")]
WAIT_S = 5.0
WS_PATH = "/mqtt"

#: ``(topic, qos)`` or ``(topic, SubscribeOptions)``, as ``paho.Client.subscribe`` takes them.
Subscription = tuple[str, int | mqtt.SubscribeOptions]
#: ``(topic, payload, qos, retain)`` for ``paho.Client.will_set``.
Will = tuple[str, bytes, int, bool]


class PahoClient:
    """One connected paho client; ``paho`` is the underlying ``mqtt.Client`` for anything not wrapped here.

    ``clean`` is clean-session (3.1.1) or clean-start (5.0); ``expiry`` sets the 5.0 Session Expiry Interval
    (added to ``connect_props``). ``ca`` turns on TLS trusting that CA and connects to ``localhost`` (the
    name its certificates carry); otherwise the client connects to ``127.0.0.1``. paho's network loop
    connects again on its own about a second after it lost the connection, with the same client id;
    ``reconnect=False`` stops that (a client whose session was taken over would otherwise take it back).
    """

    def __init__(
        self,
        port: int,
        client_id: str,
        protocol: int,
        *,
        transport: Literal["tcp", "websockets"] = "tcp",
        clean: bool = True,
        expiry: int | None = None,
        will: Will | None = None,
        keepalive: int = 60,
        connect_props: Properties | None = None,
        credentials: tuple[str, str] | None = None,
        ca: trustme.CA | None = None,
        reconnect: bool = True,
    ) -> None:
        self.client_id = client_id
        self.protocol = protocol
        kwargs: dict[str, Any] = {
            "client_id": client_id,
            "protocol": protocol,
            "transport": transport,
            "reconnect_on_failure": reconnect,
        }
        if protocol != V5:
            kwargs["clean_session"] = clean
        self.paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        if transport == "websockets":
            self.paho.ws_set_options(path=WS_PATH)
        if credentials is not None:
            self.paho.username_pw_set(*credentials)
        if ca is not None:
            context = ssl.create_default_context()
            ca.configure_trust(context)
            self.paho.tls_set_context(context)
        if will is not None:
            self.paho.will_set(*will)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected: queue.Queue[tuple[Any, Any, Any]] = queue.Queue()
        self.disconnected: queue.Queue[Any] = queue.Queue()
        self.paho.on_message = lambda c, u, m: self.messages.put(m)
        self.paho.on_connect = lambda c, u, flags, rc, props: self.connected.put((flags, rc, props))
        self.paho.on_disconnect = lambda c, u, flags, rc, props: self.disconnected.put(rc)
        props = connect_props
        if protocol == V5 and expiry is not None:
            props = props or Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = expiry
        self.paho.connect(
            "localhost" if ca is not None else "127.0.0.1",
            port,
            keepalive=keepalive,
            clean_start=clean if protocol == V5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=props,
        )
        self.paho.loop_start()
        self.flags, self.rc, self.connack_properties = self._next(self.connected, "CONNACK")

    @property
    def session_present(self) -> bool:
        return bool(self.flags.session_present)

    def subscribe(self, *subs: Subscription, properties: Properties | None = None) -> list[int]:
        """SUBSCRIBE and wait for the SUBACK; returns its reason codes (granted QoS or error) as ints."""
        granted: queue.Queue[list[Any]] = queue.Queue()
        self.paho.on_subscribe = lambda c, u, mid, codes, props: granted.put(codes)
        self.paho.subscribe(list(subs), properties=properties)
        return [int(getattr(code, "value", code)) for code in self._next(granted, "SUBACK")]

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        *,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> None:
        """Publish and wait (up to :data:`WAIT_S`) until paho reports the QoS flow complete."""
        info = self.paho.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        info.wait_for_publish(WAIT_S)

    def get(self, timeout: float = WAIT_S) -> mqtt.MQTTMessage:
        """The next received message; ``queue.Empty`` if none arrives within ``timeout``."""
        return self.messages.get(timeout=timeout)

    def close(self) -> None:
        """DISCONNECT politely and stop the network thread."""
        self.paho.disconnect()
        self.paho.loop_stop()

    def drop(self) -> None:
        """Close the socket without DISCONNECT (as a crashed device would)."""
        self.paho.loop_stop()
        sock = self.paho.socket()
        if sock is not None:
            sock.close()

    def _next(self, source: queue.Queue[Any], what: str) -> Any:
        try:
            return source.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no {what} within {WAIT_S} s") from None

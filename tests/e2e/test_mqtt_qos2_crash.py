"""QoS 2 exactly-once across kill -9 of the proxy, with real paho-mqtt 2.x clients (3.1.1 and 5.0).

A publisher streams QoS 2 messages and a slow subscriber receives them; both keep their sessions (clean
session 0 / session expiry) and paho's own QoS 2 state. The proxy is killed with SIGKILL while flows in
both directions are in flight, restarted on the same data dir and port, and paho reconnects by itself.
Every message must reach the subscribing application exactly once; with two members of one shared
subscription, exactly once across the group (a member gets back what it had in flight, nobody else).

The clients wait 4 s before reconnecting, so that their first attempt finds the proxy back: paho 2.1 puts
its outbound flows back in order before each attempt, and a second pass turns a flow whose PUBREL is
owed into a fresh PUBLISH, which MQTT 3.1.1 §4.3.3 forbids ("MUST NOT re-send the PUBLISH once it has sent
the corresponding PUBREL") and which any broker must then store as a new message. The test checks that
no attempt failed, so a slow restart shows as that, not as a duplicate.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from .paho_driver import PROTOCOLS, V5, PahoClient  # type: ignore[import-not-found]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

COUNT = 300
RECONNECT_S = 4


@pytest.mark.parametrize("members", [1, 2], ids=["subscriber", "shared-group"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_qos2_delivery_exactly_once_across_sigkill(
    new_proxy: Callable[..., Any], protocol: int, members: int
) -> None:
    proxy = new_proxy()
    port = proxy.port
    expiry = 3600 if protocol == V5 else None
    received: collections.Counter[bytes] = collections.Counter()
    arrivals: queue.Queue[bytes] = queue.Queue()
    lock = threading.Lock()
    failed_attempts: list[str] = []

    def on_connect_fail(client: Any, userdata: Any) -> None:
        failed_attempts.append(client._client_id.decode())

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        with lock:
            received[message.payload] += 1
        arrivals.put(message.payload)
        time.sleep(0.005)  # a slow device: deliveries are still in flight when the proxy dies

    subs = []
    for n in range(members):
        sub = PahoClient(port, f"qos2-dev{n}", protocol, clean=False, expiry=expiry)
        sub.paho.reconnect_delay_set(min_delay=RECONNECT_S, max_delay=RECONNECT_S)
        sub.paho.on_connect_fail = on_connect_fail
        sub.paho.on_message = on_message
        assert sub.subscribe(("$share/g/crash/q2" if members > 1 else "crash/q2", 2)) == [2]
        subs.append(sub)
    pub = PahoClient(port, "qos2-pub", protocol, clean=False, expiry=expiry)
    pub.paho.reconnect_delay_set(min_delay=RECONNECT_S, max_delay=RECONNECT_S)
    pub.paho.on_connect_fail = on_connect_fail
    sent: list[Any] = []

    def stream() -> None:  # paced, so that publishing goes on across the kill (paho queues meanwhile)
        for i in range(COUNT):
            sent.append(pub.paho.publish("crash/q2", b"m%03d" % i, qos=2))
            time.sleep(0.004)

    publisher = threading.Thread(target=stream, daemon=True)
    publisher.start()
    for _ in range(COUNT // 4):
        arrivals.get(timeout=10)
    proxy.kill()  # SIGKILL, mid-stream
    assert len(received) < COUNT, "the stream finished before the kill; nothing was tested"
    assert len(sent) < COUNT, "the publisher finished before the kill; its side was not tested"
    proxy.start(f"127.0.0.1:{port}", attempts=10)
    deadline = time.monotonic() + 60
    while len(received) < COUNT and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # anything delivered twice would show up now
    publisher.join(5)
    assert len(sent) == COUNT  # (paho queues what is published while disconnected and sends it later)
    for sub in subs:
        sub.paho.loop_stop()
    pub.paho.loop_stop()
    assert not failed_attempts, f"a reconnect attempt found the proxy still down: {failed_attempts}"
    missing = [b"m%03d" % i for i in range(COUNT) if b"m%03d" % i not in received]
    twice = {payload: n for payload, n in received.items() if n > 1}
    assert not missing, f"lost {len(missing)}: {missing[:10]}"
    assert not twice, f"delivered more than once: {twice}"
    assert sum(received.values()) == COUNT

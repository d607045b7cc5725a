"""Real MQTT clients against the gateway: paho-mqtt 2.x (3.1.1 and 5.0) and Debian mosquitto-clients.

Each test runs the proxy in-process (trio) and the blocking client code in a worker thread. That a message
does NOT arrive is checked with a marker published after it: the marker must be the next message (a
subscription's messages arrive in store order).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import trio
import trio.testing
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqproxy.server import ServerHandle
from mqproxy.settings import Settings

from ..conftest import wait_until, wait_until_sync  # type: ignore[import-not-found]
from ..mqtt.conftest import running_server  # type: ignore[import-not-found]
from .paho_driver import PROTOCOLS, V5, V311, PahoClient  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e


async def in_thread(fn: Callable[..., None], *args: Any) -> None:
    await trio.to_thread.run_sync(fn, *args)


@pytest.fixture
async def server(log_sink: Any) -> AsyncIterator[ServerHandle]:
    async with running_server(Settings.for_tests()) as handle:
        yield handle


@pytest.fixture
def port(server: ServerHandle) -> int:
    return server.address[1]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_paho_qos_levels_and_wildcards(port: int, protocol: int) -> None:
    def scenario() -> None:
        sub = PahoClient(port, "sub", protocol)
        assert sub.subscribe(("t/+/x", 2), ("t/#", 0)) == [2, 0]
        pub = PahoClient(port, "pub", protocol)
        for qos in (0, 1, 2):
            pub.publish("t/a/x", b"q%d" % qos, qos)
        got = sorted((m.payload, m.qos) for m in (sub.get() for _ in range(6)))
        assert got == [(b"q0", 0), (b"q0", 0), (b"q1", 0), (b"q1", 1), (b"q2", 0), (b"q2", 2)]
        pub.publish("$SYS/t", b"hidden", 1)
        pub.publish("t/end/x", b"end", 1)  # one copy per subscription, each after anything before it
        assert [sub.get().payload for _ in range(2)] == [b"end", b"end"]
        sub.close()
        pub.close()

    await in_thread(scenario)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_paho_retained_set_replace_clear(port: int, protocol: int) -> None:
    def scenario() -> None:
        pub = PahoClient(port, "pub", protocol)
        pub.publish("r/a", b"one", 1, retain=True)
        pub.publish("r/a", b"two", 1, retain=True)
        pub.publish("r/b", b"gone", 1, retain=True)
        pub.publish("r/b", b"", 1, retain=True)
        sub = PahoClient(port, "sub", protocol)
        sub.subscribe(("r/#", 1))
        message = sub.get()
        assert (message.topic, message.payload, message.retain) == ("r/a", b"two", True)
        pub.publish("r/end", b"end", 1)  # live, after the retained ones
        assert sub.get().payload == b"end"
        sub.close()
        pub.close()

    await in_thread(scenario)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_paho_will_on_abrupt_close(port: int, protocol: int, log_sink: Any) -> None:
    def closed(client_id: str) -> bool:
        """The server is done with ``client_id``'s connection (will included): its conn.closed is logged."""
        conns = {e["conn_id"] for e in log_sink.named("request") if e.get("client_id") == client_id}
        return any(e["conn_id"] in conns for e in log_sink.named("conn.closed"))

    def scenario() -> None:
        watcher = PahoClient(port, "watcher", protocol)
        watcher.subscribe(("status/#", 1))
        device = PahoClient(port, "device", protocol, will=("status/device", b"offline", 1, False))
        device.drop()
        message = watcher.get()
        assert (message.topic, message.payload) == ("status/device", b"offline")
        polite = PahoClient(port, "polite", protocol, will=("status/polite", b"offline", 1, False))
        polite.close()
        wait_until_sync(lambda: closed("polite"))
        marker = PahoClient(port, "marker", protocol)
        marker.publish("status/end", b"end", 1)
        assert watcher.get().payload == b"end"  # no will before it
        marker.close()
        watcher.close()

    await in_thread(scenario)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_paho_persistent_session_offline_queue(port: int, protocol: int) -> None:
    def scenario() -> None:
        sub = PahoClient(port, "durable", protocol, clean=False, expiry=300)
        assert not sub.session_present
        sub.subscribe(("q/#", 1))
        sub.close()
        pub = PahoClient(port, "pub", protocol)
        for i in range(5):
            pub.publish("q/x", b"%d" % i, 1)
        sub = PahoClient(port, "durable", protocol, clean=False, expiry=300)
        assert sub.session_present
        assert [sub.get().payload for _ in range(5)] == [b"0", b"1", b"2", b"3", b"4"]
        sub.close()
        pub.close()

    await in_thread(scenario)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_paho_takeover(port: int, protocol: int) -> None:
    def scenario() -> None:
        first = PahoClient(port, "same", protocol, reconnect=False)  # else it takes "same" back
        second = PahoClient(port, "same", protocol)
        rc = first.disconnected.get(timeout=5)
        if protocol == V5:
            assert rc.value == 0x8E  # Session taken over
        second.subscribe(("k", 0))
        second.publish("k", b"alive")
        assert second.get().payload == b"alive"
        first.paho.loop_stop()
        second.close()

    await in_thread(scenario)


async def test_paho_v5_properties_alias_expiry_no_local(port: int) -> None:
    def scenario() -> None:
        sub = PahoClient(port, "sub5", V5)
        options = mqtt.SubscribeOptions(qos=1, noLocal=True)
        sub_props = Properties(PacketTypes.SUBSCRIBE)
        sub_props.SubscriptionIdentifier = 42
        sub.subscribe(("v5/#", options), properties=sub_props)
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("k", "v"), ("k", "w")]
        props.MessageExpiryInterval = 60
        props.ContentType = "text/plain"
        props.ResponseTopic = "v5/reply"
        props.CorrelationData = b"\x01\x02"
        props.TopicAlias = 1
        pub = PahoClient(port, "pub5", V5)
        pub.publish("v5/a", b"full", 1, properties=props)
        alias_only = Properties(PacketTypes.PUBLISH)
        alias_only.TopicAlias = 1
        pub.publish("", b"aliased", 1, properties=alias_only)
        first, second = sub.get(), sub.get()
        assert (first.topic, first.payload, second.topic, second.payload) == (
            "v5/a",
            b"full",
            "v5/a",
            b"aliased",
        )
        p = first.properties
        assert p.UserProperty == [("k", "v"), ("k", "w")]
        assert p.ContentType == "text/plain"
        assert p.ResponseTopic == "v5/reply"
        assert p.CorrelationData == b"\x01\x02"
        assert 58 <= p.MessageExpiryInterval <= 60
        assert p.SubscriptionIdentifier == [42]
        sub.publish("v5/own", b"no-local")
        sub.publish("elsewhere", b"flush", 1)  # acknowledged: the server has stored "no-local" too
        pub.publish("v5/end", b"end", 1)
        assert sub.get().payload == b"end"
        sub.close()
        pub.close()

    await in_thread(scenario)


async def test_paho_v5_session_expiry_and_receive_maximum(
    port: int, server: ServerHandle, steered_clock: trio.testing.MockClock
) -> None:
    def receive_maximum_then_leave() -> None:
        props = Properties(PacketTypes.CONNECT)
        props.ReceiveMaximum = 1
        sub = PahoClient(port, "rm", V5, connect_props=props)
        sub.subscribe(("rm", 1))
        pub = PahoClient(port, "pub", V5)
        for i in range(20):
            pub.publish("rm", b"%d" % i, 1)
        assert [sub.get().payload for _ in range(20)] == [b"%d" % i for i in range(20)]
        sub.close()
        pub.close()
        short = PahoClient(port, "short", V5, clean=False, expiry=1)
        short.subscribe(("se", 1))
        short.close()

    def come_back() -> None:
        again = PahoClient(port, "short", V5, clean=False, expiry=1)
        assert not again.session_present
        again.close()

    sessions = server.state.protocols.mqtt.gateway.sessions
    await in_thread(receive_maximum_then_leave)
    await wait_until(lambda: "short" in sessions and sessions["short"].connection is None)
    steered_clock.jump(1)  # the session expiry interval
    await wait_until(lambda: "short" not in sessions)
    await in_thread(come_back)


async def test_paho_v5_shared_subscription(port: int) -> None:
    def scenario() -> None:
        members = [PahoClient(port, f"member{i}", V5) for i in range(2)]
        for member in members:
            member.subscribe(("$share/workers/jobs/+", 1))
        pub = PahoClient(port, "pub", V5)
        for i in range(40):
            pub.publish("jobs/x", b"%d" % i, 1)
        got: list[bytes] = []

        def all_arrived() -> bool:
            for member in members:
                while not member.messages.empty():
                    got.append(member.messages.get().payload)
            return len(got) >= 40

        wait_until_sync(all_arrived)
        assert sorted(got) == sorted(b"%d" % i for i in range(40))  # each exactly once
        for member in members:
            member.close()
        pub.close()

    await in_thread(scenario)


async def test_paho_session_survives_proxy_restart(tmp_path: Path, log_sink: Any) -> None:
    settings = Settings.for_tests(tmp_path)

    def before(port: int) -> None:
        sub = PahoClient(port, "dev", V311, clean=False)
        sub.subscribe(("home/+/temp", 1))
        sub.close()
        pub = PahoClient(port, "pub", V311)
        pub.publish("home/k/temp", b"21.5", 1)
        pub.publish("home/cfg", b"kept", 1, retain=True)
        pub.close()

    def after(port: int) -> None:
        sub = PahoClient(port, "dev", V311, clean=False)
        assert sub.session_present
        assert sub.get().payload == b"21.5"
        sub.subscribe(("home/cfg", 0))
        retained = sub.get()
        assert (retained.payload, retained.retain) == (b"kept", True)
        sub.close()

    async with running_server(settings) as handle:
        await in_thread(before, handle.address[1])
    async with running_server(settings) as handle:
        await in_thread(after, handle.address[1])


async def test_mosquitto_clients_smoke(port: int, log_sink: Any) -> None:
    if shutil.which("mosquitto_pub") is None or shutil.which("mosquitto_sub") is None:
        pytest.skip("mosquitto-clients is not installed (apt-get install mosquitto-clients)")

    def subscribed() -> bool:
        return any(e["op"] == "SUBSCRIBE" and e.get("topic") == "smoke/#" for e in log_sink.named("request"))

    def scenario() -> None:
        sub = subprocess.Popen(
            [
                "mosquitto_sub",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-t",
                "smoke/#",
                "-q",
                "1",
                "-C",
                "3",
                "-v",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        wait_until_sync(subscribed)
        for i in range(3):
            subprocess.run(
                [
                    "mosquitto_pub",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-t",
                    f"smoke/{i}",
                    "-m",
                    f"m{i}",
                    "-q",
                    "1",
                ],
                check=True,
                timeout=10,
            )
        out, _ = sub.communicate(timeout=10)
        assert out.splitlines() == ["smoke/0 m0", "smoke/1 m1", "smoke/2 m2"]
        subprocess.run(
            [
                "mosquitto_pub",
                "-V",
                "mqttv5",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-t",
                "smoke5",
                "-m",
                "r",
                "-r",
            ],
            check=True,
            timeout=10,
        )
        got = subprocess.run(
            ["mosquitto_sub", "-V", "mqttv5", "-h", "127.0.0.1", "-p", str(port), "-t", "smoke5", "-C", "1"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        assert got.stdout.strip() == "r"

    await in_thread(scenario)


@pytest.mark.slow
@pytest.mark.parametrize("qos", [0, 1])
async def test_paho_throughput_one_publisher_one_subscriber(tmp_path: Path, log_sink: Any, qos: int) -> None:
    """Publish→deliver rate with one paho publisher and one subscriber (in-process server: the clients
    share its GIL, so `/tmp`-style out-of-process runs give higher figures). Prints msgs/s."""
    settings = Settings.for_tests(tmp_path, log={"request_sample_rate": 0.0})
    count = 5000

    def scenario(port: int) -> float:
        sub = PahoClient(port, "bench-sub", V311)
        sub.subscribe(("bench/t", qos))
        pub = PahoClient(port, "bench-pub", V311)
        started = time.perf_counter()
        infos = [pub.paho.publish("bench/t", b"x" * 64, qos=qos) for _ in range(count)]
        for _ in range(count):
            sub.get(timeout=30)
        elapsed = time.perf_counter() - started
        infos[-1].wait_for_publish(5)
        sub.close()
        pub.close()
        return count / elapsed

    async with running_server(settings) as handle:
        rate = await trio.to_thread.run_sync(scenario, handle.address[1])
    print(f"paho QoS{qos}: {rate:,.0f} msgs/s publish->deliver ({count} x 64 B, embedded store)")
    assert rate > 100  # sanity floor on a shared 2-core machine; see the report for measured figures

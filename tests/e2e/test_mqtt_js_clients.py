"""MQTT.js (npm mqtt 5.16.0) against ``mqproxy serve``: MQTT 3.1.1 (protocolVersion 4) and 5.0, over TCP
and WebSocket, plus MQTT.js ↔ paho-mqtt interop.

The client runs as ``node tests/e2e/mqtt_node/client.js`` (one JSON line per event, see its header); every
test uses its own topics and client ids on the module's shared proxy. Install MQTT.js with
``scripts/setup-mqtt-node.sh`` (the tests skip without it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from .conftest import JsonLineReader  # type: ignore[import-not-found]
from .paho_driver import PROTOCOLS, PahoClient  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

NODE_DIR = Path(__file__).resolve().parent / "mqtt_node"
LINGER_MS = "300"  # how long a subscriber keeps listening after its last expected message


class NodeRun:
    """One ``client.js`` child; its JSON events fill ``reader.events`` as they are printed."""

    def __init__(self, node: str, args: list[str], stderr_path: Path) -> None:
        self.args = args
        self.stderr_path = stderr_path
        with open(stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [node, "client.js", *args],
                cwd=NODE_DIR,
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
            )
        self.reader = JsonLineReader(self.proc.stdout)

    def wait_event(self, name: str, timeout: float = 10.0) -> dict[str, Any]:
        event = self.reader.wait_for(lambda e: e.get("event") == name, timeout)
        if event is None:
            pytest.fail(f"no {name!r} event\n{self.describe()}")
        return event

    def finish(self, timeout: float = 20.0) -> NodeRun:
        """Wait for exit; the run must end with status 0 and a ``done`` event, printing only JSON objects."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(5)
        assert self.proc.returncode == 0, self.describe()
        assert self.of("done"), self.describe()
        assert len(self.reader.lines) == len(self.reader.events), self.describe()
        return self

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.reader.events if e.get("event") == name]

    def messages(self) -> list[tuple[str, bytes, int, bool]]:
        return [
            (m["topic"], bytes.fromhex(m["payload_hex"]), m["qos"], m["retain"]) for m in self.of("message")
        ]

    def describe(self) -> str:
        stderr = self.stderr_path.read_text(errors="replace")[-3000:]
        return (
            f"client.js {' '.join(self.args)[:300]}\nrc={self.proc.returncode}\n{self.reader.tail()}\n"
            f"{stderr}"
        )


class MqttJs:
    """Starts ``client.js`` runs against one proxy; ``url(ws=True)`` is the WebSocket endpoint."""

    def __init__(self, node: str, port: int, workdir: Path) -> None:
        self.node = node
        self.port = port
        self.workdir = workdir
        self._runs = 0

    def url(self, ws: bool = False) -> str:
        return f"ws://127.0.0.1:{self.port}/mqtt" if ws else f"mqtt://127.0.0.1:{self.port}"

    def start(self, command: str, client_id: str, protocol: int, *args: str, ws: bool = False) -> NodeRun:
        self._runs += 1
        argv = [command, self.url(ws), "--id", client_id, "--protocol", str(protocol), *args]
        return NodeRun(self.node, argv, self.workdir / f"{self._runs}-{client_id}.stderr")

    def subscriber(
        self,
        client_id: str,
        protocol: int,
        *filters: str,
        expect: int,
        ws: bool = False,
        extra: tuple[str, ...] = (),
    ) -> NodeRun:
        """A subscriber that has its SUBACK; it exits after ``expect`` messages plus the linger time."""
        args = [a for f in filters for a in ("--topic", f)]
        run = self.start(
            "sub", client_id, protocol, *args, "--expect", str(expect), "--linger", LINGER_MS, *extra, ws=ws
        )
        if filters:
            run.wait_event("subscribed")
        return run

    def publish(
        self,
        client_id: str,
        protocol: int,
        *messages: dict[str, Any],
        ws: bool = False,
        auto_alias: bool = False,
    ) -> NodeRun:
        args = [a for m in messages for a in ("--publish", json.dumps(m))]
        if auto_alias:
            args.append("--auto-alias")
        return self.start("pub", client_id, protocol, *args, ws=ws).finish()


def message(
    topic: str, payload: bytes, qos: int = 0, retain: bool = False, **properties: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"topic": topic, "payload_hex": payload.hex(), "qos": qos, "retain": retain}
    if properties:
        spec["properties"] = properties
    return spec


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    if exe is None or not (NODE_DIR / "node_modules" / "mqtt" / "package.json").exists():
        pytest.skip("MQTT.js is not installed; run scripts/setup-mqtt-node.sh")
    return exe


@pytest.fixture
def js(node: str, proxy: Any, tmp_path: Path) -> MqttJs:
    return MqttJs(node, proxy.port, tmp_path)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mqttjs_qos_round_trip_and_wildcards(js: MqttJs, protocol: int) -> None:
    p = f"rt{protocol}"
    sub = js.subscriber(f"{p}-sub", protocol, f"{p}/+/x:2", f"{p}/#:0", expect=7)
    assert sub.of("subscribed")[0]["granted"] == [
        {"topic": f"{p}/+/x", "qos": 2},
        {"topic": f"{p}/#", "qos": 0},
    ]
    body = bytes(range(256)) * 100  # 25 KiB, every byte value
    js.publish(
        f"{p}-pub",
        protocol,
        *(message(f"{p}/a/x", bytes([qos]) + body, qos) for qos in (0, 1, 2)),
        message(f"{p}/a/y/z", b"hash only", 1),  # '#' matches several levels, '+' only one
        message(f"{p}x/a/x", b"other prefix", 1),
        message(f"{p}/a/x/deeper", b"hash again", 2),
    )
    sub.finish()
    got = sorted(sub.messages())
    expected = [
        (f"{p}/a/x", bytes([qos]) + body, min(qos, granted), False) for qos in (0, 1, 2) for granted in (0, 2)
    ]
    expected += [(f"{p}/a/y/z", b"hash only", 0, False), (f"{p}/a/x/deeper", b"hash again", 0, False)]
    assert got == sorted(expected)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mqttjs_retained_late_subscriber_and_clear(js: MqttJs, protocol: int) -> None:
    p = f"ret{protocol}"
    js.publish(
        f"{p}-pub",
        protocol,
        message(f"{p}/a", b"one", 1, retain=True),
        message(f"{p}/a", b"two", 1, retain=True),
        message(f"{p}/b", b"gone", 1, retain=True),
        message(f"{p}/b", b"", 1, retain=True),
    )
    late = js.subscriber(f"{p}-late", protocol, f"{p}/#:1", expect=1).finish()
    assert late.messages() == [(f"{p}/a", b"two", 1, True)]
    js.publish(f"{p}-clear", protocol, message(f"{p}/a", b"", 0, retain=True))
    later = js.subscriber(f"{p}-later", protocol, f"{p}/#:1", expect=0).finish()
    assert later.messages() == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mqttjs_will_on_abrupt_close_only(js: MqttJs, protocol: int) -> None:
    p = f"will{protocol}"
    watcher = js.subscriber(f"{p}-watcher", protocol, f"{p}/#:1", expect=1)
    props = {"contentType": "text/plain", "userProperties": {"why": "crash"}} if protocol == 5 else {}
    polite = json.dumps(message(f"{p}/polite", b"offline", 1, **props))
    crashed = json.dumps(message(f"{p}/device", b"offline", 1, **props))
    js.start("will", f"{p}-polite", protocol, "--will", polite, "--then", "end").finish()
    js.start("will", f"{p}-device", protocol, "--will", crashed, "--then", "destroy").finish()
    watcher.finish()
    assert watcher.messages() == [(f"{p}/device", b"offline", 1, False)]
    if protocol == 5:
        received = watcher.of("message")[0]["properties"]
        assert (received["contentType"], received["userProperties"]) == ("text/plain", {"why": "crash"})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mqttjs_persistent_session_offline_queue(js: MqttJs, protocol: int) -> None:
    p = f"ps{protocol}"
    durable = ("--persistent", "300")
    first = js.subscriber(f"{p}-durable", protocol, f"{p}/#:1", expect=0, extra=durable).finish()
    assert first.of("connected")[0]["session_present"] is False
    js.publish(f"{p}-pub", protocol, *(message(f"{p}/x", b"%d" % i, 1) for i in range(5)))
    again = js.subscriber(f"{p}-durable", protocol, expect=5, extra=durable).finish()
    assert again.of("connected")[0]["session_present"] is True
    assert again.messages() == [(f"{p}/x", b"%d" % i, 1, False) for i in range(5)]


def test_mqttjs_v5_user_properties_and_topic_alias(js: MqttJs) -> None:
    sub = js.subscriber("ua-sub", 5, "ua/#:1", expect=5)
    users = {"k": ["v", "w"], "lang": "js"}
    explicit = js.publish(
        "ua-pub",
        5,
        message("ua/t", b"full", 1, topicAlias=1, userProperties=users),
        message("", b"aliased", 1, topicAlias=1),
        message("ua/u", b"rebound", 1, topicAlias=1),  # the same alias now names another topic
    )
    assert explicit.of("connected")[0]["properties"]["topicAliasMaximum"] >= 1
    assert [(e["topic"], e["alias"]) for e in explicit.of("sent")] == [("ua/t", 1), ("", 1), ("ua/u", 1)]
    auto = js.publish(
        "ua-auto", 5, message("ua/auto", b"a1", 1), message("ua/auto", b"a2", 1), auto_alias=True
    )
    sent = auto.of("sent")
    assert [e["topic"] for e in sent] == ["ua/auto", ""]
    assert sent[0]["alias"] == sent[1]["alias"] is not None
    sub.finish()
    assert sub.messages() == [
        ("ua/t", b"full", 1, False),
        ("ua/t", b"aliased", 1, False),
        ("ua/u", b"rebound", 1, False),
        ("ua/auto", b"a1", 1, False),
        ("ua/auto", b"a2", 1, False),
    ]
    properties = [m["properties"] for m in sub.of("message")]
    assert properties[0]["userProperties"] == users
    assert all("userProperties" not in p for p in properties[1:])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mqttjs_websocket_publish_subscribe(js: MqttJs, protocol: int) -> None:
    p = f"ws{protocol}"
    ws_sub = js.subscriber(f"{p}-ws-sub", protocol, f"{p}/#:1", expect=2, ws=True)
    tcp_sub = js.subscriber(f"{p}-tcp-sub", protocol, f"{p}/#:2", expect=2)
    big = bytes(range(256)) * 200  # 50 KiB: several WebSocket frames' worth
    js.publish(f"{p}-ws-pub", protocol, message(f"{p}/big", big, 2), ws=True)
    js.publish(f"{p}-tcp-pub", protocol, message(f"{p}/small", b"from tcp", 1))
    expected = [(f"{p}/big", big, 1, False), (f"{p}/small", b"from tcp", 1, False)]
    assert ws_sub.finish().messages() == expected
    assert tcp_sub.finish().messages() == [(f"{p}/big", big, 2, False), (f"{p}/small", b"from tcp", 1, False)]


@pytest.fixture
def paho_clients() -> Iterator[list[PahoClient]]:
    made: list[PahoClient] = []
    yield made
    for client in made:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mqttjs_and_paho_interop(
    js: MqttJs, proxy: Any, paho_clients: list[PahoClient], protocol: int
) -> None:
    p = f"io{protocol}"
    watcher = PahoClient(proxy.port, f"{p}-paho-sub", protocol)
    paho_clients.append(watcher)
    assert watcher.rc == 0
    assert watcher.subscribe((f"{p}/js", 1)) == [1]
    payload = b"\x00from mqtt.js\xff"
    props = {"userProperties": {"origin": "mqtt.js"}} if protocol == 5 else {}
    js.publish(f"{p}-js-pub", protocol, message(f"{p}/js", payload, 1, **props))
    got = watcher.get()
    assert (got.topic, got.payload, got.qos) == (f"{p}/js", payload, 1)
    if protocol == 5:
        assert got.properties.UserProperty == [("origin", "mqtt.js")]

    js_sub = js.subscriber(f"{p}-js-sub", protocol, f"{p}/paho:2", expect=1)
    sender = PahoClient(proxy.port, f"{p}-paho-pub", protocol)
    paho_clients.append(sender)
    assert sender.rc == 0
    paho_props = None
    if protocol == 5:
        paho_props = Properties(PacketTypes.PUBLISH)
        paho_props.UserProperty = [("origin", "paho")]
    sender.publish(f"{p}/paho", b"from paho", 2, properties=paho_props)
    js_sub.finish()
    assert js_sub.messages() == [(f"{p}/paho", b"from paho", 2, False)]
    if protocol == 5:
        assert js_sub.of("message")[0]["properties"]["userProperties"] == {"origin": "paho"}

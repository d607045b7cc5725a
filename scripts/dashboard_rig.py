#!/usr/bin/env python3
"""A live set-up for the Grafana dashboard (``config/grafana/mqproxy.json``): ``mqproxy serve`` on the
embedded store, a second node and a Message Connector (``mqproxy connect --metrics``) copying one topic
from the first to the second, a stock Prometheus scraping the first node's and the connector's
``/metrics`` every second, and the traffic that fills the dashboard's panels. Used by
``tests/e2e/test_grafana_prometheus.py`` and ``scripts/render_dashboard.py``; needs mqproxy installed with
its ``test`` extra (paho-mqtt) and Go (Prometheus is built once into the cache, ``prometheus_server.py``).

Contracts:

* :func:`running_rig` starts everything on 127.0.0.1 with ephemeral ports in ``workdir`` and stops it all
  on exit; each process's log stays in ``workdir``. Prometheus scrapes job ``mqproxy`` (the node) and job
  ``mqproxy-connect`` (the connector).
* :meth:`Rig.traffic` runs one round: MQTT publishes (QoS 0 and 1) from a paho client that a second paho
  client receives through a wildcard subscription; remoting sends over the project's remoting client
  (:mod:`mqproxy.connector.client`) to topic :data:`TOPIC`, which the connector copies (translating the
  offsets of :data:`GROUP` into checkpoints); consumer group :data:`GROUP` pulling and committing all but
  ``lag_per_queue`` messages of each queue (its lag); one request with an unsupported code (an
  ``outcome="error"`` request); one connection of bytes no protocol starts with (a negotiation failure).
  It returns once the subscriber has every message of the round.
* :meth:`Rig.wait_scraped` returns once Prometheus holds a scrape of every target taken after a moment;
  :func:`running_rig` yields only once both targets have been scraped (Prometheus's service discovery hands
  targets to the scrapers about 5 s after start, even static ones).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prometheus_server import PrometheusServer, build  # scripts/ is not a package

from mqproxy.backends.rocketmq import wire
from mqproxy.connector.client import ClusterClient
from mqproxy.connector.rules import ClusterSpec
from mqproxy.model.types import Message
from mqproxy.remoting_client import ClientConfig, open_pool

TOPIC = "DashOrders"
GROUP = "DashGroup"
QUEUES = 4
MQTT_TOPICS = ("dash/sensor/1", "dash/sensor/2", "dash/gate/1")
START_LIMIT_S = 60.0
WAIT_LIMIT_S = 60.0
#: A request code no RocketMQ version defines: the proxy answers REQUEST_CODE_NOT_SUPPORTED.
UNSUPPORTED_CODE = 9999


class RigError(RuntimeError):
    """A process of the set-up did not start or a wait ran out; the message says which."""


def wait_for(predicate: Any, what: str, limit_s: float = WAIT_LIMIT_S) -> None:
    """Poll ``predicate()`` until true; :class:`RigError` naming ``what`` after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RigError(f"{what}: not after {limit_s:.0f} s")
        time.sleep(0.05)


@dataclass
class Child:
    """A child process whose JSON-lines log is ``log``."""

    proc: subprocess.Popen[bytes]
    log: Path

    def events(self, name: str) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = self.log.read_text(errors="replace").splitlines()
        return [e for e in (json.loads(ln) for ln in lines if ln.startswith("{")) if e.get("event") == name]

    def wait_event(self, name: str) -> dict[str, Any]:
        def seen() -> bool:
            if self.proc.poll() is not None:
                raise RigError(f"{self.log.stem} exited with {self.proc.returncode} before {name}")
            return bool(self.events(name))

        wait_for(seen, f"{self.log.stem}: event {name}", START_LIMIT_S)
        return self.events(name)[-1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _spawn(workdir: Path, name: str, *args: str) -> Child:
    log = workdir / f"{name}.log"
    env = {**os.environ, "MQPROXY_METRICS_LAG_REFRESH_S": "0", "MQPROXY_LOG_FLUSH_INTERVAL_MS": "0"}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mqproxy", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    return Child(proc, log)


def _proxy(workdir: Path, name: str) -> tuple[Child, str]:
    (workdir / name).mkdir(parents=True, exist_ok=True)
    child = _spawn(workdir, name, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(workdir / name),
                   "--log-format", "json")
    return child, str(child.wait_event("proxy.started")["listen"])


def _rules(source: str, target: str) -> str:
    return (
        '[connector]\nname = "dash"\nrefresh_s = 0.5\nlag_interval_s = 0.5\nrequest_timeout_s = 2.0\n'
        "checkpoint_interval_s = 0.5\n"
        f'[clusters.a]\nnamesrv = "{source}"\n[clusters.b]\nnamesrv = "{target}"\n'
        f'[[rules]]\nname = "orders"\nsource = "a"\ntarget = "b"\ntopic = "{TOPIC}"\nstart = "earliest"\n'
        f'groups = ["{GROUP}"]\n'
    )


@dataclass
class Rig:
    workdir: Path
    address: str  # the node's host:port
    connector_metrics: str
    prometheus: PrometheusServer
    children: list[Child]
    received: list[str] = field(default_factory=list)
    sent_mqtt = 0
    sent_remoting = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _clients: list[mqtt.Client] = field(default_factory=list)
    _rounds = 0

    # --- MQTT -------------------------------------------------------------------------------------

    def _mqtt(self, client_id: str, protocol: mqtt.MQTTProtocolVersion) -> mqtt.Client:
        host, port = self.address.rsplit(":", 1)
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
        connected = threading.Event()
        client.on_connect = lambda *_: connected.set()
        client.connect(host, int(port), keepalive=30)
        client.loop_start()
        wait_for(connected.is_set, f"MQTT CONNACK for {client_id}")
        self._clients.append(client)
        return client

    def start_mqtt(self) -> None:
        """One subscriber (MQTT 5, ``dash/#`` QoS 1) and one publisher (MQTT 3.1.1), kept open."""
        subscriber = self._mqtt("dash-sub", mqtt.MQTTv5)

        def on_message(_c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
            with self._lock:
                self.received.append(msg.topic)

        subscribed = threading.Event()
        subscriber.on_message = on_message
        subscriber.on_subscribe = lambda *_: subscribed.set()
        subscriber.subscribe("dash/#", qos=1)
        wait_for(subscribed.is_set, "SUBACK for dash/#")
        self._mqtt("dash-pub", mqtt.MQTTv311)

    def publish(self, count: int) -> None:
        publisher = self._clients[-1]
        for n in range(count):
            publisher.publish(MQTT_TOPICS[n % len(MQTT_TOPICS)], f"reading {n}".encode(), qos=n % 2)
        self.sent_mqtt += count
        wait_for(lambda: len(self.received) >= self.sent_mqtt, f"{self.sent_mqtt} MQTT deliveries")

    # --- remoting ---------------------------------------------------------------------------------

    async def _remoting(self, count: int, lag_per_queue: int) -> None:
        async with open_pool(ClientConfig()) as pool:
            c = ClusterClient(ClusterSpec("dash", (self.address,), self.address), pool, 5.0)
            if TOPIC not in await c.topics():
                await c.create_topic(TOPIC, QUEUES)
            route = await c.route(TOPIC)
            assert route is not None
            share = next(iter(route.brokers.values()))
            for n in range(count):
                body = f"order {self.sent_remoting + n}".encode()
                await c.send(share.broker, n % QUEUES, [Message(TOPIC, body, properties={"TAGS": "o"})],
                             "dash-producer")
            for q in range(QUEUES):
                high = await c.max_offset(TOPIC, share.broker, q)
                done = max(0, high - lag_per_queue)
                if done:
                    await c.pull(GROUP, TOPIC, share.broker, q, max(0, done - 32), 32)
                await c.commit_offset(GROUP, TOPIC, share.broker, q, done)
            await c.call(share.broker, wire.command(UNSUPPORTED_CODE))  # answered as an error
        self.sent_remoting += count

    def _garbage_connection(self) -> None:
        host, port = self.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"\xffdashboard: not a protocol\r\n\r\n" * 4)
            with contextlib.suppress(OSError):
                while s.recv(4096):
                    pass

    def traffic(self, *, mqtt_count: int = 20, remoting_count: int = 20, lag_per_queue: int = 2) -> None:
        """One round of every kind of traffic (see the module contracts)."""
        if not self._clients:
            self.start_mqtt()
        self.publish(mqtt_count)
        trio.run(self._remoting, remoting_count, lag_per_queue)
        self._garbage_connection()
        self._rounds += 1

    # --- Prometheus -------------------------------------------------------------------------------

    def wait_scraped(self, after: float) -> None:
        """Until every target has a successful scrape taken after Unix time ``after``."""

        def scraped() -> bool:
            # timestamp() of a bare selector is the sample's time (of an expression, the query's time)
            times = self.prometheus.api("query", query="timestamp(up)").get("data", {}).get("result", [])
            ups = self.prometheus.api("query", query="up").get("data", {}).get("result", [])
            return (len(times) == 2 and all(float(s["value"][1]) > after for s in times)
                    and all(s["value"][1] == "1" for s in ups))

        wait_for(scraped, f"a Prometheus scrape of both targets after {after:.3f}")

    def close(self) -> None:
        for client in self._clients:
            client.disconnect()
            client.loop_stop()
        self._clients.clear()


@contextlib.contextmanager
def running_rig(workdir: Path, *, scrape_interval_s: float = 1.0) -> Iterator[Rig]:
    """Everything of the module contracts started in ``workdir``, stopped on exit."""
    children: list[Child] = []
    prometheus: PrometheusServer | None = None
    rig: Rig | None = None
    try:
        node, address = _proxy(workdir, "node")
        children.append(node)
        peer, peer_address = _proxy(workdir, "peer")
        children.append(peer)
        rules = workdir / "rules.toml"
        rules.write_text(_rules(address, peer_address), encoding="utf-8")
        connector = _spawn(workdir, "connect", "connect", "--config", str(rules), "--metrics", "127.0.0.1:0")
        children.append(connector)
        connector_metrics = str(connector.wait_event("connector.started")["listen"])
        prometheus = PrometheusServer(
            build(), workdir / "prometheus", {"mqproxy": [address], "mqproxy-connect": [connector_metrics]},
            scrape_interval_s=scrape_interval_s,
        )
        began = time.time()
        prometheus.start()
        rig = Rig(workdir, address, connector_metrics, prometheus, children)
        rig.wait_scraped(began)  # Prometheus hands new targets to its scrapers about 5 s after start
        yield rig
    finally:
        if rig is not None:
            rig.close()
        if prometheus is not None:
            prometheus.stop()
        for child in reversed(children):
            child.stop()

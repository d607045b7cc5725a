"""Real C++-core RocketMQ clients against the remoting layer with the broker services: a consumer that
fails a message sees it again with a growing reconsume count (CONSUMER_SEND_MSG_BACK, %RETRY%), and a
delayed message arrives no earlier than its level.

The server runs in-process on a thread (``serve_remoting`` over a loopback TCP listener, the embedded
broker over the in-memory store with short delay levels: level n waits n seconds), so the test does not
depend on how ``mqproxy serve`` wires the services. The client drivers are written to a temp dir from
:data:`DRIVER` and run with the clients' own venvs (see ``tests/e2e/conftest.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.backends.embedded.services import ServiceSettings
from mqproxy.remoting.connection import serve_remoting
from mqproxy.remoting.context import RequestEvent, ServerContext
from mqproxy.remoting.registry import ConnectionRegistry

pytestmark = pytest.mark.e2e

CPP_CLIENTS = ("py044", "pycvs")
SEGFAULT = frozenset({-11, 139})
#: Level n waits n seconds, so retries (level 3 + reconsumeTimes) take 3 s, 4 s, ...
FAST_LEVELS = " ".join(f"{n}s" for n in range(1, 19))
_serial = itertools.count()

DRIVER = r'''
"""Failing consumer / delayed producer for the C++-core Python bindings; JSON lines on stdout."""
import json, os, sys, threading, time
from rocketmq.client import Message, Producer, PushConsumer

LOCK = threading.Lock()

def emit(obj):
    with LOCK:
        sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
        sys.stdout.flush()

def text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

def log_dir(client):
    setter = getattr(client, "set_log_root_path", None)
    if setter is not None:
        setter(os.path.join(os.path.expanduser("~"), "logs"))

def consume(namesrv, topic, group, fail_times, expect, timeout):
    done, ok = threading.Event(), [0]

    def on_message(msg):
        count = msg.reconsume_times
        emit({"event": "received", "t": time.time(), "reconsume_times": count, "body": text(msg.body),
              "msg_id": msg.id, "topic": msg.topic})
        if count < fail_times:
            raise RuntimeError("failing on purpose")  # the binding answers RECONSUME_LATER
        with LOCK:
            ok[0] += 1
            if ok[0] >= expect:
                done.set()

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    log_dir(consumer)
    consumer.subscribe(topic, on_message, "*")
    consumer.start()
    emit({"event": "started"})
    reached = done.wait(timeout)
    time.sleep(1.0)
    emit({"event": "done", "timed_out": not reached})
    os._exit(0 if reached else 1)

def produce(namesrv, topic, group, body, delay_level):
    producer = Producer(group)
    producer.set_namesrv_addr(namesrv)
    log_dir(producer)
    producer.start()
    msg = Message(topic)
    msg.set_tags("TagA")
    msg.set_body(body)
    if delay_level:
        msg.set_delay_time_level(delay_level)
    started = time.time()
    result = producer.send_sync(msg)
    emit({"event": "sent", "t": started, "status": result.status.name, "msg_id": result.msg_id})
    producer.shutdown()
    emit({"event": "done"})

if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "consume":
        consume(args[0], args[1], args[2], int(args[3]), int(args[4]), float(args[5]))
    else:
        produce(args[0], args[1], args[2], args[3], int(args[4]))
'''


def unique(prefix: str) -> str:
    return f"{prefix}_{next(_serial)}_{uuid.uuid4().hex[:8]}"


class InProcessServer:
    """The remoting layer with broker services on 127.0.0.1:<free port>, run by trio on a thread."""

    def __init__(self) -> None:
        self.address = ""
        #: Every handled request (appended on the server thread; read it after the client finished).
        self.events: list[RequestEvent] = []
        self._ready = threading.Event()
        self._cancel: trio.CancelScope | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"in-process server did not start: {self._error!r}")
        return self.address

    def stop(self) -> None:
        if self._token is not None and self._cancel is not None:
            trio.from_thread.run_sync(self._cancel.cancel, trio_token=self._token)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by start() / the test
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        backend = InMemoryBackend(store_host=("127.0.0.1", port))
        registry = ConnectionRegistry()
        settings = ServiceSettings(delay_levels=FAST_LEVELS)
        async with open_embedded_broker(backend, settings) as broker:
            broker.add_check_back(registry.check_transaction)
            ctx = ServerContext("127.0.0.1", port, groups=registry)

            async def handle(stream: trio.SocketStream) -> None:
                host, peer_port = stream.socket.getpeername()[:2]
                try:
                    await serve_remoting(
                        stream, broker, ctx, peer=(host, peer_port), on_request=self.events.append
                    )
                finally:
                    await stream.aclose()

            with trio.CancelScope() as cancel:
                self._cancel, self._token = cancel, trio.lowlevel.current_trio_token()
                self.address = f"127.0.0.1:{port}"
                self._ready.set()
                await trio.serve_listeners(handle, listeners)


@pytest.fixture
def server() -> Iterator[InProcessServer]:
    running = InProcessServer()
    running.start()
    yield running
    running.stop()


@pytest.fixture(params=CPP_CLIENTS)
def cpp(request: pytest.FixtureRequest, client: Callable[[str], Any], tmp_path: Path) -> Any:
    """Each installed C++ client (:data:`CPP_CLIENTS`) running :data:`DRIVER` instead of its usual one."""
    script = tmp_path / "retry_driver.py"
    script.write_text(DRIVER)
    installed = client(request.param)
    return dataclasses.replace(installed, argv=[installed.argv[0], str(script)])


def wait_ok(run: Any, client: Any, timeout: float) -> list[dict[str, Any]]:
    run.wait(timeout)
    done = run.done()
    assert done is not None, run.describe()
    assert not done.get("timed_out"), run.describe()
    allowed = {0} | (SEGFAULT if client.segfaults_on_exit else set())
    assert run.returncode in allowed, run.describe()
    return run.of("received")


def test_failed_message_comes_back_with_growing_reconsume_count(server: InProcessServer, cpp: Any) -> None:
    topic, group = unique("Retry"), unique("GRetry")
    sent = cpp.spawn("produce", server.address, topic, "PRetry", "try me", "0")
    wait_ok(sent, cpp, 30)
    run = cpp.spawn("consume", server.address, topic, group, "2", "1", "40")
    received = wait_ok(run, cpp, 60)
    counts = [e["reconsume_times"] for e in received]
    assert counts == [0, 1, 2], run.describe()
    assert {e["body"] for e in received} == {"try me"}
    # retry n waits delay level 3 + (n - 1): 3 s, then 4 s (plus the client's own latency)
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(received)]
    assert gaps[0] >= 3.0 - 0.05, run.describe()
    assert gaps[1] >= 4.0 - 0.05, run.describe()
    send_backs = [e for e in list(server.events) if e.op == "CONSUMER_SEND_MSG_BACK"]
    assert [(e.status, e.group) for e in send_backs] == [("SUCCESS", group)] * 2  # not a client-side retry


def test_delayed_message_arrives_no_earlier_than_its_level(server: InProcessServer, cpp: Any) -> None:
    topic, group = unique("Delay"), unique("GDelay")
    wait_ok(cpp.spawn("produce", server.address, topic, "PDelay", "warm-up", "0"), cpp, 30)  # creates T
    run = cpp.spawn("consume", server.address, topic, group, "0", "2", "40")
    assert run.reader.wait_for(lambda e: e.get("event") == "received", 30) is not None, run.describe()
    sent = cpp.spawn("produce", server.address, topic, "PDelay", "later", "3")
    wait_ok(sent, cpp, 30)
    (ack,) = sent.of("sent")
    received = wait_ok(run, cpp, 60)
    (late,) = [e for e in received if e["body"] == "later"]
    assert late["t"] - ack["t"] >= 3.0 - 0.01, run.describe()

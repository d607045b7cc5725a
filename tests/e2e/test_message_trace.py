"""Message trace with Apache RocketMQ's ``mqadmin queryMsgTraceById`` (5.3.3) against mqproxy (embedded,
``[trace] enabled``): the proxy writes the trace records, no client has tracing switched on.

* A Java 5.x remoting producer sends and a lite pull consumer consumes and commits (the ``admin-fixture``
  scenario): the first message's trace shows its ``Pub`` row (producer group) and a ``Sub`` row for the
  consumer group (SubAfter: the committed offset passed it).
* A paho MQTT client publishes at QoS 1 and another, subscribed, gets and acknowledges it: the trace of the
  stored message (its id from ``mqadmin printMsg``: the proxy gave the publish a message id) shows the
  publisher's client id as the ``Pub`` group and the subscriber's as a ``Sub`` group.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import pytest

from .conftest import Client, ProxyProcess
from .paho_driver import V311, PahoClient
from .test_java_remoting_admin import split_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROXY_ENV = {"MQPROXY_TRACE_ENABLED": "true"}


def rows(output: str, kind: str) -> list[list[str]]:
    """The table rows of ``queryMsgTraceById`` of one type (``Pub`` or ``Sub``): type, group, client
    host, date, time, cost, status."""
    return [line.split() for line in output.splitlines() if line.startswith(f"{kind} ")]


def test_query_msg_trace_by_id_shows_remoting_and_mqtt_paths(
    proxy: ProxyProcess, java_driver: Callable[..., Client]
) -> None:
    address, tag = str(proxy.address), uuid.uuid4().hex[:8]
    run_id = f"tr{tag}"
    fixture = java_driver("remoting", "mqtest.Remoting", ("client5",)).run(
        address, run_id, "120", "admin-fixture", timeout=180
    )
    assert (fixture.done() or {}).get("ok"), fixture.describe()
    java_msg_id = fixture.of("sent")[0]["result"]["msgId"]

    subscriber = PahoClient(proxy.port, f"trsub-{tag}", V311)
    assert subscriber.rc == 0
    assert subscriber.subscribe((f"tr{tag}/+", 1)) == [1]
    publisher = PahoClient(proxy.port, f"trpub-{tag}", V311)
    publisher.publish(f"tr{tag}/temp", b"21.5", qos=1)
    assert bytes(subscriber.get(timeout=30).payload) == b"21.5"  # paho PUBACKs it
    publisher.close()
    subscriber.close()

    mqadmin = java_driver("mqadmin", "mqtest.MqadminBatch", ("server",))
    printed = mqadmin.run("printMsg", "-n", address, "-t", f"tr{tag}", "-d", "false", ";;", timeout=300)
    assert printed.done() is not None, printed.describe()
    (listing,) = split_outputs(printed, 1)
    mqtt_ids = re.findall(r"^MSGID: (\S+)", listing, re.MULTILINE)
    assert len(mqtt_ids) == 1, listing

    traced = mqadmin.run(
        "queryMsgTraceById", "-n", address, "-i", java_msg_id, ";;",
        "queryMsgTraceById", "-n", address, "-i", mqtt_ids[0], ";;",
        timeout=300,
    )  # fmt: skip
    assert traced.done() is not None, traced.describe()
    java_trace, mqtt_trace = split_outputs(traced, 2)

    (pub,) = rows(java_trace, "Pub")
    assert pub[1] == f"admin_pg_{run_id}", java_trace
    assert pub[-1] == "success", java_trace
    subs = rows(java_trace, "Sub")
    assert [s[1] for s in subs] == [f"admin_cg_{run_id}"], java_trace
    assert subs[0][-1] == "success"
    assert "#ConsumerGroup" in java_trace

    (pub,) = rows(mqtt_trace, "Pub")
    assert (pub[1], pub[-1]) == (f"trpub-{tag}", "success"), mqtt_trace
    assert [(s[1], s[-1]) for s in rows(mqtt_trace, "Sub")] == [(f"trsub-{tag}", "success")], mqtt_trace

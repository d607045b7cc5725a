"""Apache RocketMQ's ``mqadmin`` (5.3.3) and the 5.x remoting client's pop consumption, against mqproxy and
against a stock RocketMQ 5.3.3, with the same assertions on both.

A Java program (``tests/e2e/java/remoting``, scenario ``admin-fixture``) sends five messages and commits
three of them for a consumer group; one JVM (``tests/e2e/java/mqadmin``) then runs ``updateTopic``,
``topicRoute``, ``topicList``, ``consumerProgress``, ``queryMsgById`` and, for pop, ``updateTopic`` +
``setConsumeMode -m POP``; a 5.x push consumer (``tests/e2e/java/remoting5pop``) then pops that topic.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import Client, ClientRun, Target

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@dataclass
class AdminRun:
    run_id: str
    sent: list[dict[str, Any]]
    outputs: list[str]  # one per mqadmin command, in order
    admin: ClientRun

    @property
    def topic(self) -> str:
        return f"admin_{self.run_id}"

    @property
    def group(self) -> str:
        return f"admin_cg_{self.run_id}"

    @property
    def new_topic(self) -> str:
        return f"adm_new_{self.run_id}"

    @property
    def pop_topic(self) -> str:
        return f"popt_{self.run_id}"

    @property
    def pop_group(self) -> str:
        return f"popg_{self.run_id}"


def split_outputs(run: ClientRun, count: int) -> list[str]:
    """The output lines of each command of an MqadminBatch run (between its JSON markers)."""
    outputs: list[list[str]] = []
    for line in run.reader.lines:
        if line.startswith('{"event":"command"'):
            outputs.append([])
        elif line.startswith('{"event":"command.end"') or line.startswith('{"event":"done"'):
            continue
        elif outputs:
            outputs[-1].append(line)
    assert len(outputs) == count, run.describe()
    return ["\n".join(lines) for lines in outputs]


@pytest.fixture(scope="module")
def admin(java_driver: Callable[..., Client], target: Target) -> AdminRun:
    run_id = f"{target.name[0]}{uuid.uuid4().hex[:8]}"
    fixture = java_driver("remoting", "mqtest.Remoting", ("client5",)).run(
        target.namesrv, run_id, "120", "admin-fixture", timeout=180
    )
    assert (fixture.done() or {}).get("ok"), fixture.describe()
    sent = [e["result"] for e in fixture.of("sent")]
    partial = AdminRun(run_id, sent, [], fixture)
    ns, cluster = ("-n", target.namesrv), ("-c", target.cluster_name)
    commands = [
        ["updateTopic", *ns, *cluster, "-t", partial.new_topic, "-r", "3", "-w", "3"],
        ["topicRoute", *ns, "-t", partial.new_topic],
        ["topicList", *ns],
        ["consumerProgress", *ns, "-g", partial.group],
        ["queryMsgById", *ns, "-t", partial.topic, "-i", sent[1]["offsetMsgId"]],
        ["updateTopic", *ns, *cluster, "-t", partial.pop_topic, "-r", "4", "-w", "4"],
        [
            "setConsumeMode",
            *ns,
            *cluster,
            "-t",
            partial.pop_topic,
            "-g",
            partial.pop_group,
            "-m",
            "POP",
            "-q",
            "0",
        ],
    ]
    args = [arg for command in commands for arg in (*command, ";;")]
    mqadmin = java_driver("mqadmin", "mqtest.MqadminBatch", ("server",))
    run = mqadmin.run(*args, timeout=300)
    assert run.done() is not None, run.describe()
    return AdminRun(run_id, sent, split_outputs(run, len(commands)), run)


def line_value(output: str, label: str) -> str:
    """The value printed after ``label`` (``%-20s %s`` lines of mqadmin)."""
    found = re.search(rf"^{re.escape(label)}\s+(.*)$", output, re.MULTILINE)
    assert found is not None, f"no {label!r} in:\n{output}"
    return found.group(1).strip()


def test_update_topic_and_topic_route(admin: AdminRun, target: Target) -> None:
    created, route = admin.outputs[0], admin.outputs[1]
    assert f"create topic to {target.broker_addr} success." in created, created
    assert f"topicName={admin.new_topic}, readQueueNums=3, writeQueueNums=3, perm=RW-" in created
    for field in ('"readQueueNums":3', '"writeQueueNums":3', '"perm":6', '"brokerName":"broker-a"'):
        assert field in route, route
    assert f'"cluster":"{target.cluster_name}"' in route
    assert target.broker_addr in route


def test_topic_list(admin: AdminRun) -> None:
    listed = set(admin.outputs[2].split())
    assert {admin.topic, admin.new_topic, f"%RETRY%{admin.group}"} <= listed, admin.outputs[2]


def test_consumer_progress(admin: AdminRun) -> None:
    output = admin.outputs[3]
    rows = [line.split() for line in output.splitlines() if line.startswith(admin.topic)]
    assert len(rows) == 1, output  # one queue
    topic, broker, queue, broker_offset, consumer_offset, diff, inflight = rows[0][:7]
    assert (topic, broker, queue) == (admin.topic, "broker-a", "0")
    # the consumer pulled the last two before it shut down, without committing them: in flight
    assert (broker_offset, consumer_offset, diff, inflight) == ("5", "3", "2", "2")
    assert line_value(output, "Consume Diff Total:") == "2"


def test_query_msg_by_id(admin: AdminRun) -> None:
    output, sent = admin.outputs[4], admin.sent[1]
    assert line_value(output, "OffsetID:") == sent["offsetMsgId"]
    assert line_value(output, "Topic:") == admin.topic
    assert line_value(output, "Tags:") == "[TagM]"
    assert line_value(output, "Keys:") == "[admin-key-1]"
    assert (line_value(output, "Queue ID:"), line_value(output, "Queue Offset:")) == ("0", "1")
    assert line_value(output, "Reconsume Times:") == "0"
    assert "n=1" in line_value(output, "Properties:")
    assert f"UNIQ_KEY={sent['msgId']}" in line_value(output, "Properties:")
    # the message track: the group that consumed it is known (committed offsets) and offline now
    assert f"consumerGroup={admin.group}, trackType=NOT_ONLINE" in output, output
    assert f"CODE:206 DESC:the consumer group[{admin.group}] not online" in output


def test_pop_consumption_after_set_consume_mode(
    admin: AdminRun, java_driver: Callable[..., Client], target: Target
) -> None:
    """``setConsumeMode -m POP`` then a 5.x push consumer with clientRebalance=false: QUERY_ASSIGNMENT
    gives it every queue in POP mode (queue id -1), it pops and acks, and a message it fails comes back
    (CHANGE_MESSAGE_INVISIBLETIME) from the pop retry topic with reconsumeTimes 1."""
    assert f"set consume mode to {target.broker_addr} success." in admin.outputs[6], admin.outputs[6]
    driver = java_driver("remoting5pop", "mqtest.Remoting5Pop", ("client5",), also=("remoting",))
    run = driver.run(target.namesrv, admin.run_id, "90", admin.pop_topic, admin.pop_group, timeout=150)
    assert (run.done() or {}).get("ok"), run.describe()
    received = run.of("received")
    assert {e["queueId"] for e in received} == {-1}  # pop assignments cover every queue
    assert all(e["popCk"] for e in received)  # pop receipt handles, not pulls
    bodies = [e["msg"]["body"] for e in received]
    assert sorted(set(bodies)) == sorted([f"pop-{i}" for i in range(5)] + ["pop-fail"])
    failed = [e for e in received if e["msg"]["body"] == "pop-fail"]
    assert [e["msg"]["reconsumeTimes"] for e in failed[:2]] == [0, 1]
    assert [e["popCk"].split()[4] for e in failed[:2]] == ["0", "1"]  # the second came from the retry topic
    assert {e["msg"]["topic"] for e in received} == {admin.pop_topic}

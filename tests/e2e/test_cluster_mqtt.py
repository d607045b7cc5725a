"""MQTT in cluster mode end to end: paho clients (3.1.1 and 5.0) on two mqproxy nodes (A and B,
``MQPROXY_BACKEND_KIND=rocketmq``) in front of a stock Apache RocketMQ 5.3 cluster (a name server and two
brokers, no RocketMQ proxy).

What a client relies on is in the cluster, so it holds across nodes: a QoS 1 session made on A resumes on B
with every message published on B meanwhile; a second connection on the other node takes the session
over; retained messages and Wills published on one node reach subscribers on the other; a shared
subscription with members on both nodes gets each message once; a node killed with ``kill -9`` loses no
acknowledged message of a session that resumes on the other node, and a surviving node publishes the Wills
of its clients; a subscription made while a broker is down gets what that broker stores once it is back,
although the session was offline meanwhile. (``tests/backends/rocketmq/test_cluster_lmq.py`` checks the
light queues on the brokers.)

Ordering between nodes needs no waits: a CONNECT reads what every node wrote before it, so a client that
connects after a SUBACK (or PUBACK) on the other node sees that subscription (or retained message).
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator

import pytest

from .cluster_harness import ClusterMode, wait_for
from .paho_driver import V5, V311, PahoClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

LIMIT_S = 60.0
#: paho's reason for a DISCONNECT with Session taken over (MQTT 5).
SESSION_TAKEN_OVER = 0x8E


@pytest.fixture(autouse=True)
def _node_logs(rmq: ClusterMode, request: pytest.FixtureRequest) -> None:
    """A failed test's report gets the log tails of the nodes (conftest's pytest_runtest_makereport)."""
    request.node._e2e_proxies = list(rmq.nodes.values())


@pytest.fixture
def clients() -> Iterator[list[PahoClient]]:
    """Every client a test opens (``opened.append``) is closed at teardown."""
    opened: list[PahoClient] = []
    yield opened
    for client in opened:
        client.paho.loop_stop()
        client.paho.disconnect()


def _port(rmq: ClusterMode, node: str) -> int:
    return int(str(rmq.nodes[node].address).rsplit(":", 1)[1])


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _drain(client: PahoClient, count: int) -> list[bytes]:
    """``count`` messages (fails the test if they do not come within the limit)."""
    got = []
    for _ in range(count):
        try:
            got.append(bytes(client.get(timeout=LIMIT_S).payload))
        except queue.Empty:
            raise AssertionError(f"{client.client_id}: {len(got)} of {count} messages arrived") from None
    return got


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_a_qos1_session_resumes_on_the_other_node(
    rmq: ClusterMode, clients: list[PahoClient], protocol: int
) -> None:
    tag = _tag()
    device = f"dev-{tag}"
    first = PahoClient(_port(rmq, "A"), device, protocol, clean=False, expiry=600)
    assert first.rc == 0
    assert first.subscribe((f"plant/{tag}/+/temp", 1), (f"exact/{tag}", 1)) == [1, 1]
    first.close()

    publisher = PahoClient(_port(rmq, "B"), f"pub-{tag}", protocol)
    clients.append(publisher)
    bodies = [f"{tag}-{i}".encode() for i in range(20)]
    for i, body in enumerate(bodies):
        publisher.publish(f"plant/{tag}/{i % 3}/temp" if i % 2 else f"exact/{tag}", body, qos=1)

    back = PahoClient(_port(rmq, "B"), device, protocol, clean=False, expiry=600)
    clients.append(back)
    assert back.session_present, "the session made on node A resumes on node B"
    assert sorted(_drain(back, len(bodies))) == sorted(bodies)


def test_a_connection_on_the_other_node_takes_the_session_over(
    rmq: ClusterMode, clients: list[PahoClient]
) -> None:
    tag = _tag()
    device = f"twin-{tag}"
    # reconnect=False: paho would connect again a second later and take the session back (and so on)
    first = PahoClient(_port(rmq, "A"), device, V5, clean=False, expiry=600, reconnect=False)
    clients.append(first)
    assert first.subscribe((f"twin/{tag}", 1)) == [1]
    second = PahoClient(_port(rmq, "B"), device, V5, clean=False, expiry=600)
    clients.append(second)
    assert second.session_present
    reason = first.disconnected.get(timeout=LIMIT_S)
    assert int(getattr(reason, "value", reason)) == SESSION_TAKEN_OVER, reason

    publisher = PahoClient(_port(rmq, "A"), f"pub-{tag}", V5)
    clients.append(publisher)
    publisher.publish(f"twin/{tag}", b"after", qos=1)
    assert _drain(second, 1) == [b"after"], "the subscription moved with the session"
    assert second.disconnected.empty(), "the new connection is not taken back"


def test_retained_messages_and_wills_cross_nodes(rmq: ClusterMode, clients: list[PahoClient]) -> None:
    tag = _tag()
    publisher = PahoClient(_port(rmq, "A"), f"pub-{tag}", V311)
    clients.append(publisher)
    publisher.publish(f"sensor/{tag}/state", b"kept", qos=1, retain=True)

    watcher = PahoClient(_port(rmq, "B"), f"watch-{tag}", V311)
    clients.append(watcher)
    assert watcher.subscribe((f"sensor/{tag}/#", 1)) == [1]
    retained = watcher.get(timeout=LIMIT_S)
    assert (retained.topic, bytes(retained.payload)) == (f"sensor/{tag}/state", b"kept")
    assert retained.retain

    dying = PahoClient(_port(rmq, "A"), f"dying-{tag}", V311, will=(f"sensor/{tag}/will", b"gone", 1, False))
    dying.drop()  # no DISCONNECT: node A publishes the will into node B's subscription
    will = watcher.get(timeout=LIMIT_S)
    assert (will.topic, bytes(will.payload)) == (f"sensor/{tag}/will", b"gone")


def test_a_shared_subscription_across_nodes_gets_each_message_once(
    rmq: ClusterMode, clients: list[PahoClient]
) -> None:
    tag = _tag()
    members = [PahoClient(_port(rmq, node), f"member-{node}-{tag}", V5) for node in ("A", "B")]
    clients.extend(members)
    for member in members:
        assert member.subscribe((f"$share/workers/jobs/{tag}/+", 1)) == [1]
    publisher = PahoClient(_port(rmq, "B"), f"pub-{tag}", V5)
    clients.append(publisher)
    bodies = {f"job-{i}".encode() for i in range(20)}
    for i, body in enumerate(sorted(bodies)):
        publisher.publish(f"jobs/{tag}/{i % 4}", body, qos=1)
    got: list[bytes] = []
    while len(got) < len(bodies):
        arrived = [bytes(m.messages.get_nowait().payload) for m in members if not m.messages.empty()]
        if arrived:
            got += arrived
            continue
        wait_for("a message for the group", lambda: any(not m.messages.empty() for m in members), LIMIT_S)
    assert sorted(got) == sorted(bodies), "each message once, to one member of the group"


def test_a_node_killed_with_kill_9_loses_no_acknowledged_message_and_its_wills_go_out(
    rmq: ClusterMode, clients: list[PahoClient]
) -> None:
    tag = _tag()
    node_c = rmq.start_node("C")
    device = f"kill-{tag}"
    port_c = int(str(node_c.address).rsplit(":", 1)[1])
    subscriber = PahoClient(port_c, device, V5, clean=False, expiry=600)
    clients.append(subscriber)
    assert subscriber.subscribe((f"line/{tag}/#", 1)) == [1]
    publisher = PahoClient(_port(rmq, "B"), f"pub-{tag}", V5)
    clients.append(publisher)
    watcher = PahoClient(_port(rmq, "B"), f"watch-{tag}", V311)
    clients.append(watcher)
    assert watcher.subscribe((f"wills/{tag}", 1)) == [1]
    testament = PahoClient(port_c, f"will-{tag}", V311, will=(f"wills/{tag}", b"last words", 1, False))
    clients.append(testament)
    before = [f"before-{i}".encode() for i in range(10)]
    for body in before:
        publisher.publish(f"line/{tag}/x", body, qos=1)
    first = _drain(subscriber, 3)  # part of it delivered through C, then C dies
    node_c.kill()
    wait_for("the client saw its node go", lambda: not subscriber.disconnected.empty(), LIMIT_S)
    while not subscriber.messages.empty():  # delivered (and acknowledged by paho) before C died
        first.append(bytes(subscriber.messages.get_nowait().payload))
    after = [f"after-{i}".encode() for i in range(10)]
    for body in after:
        publisher.publish(f"line/{tag}/y", body, qos=1)

    will = watcher.get(timeout=LIMIT_S)  # a surviving node publishes the Will of C's client
    assert (will.topic, bytes(will.payload)) == (f"wills/{tag}", b"last words")

    resumed = PahoClient(_port(rmq, "A"), device, V5, clean=False, expiry=600)
    clients.append(resumed)
    assert resumed.session_present, "the session of the killed node resumes on node A"
    rest: set[bytes] = set()
    wanted = set(before + after) - set(first)
    while not wanted <= rest:  # at least once: what C delivered but had not committed may come again
        try:
            rest.add(bytes(resumed.get(timeout=LIMIT_S).payload))
        except queue.Empty:
            raise AssertionError(f"missing after the kill: {sorted(wanted - rest)}") from None


def test_the_lmq_broker_stopped_mid_stream_loses_no_acknowledged_message(
    rmq: ClusterMode, clients: list[PahoClient]
) -> None:
    """The preferred LMQ broker stops while a QoS 1 publisher on B streams to a persistent QoS 1 subscriber
    on A: publishes move to the other broker, the subscriber keeps receiving, its session resumes on B
    while the broker is down, and once the broker is back what it stored before it stopped is delivered
    too. Every PUBACK'd message arrives (duplicates allowed at QoS 1, counted)."""
    tag = _tag()
    topic = f"ha/{tag}/t"
    device = f"ha-sub-{tag}"
    lmq_broker = "broker-a"  # nothing names another: the first master in sorted order (see lmq.py)
    first = PahoClient(_port(rmq, "A"), device, V5, clean=False, expiry=600)
    clients.append(first)
    assert first.subscribe((topic, 1)) == [1]

    publisher = PahoClient(_port(rmq, "B"), f"ha-pub-{tag}", V5)
    clients.append(publisher)
    reasons: dict[int, int] = {}
    publisher.paho.on_publish = lambda c, u, mid, rc, props: reasons.__setitem__(mid, int(rc.value))
    acked: list[bytes] = []
    failed: list[bytes] = []

    def publish(count: int) -> None:
        for _ in range(count):
            body = f"{tag}-{len(acked) + len(failed)}".encode()
            info = publisher.paho.publish(topic, body, qos=1)
            info.wait_for_publish(LIMIT_S)
            (acked if info.is_published() and reasons.get(info.mid, 0) < 0x80 else failed).append(body)

    received: list[bytes] = []

    def take(client: PahoClient) -> None:
        while True:
            try:
                received.append(bytes(client.get(timeout=0.05).payload))
            except queue.Empty:
                return

    publish(20)
    wait_for("the first messages arrive", lambda: take(first) or set(acked) <= set(received), LIMIT_S)

    rmq.stock.stop_broker(lmq_broker)
    publish(30)
    after_stop = acked[20:]
    assert len(after_stop) >= 25, f"publishes did not move to the other broker: failed {failed}"
    wait_for(
        "the messages acknowledged after the stop arrive",
        lambda: take(first) or set(after_stop) <= set(received),
        LIMIT_S,
    )

    first.close()  # the session resumes on B while the LMQ broker is down
    take(first)
    publish(10)
    back = PahoClient(_port(rmq, "B"), device, V5, clean=False, expiry=600)
    clients.append(back)
    assert back.session_present, "the session resumes on node B while the LMQ broker is down"
    publish(10)

    rmq.stock.restart_broker(lmq_broker)
    publish(10)
    wait_for(
        "every acknowledged message arrives",
        lambda: take(back) or set(acked) <= set(received),
        LIMIT_S * 2,
    )
    duplicates = len(received) - len(set(received))
    print(f"acked {len(acked)}, failed {len(failed)}, received {len(received)}, duplicates {duplicates}")
    assert len(failed) <= 5, failed  # only around the stop itself


def test_a_subscription_made_while_a_broker_is_down_gets_what_that_broker_stores_later(
    rmq: ClusterMode, clients: list[PahoClient]
) -> None:
    """A persistent QoS 1 subscription is made on A while broker-b is stopped, and goes offline. Broker-b
    comes back and, with broker-a stopped, stores every message published meanwhile (through B). The
    session resumes on B and gets them all: its queue on broker-b had no committed offset, and starts at
    the first message stored there since the subscription was made (not at the queue's end)."""
    tag = _tag()
    topic = f"late/{tag}/t"
    device = f"late-sub-{tag}"
    stopped: list[str] = []
    try:
        rmq.stock.stop_broker("broker-b")
        stopped.append("broker-b")
        first = PahoClient(_port(rmq, "A"), device, V5, clean=False, expiry=600)
        assert first.rc == 0
        assert first.subscribe((topic, 1)) == [1]
        first.close()

        publisher = PahoClient(_port(rmq, "B"), f"late-pub-{tag}", V5)  # B reads the session's record now
        clients.append(publisher)
        rmq.stock.restart_broker("broker-b")
        stopped.remove("broker-b")
        rmq.stock.stop_broker("broker-a")  # the preferred LMQ broker: what comes next is on broker-b
        stopped.append("broker-a")

        reasons: dict[int, int] = {}
        publisher.paho.on_publish = lambda c, u, mid, rc, props: reasons.__setitem__(mid, int(rc.value))
        acked: list[bytes] = []

        def publish_acked(body: bytes) -> bool:
            info = publisher.paho.publish(topic, body, qos=1)
            info.wait_for_publish(LIMIT_S)
            return info.is_published() and reasons.get(info.mid, 0) < 0x80

        for i in range(20):
            body = f"{tag}-{i}".encode()
            # the first sends after the stop may find broker-a's route still live: send again until stored
            wait_for(f"PUBACK of {body!r}", lambda body=body: publish_acked(body), LIMIT_S)
            acked.append(body)

        back = PahoClient(_port(rmq, "B"), device, V5, clean=False, expiry=600)
        clients.append(back)
        assert back.session_present, "the session made on A resumes on B"
        got = set(_drain(back, len(acked)))
        assert got == set(acked), f"missing: {sorted(set(acked) - got)}"
    finally:
        for name in stopped:
            rmq.stock.restart_broker(name)

"""Cluster mode of the gateway without a RocketMQ cluster: two in-process servers play two mqproxy nodes,
each with its own cluster-mode gateway, over one shared store (the first server's), as two nodes share a
cluster. What one node writes (sessions, subscriptions, retained messages) reaches the other through the
logs in the store, never through memory. Each test waits on ``catch_up`` (what a CONNECT does) or on the
follower, never on time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.gateway import Gateway
from mqproxy.mqtt.mapping import SESSION_STATE_TOPIC
from mqproxy.mqtt.session_record import SessionSnapshot, WillRecord
from mqproxy.mqtt.store import FacadeStore
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from ..proxy.conftest import running_server  # type: ignore[import-not-found]
from .conftest import arrivals, connect, gateway_of, receive_publish, set_gateway, subscribe

V5 = 5
_EXPIRY = mq.Properties(session_expiry_interval=300)


class Nodes:
    def __init__(self, a: tuple[str, int], b: tuple[str, int], ga: Gateway, gb: Gateway) -> None:
        self.a, self.b, self.ga, self.gb = a, b, ga, gb

    async def settle(self) -> None:
        """Both nodes have applied every session record written so far."""
        await self.ga.catch_up()
        await self.gb.catch_up()


@asynccontextmanager
async def two_nodes() -> AsyncIterator[Nodes]:
    async with running_server(Settings.for_tests()) as x, running_server(Settings.for_tests()) as y:
        shared = gateway_of(x)
        store = shared.backend
        assert isinstance(store, FacadeStore)
        ga = Gateway(store, shared.config, node="node-a", directory=store)
        gb = Gateway(store, shared.config, node="node-b", directory=store)
        set_gateway(x, ga)
        set_gateway(y, gb)
        async with trio.open_nursery() as nursery:
            for gateway in (ga, gb):
                nursery.start_soon(gateway.run_timers)
                assert gateway.cluster is not None
                nursery.start_soon(gateway.cluster.serve)
                await gateway.ready()
            yield Nodes(x.address, y.address, ga, gb)
            nursery.cancel_scope.cancel()


async def _publish(address: tuple[str, int], topic: str, payload: bytes, retain: bool = False) -> None:
    client, _ = await connect(address, f"pub-{topic}")
    await client.send(mq.Publish(topic, payload, mq.QoS.AT_LEAST_ONCE, retain, False, 1))
    assert await client.receive() == mq.PubAck(1)
    await client.send(mq.Disconnect())
    await client.aclose()


async def test_a_session_resumes_on_another_node_with_what_was_published_meanwhile(log_sink: Any) -> None:
    async with two_nodes() as nodes:
        sub, _ = await connect(nodes.a, "roamer", clean_start=False)
        await subscribe(sub, ("room/+", mq.QoS.AT_LEAST_ONCE), ("hall/exact", mq.QoS.AT_LEAST_ONCE))
        await sub.send(mq.Disconnect())
        await sub.aclose()
        await wait_until(lambda: nodes.ga.sessions["roamer"].connection is None)
        await nodes.settle()  # node B now dispatches into the wildcard LMQ of a subscription held on A
        assert "room/+" in nodes.gb.cluster.filters  # type: ignore[union-attr]

        await _publish(nodes.b, "room/kitchen", b"one")
        await _publish(nodes.b, "hall/exact", b"two")

        back, connack = await connect(nodes.b, "roamer", clean_start=False)
        assert connack.session_present, "the session made on node A resumes on node B"
        got = {(await receive_publish(back)).payload for _ in range(2)}
        assert got == {b"one", b"two"}
        assert await arrivals(back) == []
        await nodes.settle()
        assert "roamer" not in nodes.ga.sessions, "node A let go of the session"


async def test_a_second_connection_on_another_node_takes_the_session_over(log_sink: Any) -> None:
    async with two_nodes() as nodes:
        first, _ = await connect(nodes.a, "twin", V5, clean_start=False, properties=_EXPIRY)
        await subscribe(first, ("twin/t", mq.QoS.AT_LEAST_ONCE))
        second, connack = await connect(nodes.b, "twin", V5, clean_start=False, properties=_EXPIRY)
        assert connack.session_present
        disconnect = await first.receive(wait_s=10)
        assert isinstance(disconnect, mq.Disconnect)
        assert disconnect.reason_code == mq.ReasonCode.SESSION_TAKEN_OVER
        assert "node-b" in str(disconnect.properties.reason_string)
        await nodes.settle()
        assert await arrivals(second) == [], "the new connection is not taken back"
        moved = log_sink.named("mqtt.session_moved")
        assert [(e["client_id"], e["node"]) for e in moved] == [("twin", "node-b")]
        await _publish(nodes.a, "twin/t", b"after")
        assert (await receive_publish(second)).payload == b"after", "the subscription moved with the session"


async def test_a_write_still_queued_on_the_node_that_lost_the_session_writes_nothing(log_sink: Any) -> None:
    """A write of node A's session (a SUBSCRIBE's, a disconnect's) whose turn comes after node B took the
    session over would carry a version above B's record (A has seen it) and take the session back from B's
    connection. The session A released writes nothing more."""
    async with two_nodes() as nodes:
        first, _ = await connect(nodes.a, "twin", V5, clean_start=False, properties=_EXPIRY)
        await subscribe(first, ("twin/t", mq.QoS.AT_LEAST_ONCE))
        lost = nodes.ga.sessions["twin"]
        second, _ = await connect(nodes.b, "twin", V5, clean_start=False, properties=_EXPIRY)
        disconnect = await first.receive(wait_s=10)
        assert isinstance(disconnect, mq.Disconnect)
        assert lost.ended
        await nodes.ga.persist(lost)  # the queued write's turn comes now
        await nodes.settle()
        assert await arrivals(second) == [], "the new connection is not taken back"
        assert nodes.gb.sessions["twin"].connection is not None


async def test_a_clean_start_elsewhere_ends_the_old_session_without_ping_pong(log_sink: Any) -> None:
    async with two_nodes() as nodes:
        first, _ = await connect(nodes.a, "fresh", V5, clean_start=False, properties=_EXPIRY)
        await subscribe(first, ("fresh/+", mq.QoS.AT_LEAST_ONCE))
        second, connack = await connect(nodes.b, "fresh", V5, clean_start=True, properties=_EXPIRY)
        assert not connack.session_present
        disconnect = await first.receive(wait_s=10)
        assert isinstance(disconnect, mq.Disconnect)
        assert disconnect.reason_code == mq.ReasonCode.SESSION_TAKEN_OVER
        await nodes.settle()
        await nodes.settle()
        assert await arrivals(second) == []
        assert "fresh" not in nodes.ga.sessions
        assert nodes.gb.sessions["fresh"].subscriptions == {}, "a clean start drops the old subscriptions"
        assert "fresh/+" not in nodes.ga.cluster.filters  # type: ignore[union-attr]


async def test_retained_messages_and_wills_cross_nodes(log_sink: Any) -> None:
    async with two_nodes() as nodes:
        await _publish(nodes.a, "sensor/1", b"kept", retain=True)
        await wait_until(lambda: len(nodes.gb.retained) == 1)
        watcher, _ = await connect(nodes.b, "watcher")
        await subscribe(watcher, ("sensor/#", mq.QoS.AT_LEAST_ONCE))
        retained = await receive_publish(watcher)
        assert (retained.topic, retained.payload, retained.retain) == ("sensor/1", b"kept", True)

        will = mq.Will("sensor/2", b"gone", mq.QoS.AT_LEAST_ONCE)
        dying, _ = await connect(nodes.a, "dying", will=will)
        await nodes.settle()  # node A dispatches into the LMQ of node B's "sensor/#"
        await dying.aclose()  # no DISCONNECT: the will is due
        published = await receive_publish(watcher)
        assert (published.topic, published.payload) == ("sensor/2", b"gone")


async def test_a_late_record_of_a_node_that_lost_the_session_is_overwritten(log_sink: Any) -> None:
    async with two_nodes() as nodes:
        client, _ = await connect(nodes.a, "late", clean_start=False)
        await subscribe(client, ("late/t", mq.QoS.AT_LEAST_ONCE))
        stale = SessionSnapshot("late", 0xFFFFFFFF, disconnected_at_ms=1, node="node-b")
        await nodes.gb.backend.send(mq_message(stale))
        await nodes.ga.catch_up()
        assert nodes.ga.sessions["late"].connection is not None, "a disconnect record never takes a session"
        await nodes.gb.catch_up()
        assert "late" not in nodes.gb.cluster.known or nodes.gb.cluster.known["late"].connected  # type: ignore[union-attr]
        assert await arrivals(client) == []


def mq_message(snapshot: SessionSnapshot) -> Any:
    from mqproxy.model.types import Message

    return Message(topic=SESSION_STATE_TOPIC, body=snapshot.to_json(), queue_id=0)


def test_a_will_record_keeps_every_will_property() -> None:
    props = mq.Properties(content_type="text/plain", user_properties=(("k", "v"),), will_delay_interval=7)
    will = mq.Will("a/b", b"\x00\xffbye", mq.QoS.EXACTLY_ONCE, True, props)
    record = WillRecord.of(will, 7)
    again = WillRecord.from_list(record.to_list())
    assert again == record
    assert again.will() == will


async def test_the_sessions_of_a_dead_node_get_their_will_and_are_disconnected(log_sink: Any) -> None:
    async with two_nodes() as nodes:
        watcher, _ = await connect(nodes.b, "watcher")
        await subscribe(watcher, ("alarm/+", mq.QoS.AT_LEAST_ONCE))
        will = WillRecord.of(mq.Will("alarm/x", b"gone", mq.QoS.AT_LEAST_ONCE), 0)
        orphan = SessionSnapshot("orphan", 300, node="node-dead", will=will)
        await nodes.gb.backend.send(mq_message(orphan))
        await nodes.settle()
        assert nodes.gb.cluster is not None
        assert nodes.ga.cluster is not None
        assert await nodes.gb.cluster.sweep() == 0, "only the live node with the smallest id acts"
        assert await nodes.ga.cluster.sweep() == 1
        published = await receive_publish(watcher)
        assert (published.topic, published.payload) == ("alarm/x", b"gone")
        await nodes.settle()
        record = nodes.gb.cluster.known["orphan"]
        assert record.disconnected_at_ms is not None, "the session is disconnected and its expiry runs"
        assert record.will is None
        assert await nodes.ga.cluster.sweep() == 0, "taken once"
        assert [e["client_id"] for e in log_sink.named("mqtt.session_orphaned")] == ["orphan"]


async def test_records_and_retained_messages_are_refreshed_before_the_brokers_age_them_out(
    log_sink: Any,
) -> None:
    async with two_nodes() as nodes:
        keeper, _ = await connect(nodes.a, "keeper", clean_start=False)
        await subscribe(keeper, ("keep/+", mq.QoS.AT_LEAST_ONCE))
        await keeper.send(mq.Disconnect())
        await keeper.aclose()
        await wait_until(lambda: nodes.ga.sessions["keeper"].connection is None)
        await _publish(nodes.b, "keep/state", b"kept", retain=True)
        await nodes.settle()
        assert nodes.ga.cluster is not None
        assert nodes.gb.cluster is not None
        before = await nodes.ga.backend.max_offset(SESSION_STATE_TOPIC, 0)
        assert await nodes.ga.cluster.refresh() == 0, "nothing is old yet"

        nodes.ga.cluster.refresh_age_s = nodes.gb.cluster.refresh_age_s = -1.0  # everything is old
        assert await nodes.gb.cluster.refresh() == 0, "offline records are the leading node's to refresh"
        assert await nodes.ga.cluster.refresh() == 2  # keeper's record and the retained message

        tail = await nodes.ga.backend.pull(SESSION_STATE_TOPIC, 0, before, 10)
        records = [SessionSnapshot.from_json(m.body) for m in tail.messages]
        (again,) = [r for r in records if r.client_id == "keeper"]  # (a publisher's tombstone may be there)
        assert (again.client_id, again.node) == ("keeper", "node-a")
        assert [s.topic_filter for s in again.subscriptions] == ["keep/+"]
        assert again.disconnected_at_ms is not None, "still offline: its expiry counts from the disconnect"
        await nodes.settle()
        watcher, _ = await connect(nodes.b, "late-watcher")
        await subscribe(watcher, ("keep/#", mq.QoS.AT_MOST_ONCE))
        retained = await receive_publish(watcher)
        assert (retained.topic, retained.payload, retained.retain) == ("keep/state", b"kept", True)
        assert await arrivals(watcher) == [], "refreshed once, delivered once"


async def test_a_shared_group_with_members_on_both_nodes_gets_each_message_once(log_sink: Any) -> None:
    async with two_nodes() as nodes:
        first, _ = await connect(nodes.a, "member-a")
        await subscribe(first, ("$share/workers/jobs/+", mq.QoS.AT_LEAST_ONCE))
        second, _ = await connect(nodes.b, "member-b")
        await subscribe(second, ("$share/workers/jobs/+", mq.QoS.AT_LEAST_ONCE))
        await nodes.settle()
        assert nodes.ga.cluster is not None
        assert nodes.gb.cluster is not None
        assert nodes.ga.cluster.reads_share("workers", "jobs/+")
        assert not nodes.gb.cluster.reads_share("workers", "jobs/+"), "node-a has members and a smaller id"

        for i in range(10):
            await _publish(nodes.a if i % 2 else nodes.b, f"jobs/{i}", f"job-{i}".encode())
        got = [(await receive_publish(first)).payload for _ in range(10)]
        assert sorted(got) == sorted(f"job-{i}".encode() for i in range(10))
        assert await arrivals(second) == [], "node-b does not read the group while node-a does"

        await first.send(mq.Disconnect())
        await first.aclose()
        await wait_until(lambda: "member-a" not in nodes.ga.sessions)
        await nodes.settle()
        assert nodes.gb.cluster.reads_share("workers", "jobs/+"), "the group's reader moves to node-b"
        for i in range(10, 15):
            await _publish(nodes.a, f"jobs/{i}", f"job-{i}".encode())
        later = [(await receive_publish(second)).payload for _ in range(5)]
        assert sorted(later) == sorted(f"job-{i}".encode() for i in range(10, 15)), (
            "from the committed offset"
        )
        assert await arrivals(second) == []

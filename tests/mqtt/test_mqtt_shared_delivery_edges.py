"""Edge cases of shared-subscription delivery: give-back, UNSUBSCRIBE with deliveries in flight, the
group offset, QoS 2 across a crash."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.codecs import mqtt as mq
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.mqtt.gateway import Gateway
from mqproxy.mqtt.mapping import SHARED_GROUP_PREFIX, lmq_name
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from .conftest import (  # type: ignore[import-not-found]
    RawClient,
    arrivals,
    drain,
    gateway_of,
    running_server,
)
from .test_mqtt_qos2_recovery import (  # type: ignore[import-not-found]
    Proxy,
    connect,
    crash,
    publish_q2,
    shared_delivery_then_crash,
    shared_delivery_to_m1,
    subscribe,
)

Q0, Q1, Q2 = mq.QoS.AT_MOST_ONCE, mq.QoS.AT_LEAST_ONCE, mq.QoS.EXACTLY_ONCE


@pytest.fixture
async def proxy(tmp_path: Any, log_sink: Any) -> Any:
    async with running_server(Settings.for_tests(tmp_path)) as handle:
        yield Proxy(handle)


async def group_offset(proxy: Proxy, group: str, topic_filter: str) -> int | None:
    return await proxy.backend.query_consumer_offset(
        SHARED_GROUP_PREFIX + group, lmq_name(topic_filter), LMQ_QUEUE_ID
    )


async def group_offset_is(proxy: Proxy, group: str, topic_filter: str, offset: int) -> bool:
    return await group_offset(proxy, group, topic_filter) == offset


# --- shared subscriptions: a session that ends hands its un-acked messages back -----------------
async def ack(client: RawClient, publish: mq.Publish) -> None:
    """Complete the flow of a received QoS 1/2 PUBLISH."""
    assert publish.packet_id is not None
    if publish.qos == Q1:
        await client.send(mq.PubAck(publish.packet_id))
        return
    await client.send(mq.PubRec(publish.packet_id))
    assert await client.receive() == mq.PubRel(publish.packet_id)
    await client.send(mq.PubComp(publish.packet_id))


@pytest.mark.parametrize("unsubscribe_first", [False, True])
@pytest.mark.parametrize("qos", [Q1, Q2])
async def test_ending_member_hands_unacked_shared_message_back(
    proxy: Proxy, qos: mq.QoS, unsubscribe_first: bool
) -> None:
    """m1 holds an un-acked shared delivery (after UNSUBSCRIBE, or not), then its session ends: the
    message must go to the other member, and the group's committed offset must move past it."""
    m1 = await connect(proxy, "m1", clean=True)
    await subscribe(m1, "$share/g/u/t", qos)
    m2 = await connect(proxy, "m2", clean=True)
    await subscribe(m2, "$share/g/u/t", qos)
    pub = await connect(proxy, "p", clean=True)
    first: mq.Publish | None = None
    for n in range(4):  # until m1 has one (members take turns, but not strictly)
        await pub.send(mq.Publish("u/t", b"m%d" % n, Q1, packet_id=n + 1))
        assert await pub.receive() == mq.PubAck(n + 1)
        if got := await arrivals(m1):
            (first,) = got
            assert isinstance(first, mq.Publish)
            break
    assert first is not None
    assert all(isinstance(p, mq.Publish | mq.PubRel) for p in await drain(m2))  # m2 completes what it got
    if unsubscribe_first:
        await m1.send(mq.Unsubscribe(9, ("$share/g/u/t",)))
        assert await m1.receive() == mq.UnsubAck(9, ())
    await m1.send(mq.Disconnect())  # clean session: it ends here, with ``first`` un-acked
    await m1.aclose()
    handed = await m2.receive(wait_s=1.0)
    assert isinstance(handed, mq.Publish)
    assert handed.payload == first.payload
    await ack(m2, handed)
    await pub.send(mq.Publish("u/t", b"last", Q1, packet_id=9))
    assert await pub.receive() == mq.PubAck(9)
    last = await m2.receive()
    assert isinstance(last, mq.Publish)
    assert last.payload == b"last"
    await ack(m2, last)
    stored = await proxy.backend.max_offset(lmq_name("u/t"), LMQ_QUEUE_ID)
    await wait_until(lambda: group_offset_is(proxy, "g", "u/t", stored))
    for client in (m2, pub):
        await client.aclose()


async def test_restored_shared_delivery_handed_back_before_the_group_reached_it(proxy: Proxy) -> None:
    """Checked, correct: after a crash m1's shared QoS 2 delivery X is restored (marked on the group
    cursor, in flight again at m1's attach). m1's window is full (Receive Maximum 1), so its reader never
    reaches X; then m1's session ends (clean-start takeover) and X is handed back. The handed-back copy
    is skipped once (``Cursor.reached``) but the group's own read of X then delivers it: X reaches m2
    exactly once and the group's offset moves on."""
    props = mq.Properties(session_expiry_interval=3600)
    first = await shared_delivery_then_crash(proxy, b"x", level=5, properties=props)

    small = mq.Properties(session_expiry_interval=3600, receive_maximum=1)
    m1 = await connect(proxy, "m1", level=5, properties=small)
    again = await m1.receive()
    assert again == mq.Publish("sh/t", b"x", Q2, dup=True, packet_id=first.packet_id)
    m1_new = await connect(proxy, "m1", level=5, clean=True)  # takeover with a clean start: session ends
    await m1.aclose()
    m2 = await connect(proxy, "m2")
    handed = await m2.receive(wait_s=1.0)
    assert isinstance(handed, mq.Publish)
    assert handed.payload == b"x"
    await ack(m2, handed)
    pub = await connect(proxy, "p", clean=True)
    await publish_q2(pub, "sh/t", b"y", 2)
    last = await m2.receive()
    assert isinstance(last, mq.Publish)
    assert last.payload == b"y"
    await ack(m2, last)
    stored = await proxy.count("sh/t")
    await wait_until(lambda: group_offset_is(proxy, "g", "sh/t", stored))
    for client in (m1_new, m2, pub):
        await client.aclose()


async def test_shared_qos2_in_flight_across_unsubscribe_and_resubscribe_is_not_sent_twice(
    proxy: Proxy,
) -> None:
    """m1 (the group's only member) has shared QoS 2 delivery X released (PUBREC in, PUBREL out: the
    client has handed X to its application), UNSUBSCRIBEs, SUBSCRIBEs again, then completes X. X must
    not come again."""
    m1, pub, first = await shared_delivery_to_m1(proxy, "rs/t", b"x")
    await m1.send(mq.PubRec(first.packet_id))
    assert await m1.receive() == mq.PubRel(first.packet_id)  # exactly-once: the client has X now
    await m1.send(mq.Unsubscribe(5, ("$share/g/rs/t",)))
    assert await m1.receive() == mq.UnsubAck(5, ())
    await subscribe(m1, "$share/g/rs/t", Q2)
    await m1.send(mq.PubComp(first.packet_id))
    assert await arrivals(m1) == [], "X came again"
    for client in (m1, pub):
        await client.aclose()


async def test_shared_qos2_in_flight_at_unsubscribe_is_not_redelivered_after_a_crash(proxy: Proxy) -> None:
    """m1 has shared QoS 2 delivery X released (client handed X to its application) and UNSUBSCRIBEs
    while m2 stays in the group; then the proxy crashes before PUBCOMP. X must not go to m2."""
    m1, pub, first = await shared_delivery_to_m1(proxy, "uc/t", b"x")
    m2 = await connect(proxy, "m2")
    await subscribe(m2, "$share/g/uc/t", Q2)
    await m1.send(mq.PubRec(first.packet_id))
    assert await m1.receive() == mq.PubRel(first.packet_id)
    await m1.send(mq.Unsubscribe(5, ("$share/g/uc/t",)))
    assert await m1.receive() == mq.UnsubAck(5, ())
    await crash(proxy, m1, m2, pub)

    m2 = await connect(proxy, "m2")
    assert await arrivals(m2) == [], "X went to a second member after the crash"
    await m2.aclose()


async def test_member_snapshot_stays_bounded_while_another_member_holds_the_group_back(
    proxy: Proxy,
) -> None:
    """m1 (persistent, offline) holds shared QoS 2 delivery X un-acked, so the group's committed offset
    stays at X. m2 (Receive Maximum 4) then completes 60 QoS 2 deliveries of the group. Its snapshot
    should stay bounded by a small multiple of its window."""
    m1, pub, _ = await shared_delivery_to_m1(proxy, "big/t", b"x")
    gateway = gateway_of(proxy.handle)
    assert isinstance(gateway, Gateway)
    await m1.aclose()  # persistent session, offline, X un-acked
    await wait_until(lambda: gateway.sessions["m1"].connection is None)
    m2 = await connect(
        proxy, "m2", level=5, properties=mq.Properties(session_expiry_interval=3600, receive_maximum=4)
    )
    await subscribe(m2, "$share/g/big/t", Q2)
    count = 60
    for n in range(count):
        await publish_q2(pub, "big/t", b"%d" % n, n % 60000 + 2)
        got = await m2.receive()
        assert isinstance(got, mq.Publish)
        assert got.payload == b"%d" % n
        await ack(m2, got)
    assert await arrivals(m2) == []  # and the server has handled m2's last PUBCOMP
    records = len(gateway.sessions["m2"].snapshot().outbound)
    assert await group_offset(proxy, "g", "big/t") == 0  # held back by m1's X
    assert records <= 3 * 4, records
    for client in (m2, pub):
        await client.aclose()


async def test_group_offset_never_passes_a_claimed_but_undelivered_message(proxy: Proxy) -> None:
    """Member A claims X but waits for a window slot (its other subscription took it) before its
    delivery is tracked; member B meanwhile sends X+1 at QoS 0. The group's committed offset must not
    pass X before X is delivered, or a crash loses X."""
    a = await connect(proxy, "A", clean=True, level=5, properties=mq.Properties(receive_maximum=1))
    await subscribe(a, "$share/g/j/t", Q1)  # A's reader is the group's first to wait: it gets X
    await subscribe(a, "blk/t", Q1)
    await trio.testing.wait_all_tasks_blocked()
    b = await connect(proxy, "B", clean=True)
    await subscribe(b, "$share/g/j/t", Q0)
    pub = await connect(proxy, "p", clean=True)
    await pub.send(mq.Publish("blk/t", b"slot", Q1, packet_id=1))
    assert await pub.receive() == mq.PubAck(1)
    hold = await a.receive()
    assert isinstance(hold, mq.Publish)
    assert hold.payload == b"slot"
    for n, payload in enumerate((b"x", b"x+1")):
        await pub.send(mq.Publish("j/t", payload, Q1, packet_id=n + 2))
        assert await pub.receive() == mq.PubAck(n + 2)
    got = await b.receive()
    assert isinstance(got, mq.Publish)
    assert got.payload == b"x+1"
    await trio.testing.wait_all_tasks_blocked()  # whatever commit was to follow, has
    assert (await group_offset(proxy, "g", "j/t") or 0) <= 0, "committed past X, which nobody has"
    await crash(proxy, a, b, pub)
    c = await connect(proxy, "C", clean=True)
    await subscribe(c, "$share/g/j/t", Q1)
    again = await c.receive(wait_s=1.0)
    assert isinstance(again, mq.Publish)
    assert again.payload == b"x"
    await c.aclose()

"""QoS 2 exactly-once across a proxy crash: a gateway dies (its store calls start failing, as after
kill -9) and a NEW gateway over the SAME store takes over; clients reconnect with their sessions."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mqproxy.backends.embedded.store import MessageStore
from mqproxy.codecs import mqtt as mq
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.mqtt.config import MqttConfig
from mqproxy.mqtt.gateway import Gateway
from mqproxy.mqtt.mapping import SESSION_STATE_TOPIC, lmq_name
from mqproxy.server import ServerHandle
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from .conftest import RawClient, arrivals, drain, gateway_of, running_server, set_gateway  # type: ignore[import-not-found]
from .conftest import connect as connect_to  # type: ignore[import-not-found]

Q1, Q2 = mq.QoS.AT_LEAST_ONCE, mq.QoS.EXACTLY_ONCE


class CrashableBackend:
    """Delegates to a real backend until :meth:`crash`; from then on every store call fails, so the
    gateway using it can neither read nor write anything more (what a killed process leaves behind)."""

    def __init__(self, inner: MessageStore) -> None:
        self._inner = inner
        self.crashed = False
        #: Crash at the first store of an MQTT message: "before" it is written or "after".
        self.crash_at_message: str | None = None

    def crash(self) -> None:
        self.crashed = True

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            armed = self.crash_at_message is not None and _stores_mqtt_message(name, args)
            if armed and self.crash_at_message == "before":
                self.crash()
            if self.crashed:
                raise StoreUnavailable("crashed")
            result = await attr(*args, **kwargs)
            if armed:
                self.crash()
            if self.crashed:
                raise StoreUnavailable("crashed")
            return result

        return call


def _stores_mqtt_message(name: str, args: tuple[Any, ...]) -> bool:
    if name == "send_batch":
        return any(m.topic != SESSION_STATE_TOPIC for m in args[0])
    return name == "send" and args[0].topic != SESSION_STATE_TOPIC


class Proxy:
    """An in-process server whose MQTT gateway can be crashed and replaced by a fresh one."""

    def __init__(self, handle: ServerHandle) -> None:
        self.handle = handle
        self.address = handle.address
        assert handle.store is not None, "an embedded-store server"
        self.backend: MessageStore = handle.store
        self.store: CrashableBackend | None = None
        self.restart()

    def restart(self) -> None:
        """Crash the current gateway (if any) and install a new one over the same store."""
        if self.store is not None:
            self.store.crash()
        self.store = CrashableBackend(self.backend)
        state = self.handle.state
        set_gateway(self.handle, Gateway(self.store, MqttConfig(), state.draining))

    async def count(self, topic: str) -> int:
        """Messages stored for MQTT topic ``topic`` (its LMQ)."""
        return await self.backend.max_offset(lmq_name(topic), LMQ_QUEUE_ID)

    async def state_records(self) -> int:
        return await self.backend.max_offset(SESSION_STATE_TOPIC, 0)


@pytest.fixture(params=["memory", "embedded"])
async def proxy(request: Any, tmp_path: Any, log_sink: Any) -> AsyncIterator[Proxy]:
    settings = Settings.for_tests(tmp_path if request.param == "embedded" else "")
    async with running_server(settings) as handle:
        yield Proxy(handle)


async def connect(proxy: Proxy, client_id: str, clean: bool = False, level: int = 4, **kw: Any) -> RawClient:
    client, connack = await connect_to(proxy.address, client_id, level, clean_start=clean, **kw)
    assert connack.reason_code == mq.ReasonCode.SUCCESS
    client.session_present = connack.session_present  # type: ignore[attr-defined]
    return client


async def crash(proxy: Proxy, *clients: RawClient) -> None:
    """kill -9: the gateway loses its store and every connection drops."""
    dead = gateway_of(proxy.handle)
    proxy.restart()
    for client in clients:
        await client.aclose()
    # the dead connections noticed: none holds a session of the dead gateway any more
    await wait_until(lambda: all(session.connection is None for session in dead.sessions.values()))


async def publish_q2(client: RawClient, topic: str, payload: bytes, packet_id: int) -> None:
    await client.send(mq.Publish(topic, payload, Q2, packet_id=packet_id))
    assert await client.receive() == mq.PubRec(packet_id)
    await client.send(mq.PubRel(packet_id))
    assert await client.receive() == mq.PubComp(packet_id)


async def subscribe(client: RawClient, topic_filter: str, qos: mq.QoS) -> None:
    await client.send(mq.Subscribe(1, (mq.SubscribeTopic(topic_filter, qos),)))
    ack = await client.receive()
    assert isinstance(ack, mq.SubAck)
    assert ack.reason_codes == (mq.ReasonCode(int(qos)),)


async def complete_all(client: RawClient, count: int) -> list[tuple[bytes, mq.QoS]]:
    """Receive ``count`` PUBLISHes, completing every QoS 1/2 flow; their (payload, qos)."""
    got: list[tuple[bytes, mq.QoS]] = []
    open_flows: set[int] = set()
    while len(got) < count or open_flows:
        packet = await client.receive()
        if isinstance(packet, mq.Publish):
            got.append((packet.payload, packet.qos))
            assert packet.packet_id is not None
            if packet.qos == Q1:
                await client.send(mq.PubAck(packet.packet_id))
            else:
                open_flows.add(packet.packet_id)
                await client.send(mq.PubRec(packet.packet_id))
        else:
            assert isinstance(packet, mq.PubRel), packet
            open_flows.discard(packet.packet_id)
            await client.send(mq.PubComp(packet.packet_id))
    return got


# --- inbound ------------------------------------------------------------------------------------
async def test_inbound_qos2_resend_after_crash_is_not_stored_twice(proxy: Proxy) -> None:
    pub = await connect(proxy, "pub")
    await pub.send(mq.Publish("in/t", b"once", Q2, packet_id=7))
    assert await pub.receive() == mq.PubRec(7)
    assert await proxy.count("in/t") == 1
    await crash(proxy, pub)

    pub = await connect(proxy, "pub")
    assert pub.session_present  # type: ignore[attr-defined]
    await pub.send(mq.Publish("in/t", b"once", Q2, packet_id=7, dup=True))
    assert await pub.receive() == mq.PubRec(7)
    assert await proxy.count("in/t") == 1  # acknowledged, not stored again
    await pub.send(mq.PubRel(7))
    assert await pub.receive() == mq.PubComp(7)
    await crash(proxy, pub)

    # The removal was durable before PUBCOMP: id 7 is free for a new message after another crash.
    pub = await connect(proxy, "pub")
    await publish_q2(pub, "in/t", b"new", 7)
    assert await proxy.count("in/t") == 2


@pytest.mark.parametrize("when", ["before", "after"])
async def test_inbound_crash_around_the_message_store(proxy: Proxy, when: str) -> None:
    """The id is durable before the message is stored; a crash just before or just after the store
    (no PUBREC either way) must end with the message stored exactly once after the re-send."""
    pub = await connect(proxy, "pub")
    assert proxy.store is not None
    proxy.store.crash_at_message = when
    await pub.send(mq.Publish("w/t", b"payload", Q2, packet_id=5))
    assert await pub.expect_eof() == []  # the proxy died: no PUBREC
    assert await proxy.count("w/t") == (1 if when == "after" else 0)
    await crash(proxy, pub)

    pub = await connect(proxy, "pub")
    await pub.send(mq.Publish("w/t", b"payload", Q2, packet_id=5, dup=True))
    assert await pub.receive() == mq.PubRec(5)
    assert await proxy.count("w/t") == 1
    await pub.send(mq.PubRel(5))
    assert await pub.receive() == mq.PubComp(5)
    await publish_q2(pub, "w/t", b"payload", 5)  # the same id and payload again: a new message
    assert await proxy.count("w/t") == 2


async def test_inbound_batch_costs_one_state_write(proxy: Proxy) -> None:
    pub = await connect(proxy, "pub")
    before = await proxy.state_records()
    await pub.send_raw(
        b"".join(mq.encode(mq.Publish("b/t", b"%d" % i, Q2, packet_id=i + 1), 4) for i in range(10))
    )
    assert [await pub.receive() for _ in range(10)] == [mq.PubRec(i + 1) for i in range(10)]
    assert await proxy.state_records() == before + 1
    for i in range(10):
        await pub.send(mq.PubRel(i + 1))
    assert [await pub.receive() for _ in range(10)] == [mq.PubComp(i + 1) for i in range(10)]
    assert await proxy.state_records() <= before + 11  # at most one write per read of PUBRELs
    await crash(proxy, pub)
    pub = await connect(proxy, "pub")
    await pub.send(mq.Publish("b/t", b"fresh", Q2, packet_id=3))  # every id was released durably
    assert await pub.receive() == mq.PubRec(3)
    assert await proxy.count("b/t") == 11


# --- outbound -----------------------------------------------------------------------------------
async def test_outbound_crash_before_pubrec_resends_same_id_with_dup(proxy: Proxy) -> None:
    sub = await connect(proxy, "dev")
    await subscribe(sub, "out/t", Q2)
    pub = await connect(proxy, "p", clean=True)
    await publish_q2(pub, "out/t", b"m0", 1)
    await publish_q2(pub, "out/t", b"m1", 2)
    first = [await sub.receive() for _ in range(2)]
    assert all(isinstance(p, mq.Publish) and p.qos == Q2 and not p.dup for p in first)
    await crash(proxy, sub, pub)

    sub = await connect(proxy, "dev")
    assert sub.session_present  # type: ignore[attr-defined]
    again = [await sub.receive() for _ in range(2)]
    assert again == [
        mq.Publish("out/t", p.payload, Q2, dup=True, packet_id=p.packet_id)  # type: ignore[union-attr]
        for p in first
    ]
    for packet in again:
        assert isinstance(packet, mq.Publish)
        assert packet.packet_id is not None
        await sub.send(mq.PubRec(packet.packet_id))
        assert await sub.receive() == mq.PubRel(packet.packet_id)
        await sub.send(mq.PubComp(packet.packet_id))
    assert await arrivals(sub) == []  # the cursor does not deliver them again under new ids
    pub = await connect(proxy, "p", clean=True)
    await publish_q2(pub, "out/t", b"m2", 3)
    late = await sub.receive()
    assert isinstance(late, mq.Publish)
    assert late.payload == b"m2"
    assert not late.dup
    assert await arrivals(sub) == []


async def test_outbound_crash_after_pubrec_resends_pubrel_not_publish(proxy: Proxy) -> None:
    sub = await connect(proxy, "dev")
    await subscribe(sub, "out/t", Q2)
    pub = await connect(proxy, "p", clean=True)
    await publish_q2(pub, "out/t", b"m0", 1)
    got = await sub.receive()
    assert isinstance(got, mq.Publish)
    assert got.packet_id is not None
    await sub.send(mq.PubRec(got.packet_id))
    assert await sub.receive() == mq.PubRel(got.packet_id)  # sent only once "released" is durable
    await crash(proxy, sub, pub)

    sub = await connect(proxy, "dev")
    assert await sub.receive() == mq.PubRel(got.packet_id)
    await sub.send(mq.PubComp(got.packet_id))
    assert await arrivals(sub) == []
    await crash(proxy, sub)
    sub = await connect(proxy, "dev")  # completed and committed: nothing comes back
    assert await arrivals(sub) == []


async def test_outbound_completed_above_committed_offset_not_redelivered(proxy: Proxy) -> None:
    sub = await connect(proxy, "dev")
    await subscribe(sub, "mix/t", Q2)
    pub = await connect(proxy, "p", clean=True)
    await pub.send(mq.Publish("mix/t", b"q1", Q1, packet_id=1))
    assert await pub.receive() == mq.PubAck(1)
    await publish_q2(pub, "mix/t", b"q2", 2)
    held = await sub.receive()  # QoS 1, never acknowledged: holds the committed offset back
    assert isinstance(held, mq.Publish)
    assert held.qos == Q1
    done = await sub.receive()
    assert isinstance(done, mq.Publish)
    assert done.qos == Q2
    assert done.packet_id is not None
    await sub.send(mq.PubRec(done.packet_id))
    assert await sub.receive() == mq.PubRel(done.packet_id)
    await sub.send(mq.PubComp(done.packet_id))
    await sub.send(mq.PingReq())
    assert await sub.receive() == mq.PingResp()
    await crash(proxy, sub, pub)

    sub = await connect(proxy, "dev")
    # PUBCOMP is recorded lazily, so a PUBREL for the finished id may come again (harmless: the peer
    # answers PUBCOMP). The QoS 1 message comes again (at least once); the completed QoS 2 one must not.
    got = await drain(sub)
    publishes = [(p.payload, p.qos) for p in got if isinstance(p, mq.Publish)]
    assert publishes == [(b"q1", Q1)]
    assert [p for p in got if not isinstance(p, mq.Publish)] in ([], [mq.PubRel(done.packet_id)])


async def test_outbound_mqtt5_restored_publish_keeps_properties(proxy: Proxy) -> None:
    props = mq.Properties(session_expiry_interval=600)
    sub = await connect(proxy, "dev5", level=5, properties=props)
    await sub.send(
        mq.Subscribe(1, (mq.SubscribeTopic("v5/+", Q2),), mq.Properties(subscription_identifiers=(9,)))
    )
    assert isinstance(await sub.receive(), mq.SubAck)
    pub = await connect(proxy, "p", clean=True, level=5)
    await pub.send(
        mq.Publish("v5/a", b"x", Q2, packet_id=1, properties=mq.Properties(user_properties=(("k", "v"),)))
    )
    assert await pub.receive() == mq.PubRec(1)
    first = await sub.receive()
    assert isinstance(first, mq.Publish)
    await crash(proxy, sub, pub)
    sub = await connect(proxy, "dev5", level=5, properties=props)
    again = await sub.receive()
    assert isinstance(again, mq.Publish)
    assert again == mq.Publish(
        "v5/a", b"x", Q2, dup=True, packet_id=first.packet_id, properties=first.properties
    )


async def shared_delivery_to_m1(
    proxy: Proxy, topic: str, payload: bytes, **first_member: Any
) -> tuple[RawClient, RawClient, mq.Publish]:
    """m1 (connected with ``first_member``) alone in group ``g`` on ``topic`` at QoS 2; a clean publisher
    sends ``payload`` once and m1 receives it, unanswered. Returns (m1, the publisher, m1's PUBLISH)."""
    m1 = await connect(proxy, "m1", **first_member)
    await subscribe(m1, f"$share/g/{topic}", Q2)
    pub = await connect(proxy, "p", clean=True)
    await publish_q2(pub, topic, payload, 1)
    first = await m1.receive()
    assert isinstance(first, mq.Publish)
    assert first.payload == payload
    assert first.packet_id is not None
    return m1, pub, first


async def shared_delivery_then_crash(proxy: Proxy, payload: bytes, **first_member: Any) -> mq.Publish:
    """Members m1 (connected with ``first_member``) and m2 share ``sh/t`` at QoS 2 in group ``g``; one
    message goes to m1, which does not answer it; then the proxy crashes. Returns m1's PUBLISH."""
    m1, pub, first = await shared_delivery_to_m1(proxy, "sh/t", payload, **first_member)
    m2 = await connect(proxy, "m2")
    await subscribe(m2, "$share/g/sh/t", Q2)
    await crash(proxy, m1, m2, pub)
    return first


async def test_outbound_shared_delivery_comes_back_to_the_same_member_only(proxy: Proxy) -> None:
    first = await shared_delivery_then_crash(proxy, b"m0")

    second_member = await connect(proxy, "m2")  # the other member comes back first
    assert await arrivals(second_member) == []  # m0 belongs to m1: it is not delivered again elsewhere
    first_member = await connect(proxy, "m1")
    again = await first_member.receive()
    assert again == mq.Publish("sh/t", b"m0", Q2, dup=True, packet_id=first.packet_id)
    assert again.packet_id is not None
    await first_member.send(mq.PubRec(again.packet_id))
    assert await first_member.receive() == mq.PubRel(again.packet_id)
    await first_member.send(mq.PubComp(again.packet_id))
    assert await arrivals(first_member) == []
    pub = await connect(proxy, "p", clean=True)
    await publish_q2(pub, "sh/t", b"m1", 2)
    got = [
        p.payload for m in (first_member, second_member) for p in await drain(m) if isinstance(p, mq.Publish)
    ]
    assert got == [b"m1"]  # the group moved past m0: only the new message, once
    await crash(proxy, first_member, second_member, pub)
    for client_id in ("m1", "m2"):
        member = await connect(proxy, client_id)
        for packet in await drain(member):  # PUBCOMP is recorded lazily: a PUBREL may come again, no PUBLISH
            assert isinstance(packet, mq.PubRel), packet
        await member.aclose()


async def test_outbound_retained_at_subscribe_resends_same_id_with_dup(proxy: Proxy) -> None:
    pub = await connect(proxy, "p", clean=True)
    await pub.send(mq.Publish("ret/t", b"kept", Q2, retain=True, packet_id=1))
    assert await pub.receive() == mq.PubRec(1)
    await pub.send(mq.PubRel(1))
    assert await pub.receive() == mq.PubComp(1)
    sub = await connect(proxy, "dev")
    await subscribe(sub, "ret/#", Q2)
    first = await sub.receive()
    assert isinstance(first, mq.Publish)
    assert (first.payload, first.retain, first.qos) == (b"kept", True, Q2)
    await crash(proxy, sub, pub)

    sub = await connect(proxy, "dev")
    again = await sub.receive()
    assert again == mq.Publish("ret/t", b"kept", Q2, retain=True, dup=True, packet_id=first.packet_id)
    assert again.packet_id is not None
    await sub.send(mq.PubRec(again.packet_id))
    assert await sub.receive() == mq.PubRel(again.packet_id)
    await sub.send(mq.PubComp(again.packet_id))
    assert await arrivals(sub) == []
    await crash(proxy, sub)
    sub = await connect(proxy, "dev")
    for packet in await drain(sub):  # PUBCOMP is recorded lazily: a PUBREL may come again, no PUBLISH
        assert packet == mq.PubRel(again.packet_id)


# --- what must not change -----------------------------------------------------------------------
async def test_clean_sessions_and_qos1_write_no_qos2_state(proxy: Proxy) -> None:
    sub = await connect(proxy, "clean-sub", clean=True)
    await subscribe(sub, "c/t", Q2)
    durable = await connect(proxy, "q1-sub")
    await subscribe(durable, "c/t", Q1)
    pub = await connect(proxy, "clean-pub", clean=True)
    before = await proxy.state_records()
    for i in range(5):
        await publish_q2(pub, "c/t", b"%d" % i, i + 1)
    assert sorted(await complete_all(sub, 5)) == [(b"%d" % i, Q2) for i in range(5)]
    assert sorted(await complete_all(durable, 5)) == [(b"%d" % i, Q1) for i in range(5)]
    await durable.send(mq.PingReq())
    assert await durable.receive() == mq.PingResp()
    assert await proxy.state_records() == before  # QoS 1 and clean sessions write no session state
    await sub.send(mq.Disconnect())
    await crash(proxy, sub, durable, pub)
    sub = await connect(proxy, "clean-sub", clean=True)
    assert not sub.session_present  # type: ignore[attr-defined]
    assert await arrivals(sub) == []

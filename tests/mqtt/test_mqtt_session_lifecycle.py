"""MQTT sessions over loopback with a raw client: wills, takeover, persistent sessions and their
expiry, restart and drain."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from mqproxy.codecs import mqtt as mq
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from . import conftest as h  # type: ignore[import-not-found]

Q0, Q1, Q2 = mq.QoS.AT_MOST_ONCE, mq.QoS.AT_LEAST_ONCE, mq.QoS.EXACTLY_ONCE


async def test_keepalive_timeout_publishes_will(
    server: Any, log_sink: Any, steered_clock: trio.testing.MockClock
) -> None:
    watcher, _ = await h.connect(server.address, "watcher")
    await h.subscribe(watcher, ("will/#", Q1))
    dying, _ = await h.connect(server.address, "dying", keep_alive=1, will=mq.Will("will/dying", b"gone", Q1))
    await trio.testing.wait_all_tasks_blocked()  # the server waits for the next packet from "dying"
    steered_clock.jump(1.5)  # 1.5 x the keep alive, and nothing came
    assert await dying.expect_eof() == []
    will = await h.receive_publish(watcher)
    assert (will.topic, will.payload, will.qos) == ("will/dying", b"gone", Q1)
    closed = [e for e in log_sink.named("conn.closed") if e.get("error") == "keepalive_timeout"]
    assert closed


async def test_normal_disconnect_discards_will_abrupt_close_publishes(server: Any) -> None:
    watcher, _ = await h.connect(server.address, "w")
    await h.subscribe(watcher, ("will/+", Q0))
    polite, _ = await h.connect(server.address, "polite", will=mq.Will("will/polite", b"x"))
    await polite.send(mq.Disconnect())
    await polite.expect_eof()
    rude, _ = await h.connect(server.address, "rude", will=mq.Will("will/rude", b"y", retain=True))
    await rude.aclose()
    will = await h.receive_publish(watcher)
    assert will.topic == "will/rude"
    assert await h.arrivals(watcher) == []
    late, _ = await h.connect(server.address, "late")
    await h.subscribe(late, ("will/rude", Q0))
    retained = await h.receive_publish(late)
    assert (retained.payload, retained.retain) == (b"y", True)


async def test_takeover_mqtt5_disconnects_old_with_0x8e(server: Any, log_sink: Any) -> None:
    old, _ = await h.connect(server.address, "same", 5)
    new, connack = await h.connect(server.address, "same", 5)
    assert connack.reason_code == mq.ReasonCode.SUCCESS
    (disconnect,) = await old.expect_eof()
    assert isinstance(disconnect, mq.Disconnect)
    assert disconnect.reason_code == mq.ReasonCode.SESSION_TAKEN_OVER
    assert disconnect.properties.reason_string
    await new.send(mq.PingReq())
    assert await new.receive() == mq.PingResp()
    assert any(e.get("error") == "session_taken_over" for e in log_sink.named("conn.closed"))


async def test_persistent_session_offline_messages_and_redelivery(server: Any) -> None:
    sub, connack = await h.connect(server.address, "durable", clean_start=False)
    assert not connack.session_present
    await h.subscribe(sub, ("d/#", Q2), ("d/x", Q1), packet_id=3)
    await sub.send(mq.Disconnect())
    await sub.expect_eof()
    pub, _ = await h.connect(server.address, "p")
    for i in range(3):
        await pub.send(mq.Publish("d/x", b"m%d" % i, Q1, packet_id=i + 1))
        await pub.receive()
    await pub.send(mq.Publish("d/y", b"q0", Q0))
    await pub.send(mq.PingReq())
    await pub.receive()
    sub, connack = await h.connect(server.address, "durable", clean_start=False)
    assert connack.session_present
    first = [await h.receive_publish(sub, ack=False) for _ in range(7)]
    assert sorted(p.payload for p in first) == sorted([b"m0", b"m1", b"m2"] * 2 + [b"q0"])
    await sub.aclose()  # nothing acked: everything QoS 1/2 comes again with DUP
    sub, connack = await h.connect(server.address, "durable", clean_start=False)
    assert connack.session_present
    again = [await h.receive_publish(sub) for _ in range(6)]
    assert all(p.dup for p in again)
    assert sorted(p.payload for p in again) == sorted([b"m0", b"m1", b"m2"] * 2)
    await sub.send(mq.Disconnect())
    await sub.expect_eof()
    sub, connack = await h.connect(server.address, "durable", clean_start=True)
    assert not connack.session_present
    assert await h.arrivals(sub) == []


async def test_qos2_pubrel_is_resent_after_reconnect(server: Any) -> None:
    sub, _ = await h.connect(server.address, "q2", clean_start=False)
    await h.subscribe(sub, ("q2/t", Q2))
    pub, _ = await h.connect(server.address, "p")
    await pub.send(mq.Publish("q2/t", b"once", Q2, packet_id=1))
    assert await pub.receive() == mq.PubRec(1)
    await pub.send(mq.PubRel(1))
    await pub.receive()
    publish = await h.receive_publish(sub, ack=False)
    assert publish.packet_id is not None
    await sub.send(mq.PubRec(publish.packet_id))
    assert await sub.receive() == mq.PubRel(publish.packet_id)
    await sub.aclose()
    sub, connack = await h.connect(server.address, "q2", clean_start=False)
    assert connack.session_present
    assert await sub.receive() == mq.PubRel(publish.packet_id)  # not the PUBLISH again
    await sub.send(mq.PubComp(publish.packet_id))
    assert await h.arrivals(sub) == []


async def test_session_expiry_interval_ends_session(
    server: Any, steered_clock: trio.testing.MockClock
) -> None:
    sub, _ = await h.connect(
        server.address, "short", 5, clean_start=False, properties=mq.Properties(session_expiry_interval=1)
    )
    await h.subscribe(sub, ("se/+", Q1))
    await sub.send(mq.Disconnect())
    await sub.expect_eof()
    gateway = h.gateway_of(server)
    assert "short" in gateway.sessions
    assert "se/+" in gateway.index
    steered_clock.jump(1)  # the session expiry interval
    await wait_until(lambda: "short" not in gateway.sessions)  # the server's timer task ends it
    assert "se/+" not in gateway.index
    _, connack = await h.connect(server.address, "short", 5, clean_start=False)
    assert not connack.session_present


async def test_will_delay_cancelled_by_reconnect(server: Any, steered_clock: trio.testing.MockClock) -> None:
    watcher, _ = await h.connect(server.address, "w", 5)
    await h.subscribe(watcher, ("wd/#", Q0))
    will = mq.Will("wd/x", b"late", properties=mq.Properties(will_delay_interval=1))
    kw: dict[str, Any] = dict(
        clean_start=False, properties=mq.Properties(session_expiry_interval=30), will=will
    )
    first, _ = await h.connect(server.address, "wd", 5, **kw)
    await first.aclose()
    second, connack = await h.connect(server.address, "wd", 5, **kw)
    assert connack.session_present
    await trio.testing.wait_all_tasks_blocked()  # the first connection has ended and scheduled its will
    steered_clock.jump(1)  # the will delay is over
    assert await h.arrivals(watcher) == []
    await second.aclose()
    await trio.testing.wait_all_tasks_blocked()  # the second's will is scheduled
    steered_clock.jump(1)
    got = await h.receive_publish(watcher)
    assert got.payload == b"late"


async def test_persistent_session_survives_restart(tmp_path: Any, log_sink: Any) -> None:
    settings = Settings.for_tests(tmp_path)
    async with h.running_server(settings) as handle:
        sub, _ = await h.connect(handle.address, "dev", clean_start=False)
        await h.subscribe(sub, ("home/+/temp", Q1), ("home/k/temp", Q2))
        await sub.send(mq.Disconnect())
        await sub.expect_eof()
        pub, _ = await h.connect(handle.address, "p")
        await pub.send(mq.Publish("home/k/temp", b"offline", Q1, packet_id=1))
        await pub.receive()
        await pub.send(mq.Publish("home/r", b"kept", Q0, retain=True))
        await pub.send(mq.PingReq())
        await pub.receive()
        await pub.aclose()
    async with h.running_server(settings) as handle:
        sub, connack = await h.connect(handle.address, "dev", clean_start=False)
        assert connack.session_present
        got = [await h.receive_publish(sub) for _ in range(2)]
        assert sorted((p.payload, p.qos) for p in got) == [(b"offline", Q1), (b"offline", Q1)]
        late, _ = await h.connect(handle.address, "late")
        await h.subscribe(late, ("home/#", Q0))
        retained = await h.receive_publish(late)
        assert (retained.topic, retained.payload, retained.retain) == ("home/r", b"kept", True)
        # the acked offsets were committed: a third start delivers nothing old
        await sub.send(mq.Disconnect())
        await sub.expect_eof()
    async with h.running_server(settings) as handle:
        sub, connack = await h.connect(handle.address, "dev", clean_start=False)
        assert connack.session_present
        assert await h.arrivals(sub) == []


async def test_drain_sends_server_shutting_down(log_sink: Any) -> None:
    async with h.running_server(Settings.for_tests()) as handle:
        client, _ = await h.connect(handle.address, "d", 5)
        handle.stop("test")
        (disconnect,) = await client.expect_eof()
        assert isinstance(disconnect, mq.Disconnect)
        assert disconnect.reason_code == mq.ReasonCode.SERVER_SHUTTING_DOWN

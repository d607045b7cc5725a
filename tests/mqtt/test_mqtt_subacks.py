"""The SUBACKs of one read's SUBSCRIBEs leave together, in order, before any other answer of that read,
and before the connection closes when the read ends it."""

from __future__ import annotations

from typing import Any

from mqproxy.codecs import mqtt as mq

from .conftest import connect, drain, receive_publish  # type: ignore[import-not-found]

Q0, Q1 = mq.QoS.AT_MOST_ONCE, mq.QoS.AT_LEAST_ONCE


def _subscribe(packet_id: int, topic_filter: str, qos: mq.QoS = Q0) -> mq.Subscribe:
    return mq.Subscribe(packet_id, (mq.SubscribeTopic(topic_filter, qos),))


async def test_pipelined_subscribes_then_a_ping_are_answered_in_order(server: Any) -> None:
    client, _ = await connect(server.address, "pipelined", 5)
    burst = b"".join(mq.encode(_subscribe(n, f"sa/{n}"), 5) for n in range(1, 51))
    burst += mq.encode(mq.PingReq(), 5) + mq.encode(_subscribe(51, "sa/#", Q1), 5)
    await client.send_raw(burst)
    got = [await client.receive() for _ in range(52)]
    assert [type(p) for p in got] == [mq.SubAck] * 50 + [mq.PingResp, mq.SubAck]
    assert [p.packet_id for p in got if isinstance(p, mq.SubAck)] == list(range(1, 52))
    last = got[-1]
    assert isinstance(last, mq.SubAck)
    assert last.reason_codes == (mq.ReasonCode.GRANTED_QOS_1,)
    await client.aclose()


async def test_subscribes_then_publish_in_one_read_answer_the_subscribes_first(server: Any) -> None:
    client, _ = await connect(server.address, "sub-pub")
    burst = mq.encode(_subscribe(1, "sp/a"), 4) + mq.encode(_subscribe(2, "sp/b"), 4)
    burst += mq.encode(mq.Publish("sp/a", b"hi", Q1, packet_id=3), 4)
    await client.send_raw(burst)
    first, second = await client.receive(), await client.receive()
    assert (first, second) == (mq.SubAck(1, (mq.ReasonCode.SUCCESS,)), mq.SubAck(2, (mq.ReasonCode.SUCCESS,)))
    rest = [await client.receive() for _ in range(2)]  # its PUBACK and its own delivery, either order
    assert mq.PubAck(3) in rest
    assert any(isinstance(p, mq.Publish) and p.payload == b"hi" for p in rest)
    await client.aclose()


async def test_subscribes_in_the_read_that_disconnects_are_answered_before_the_close(server: Any) -> None:
    client, _ = await connect(server.address, "sub-bye")
    burst = mq.encode(_subscribe(1, "sb/a"), 4) + mq.encode(_subscribe(2, "sb/b"), 4)
    await client.send_raw(burst + mq.encode(mq.Disconnect(), 4))
    got = await client.expect_eof()
    assert [p.packet_id for p in got if isinstance(p, mq.SubAck)] == [1, 2]
    await client.aclose()


async def test_retained_messages_follow_their_suback(server: Any) -> None:
    publisher, _ = await connect(server.address, "sr-pub")
    await publisher.send(mq.Publish("sr/t", b"kept", Q1, retain=True, packet_id=1))
    assert await publisher.receive() == mq.PubAck(1)
    client, _ = await connect(server.address, "sr-sub")
    burst = mq.encode(_subscribe(1, "sr/none"), 4) + mq.encode(_subscribe(2, "sr/t"), 4)
    await client.send_raw(burst)
    assert await client.receive() == mq.SubAck(1, (mq.ReasonCode.SUCCESS,))
    assert await client.receive() == mq.SubAck(2, (mq.ReasonCode.SUCCESS,))
    retained = await receive_publish(client)
    assert (retained.topic, retained.payload, retained.retain) == ("sr/t", b"kept", True)
    assert await drain(client) == []
    await publisher.aclose()
    await client.aclose()

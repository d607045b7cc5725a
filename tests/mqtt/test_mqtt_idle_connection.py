"""An idle MQTT connection is one task: no writer task while nothing waits to be sent, no drain watcher
of its own (the gateway's registry of live connections), no cancel scope per read, and no reader task
for a subscription that is caught up (it is an entry in its queue's push hub until woken)."""

from __future__ import annotations

from typing import Any

import trio

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.push_hub import Parking
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from .conftest import (  # type: ignore[import-not-found]
    all_parked,
    connect,
    gateway_of,
    receive_publish,
    running_server,
    subscribe,
)

Q1 = mq.QoS.AT_LEAST_ONCE


async def test_an_idle_connection_has_no_task_but_its_own_and_is_registered(server: Any) -> None:
    gateway = gateway_of(server)
    # receive maximum 1: the second unacknowledged QoS 1 delivery does not fit the in-flight window
    client, connack = await connect(
        server.address, "idle-1", 5, keep_alive=60, properties=mq.Properties(receive_maximum=1)
    )
    assert connack.reason_code == mq.ReasonCode.SUCCESS
    await wait_until(lambda: len(gateway.live) == 1)
    (conn,) = gateway.live
    await wait_until(lambda: not conn._writing)  # the CONNACK went straight to the socket
    assert conn._nursery is not None
    assert conn._nursery.running == 0, "an idle connection runs no child task"
    await subscribe(client, ("idle/t", Q1))  # a new subscription parks in its hub without a task
    assert conn._nursery.running == 0, "a caught-up subscription runs no task"
    assert isinstance(conn._readers["idle/t"], Parking)
    await all_parked(server, 1)
    publisher, _ = await connect(server.address, "idle-pub")
    await publisher.send(mq.Publish("idle/t", b"q1", Q1, packet_id=1))
    first = await receive_publish(client, ack=False)  # fits the window: the hub puts it in flight, no task
    assert (first.topic, first.payload, first.qos) == ("idle/t", b"q1", Q1)
    assert conn._nursery.running == 0
    assert isinstance(conn._readers["idle/t"], Parking)
    await publisher.send(mq.Publish("idle/t", b"q1-again", Q1, packet_id=2))
    await wait_until(lambda: not isinstance(conn._readers["idle/t"], Parking))  # the hub declined: woken
    assert conn._nursery.running == 1, "the woken reader runs as the connection's one task"
    assert first.packet_id is not None
    await client.send(mq.PubAck(first.packet_id))
    second = await receive_publish(client, ack=False)
    assert (second.topic, second.payload, second.qos) == ("idle/t", b"q1-again", Q1)
    assert second.packet_id is not None
    await client.send(mq.PubAck(second.packet_id))
    await publisher.aclose()
    await client.send(mq.PingReq())
    assert isinstance(await client.receive(), mq.PingResp)
    await client.send(mq.Disconnect())
    await client.expect_eof()
    await wait_until(lambda: not gateway.live)
    await client.aclose()


async def test_the_drain_reaches_registered_connections(log_sink: Any) -> None:
    async with running_server(Settings.for_tests()) as server:
        gateway = gateway_of(server)
        clients = [(await connect(server.address, f"drained-{n}", level=5))[0] for n in range(3)]
        await wait_until(lambda: len(gateway.live) == 3)
        server.stop("test")
        for client in clients:
            with trio.fail_after(5):
                got = await client.expect_eof()
            disconnects = [p for p in got if isinstance(p, mq.Disconnect)]
            assert [d.reason_code for d in disconnects] == [mq.ReasonCode.SERVER_SHUTTING_DOWN]
            await client.aclose()
        await wait_until(lambda: not gateway.live)

"""Soak (slow tier): the real server writes for a while with 64 KiB segments and a retention of about a
second; the commit log stays bounded, and the live state (a retained message, a persistent session) and a
live consumer come through. Prints the figures it measured."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from mqproxy.codecs import mqtt as mq
from mqproxy.settings import Settings
from tests.conftest import EventSink, wait_until
from tests.mqtt.conftest import RawClient, connect, receive_publish, subscribe
from tests.proxy.conftest import running_server

pytestmark = pytest.mark.slow

SOAK_S = 15.0
BODY = b"s" * 1024
SEGMENT = 64 * 1024
BOUND = 40 * SEGMENT  # what the log may hold at most: ~1 s of writing plus what one run leaves


def _log_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in (data / "commitlog").iterdir())


async def _publish_batch(client: RawClient, first_id: int, count: int) -> None:
    for i in range(count):
        await client.send(mq.Publish("soak/x", BODY, mq.QoS.AT_LEAST_ONCE, packet_id=first_id + i))
    for _ in range(count):
        ack = await client.receive()
        assert isinstance(ack, mq.PubAck), ack
        assert ack.reason_code == mq.ReasonCode.SUCCESS


async def test_disk_stays_bounded_and_live_state_survives(tmp_path: Path, log_sink: EventSink) -> None:
    data = tmp_path / "data"
    store = {
        "segment_bytes": SEGMENT,
        "file_reserved_hours": 1 / 3600,  # one second
        "delete_when": "*",
        "clean_interval_seconds": 0.2,
    }
    async with running_server(Settings.for_tests(data, store=store)) as server:
        address = server.address
        keeper, _ = await connect(address, "keeper", clean_start=False)
        await subscribe(keeper, ("soak/#", mq.QoS.AT_LEAST_ONCE))
        await keeper.send(mq.Disconnect())
        await keeper.aclose()
        producer, _ = await connect(address, "producer")
        await producer.send(
            mq.Publish("state/r", b"retained", mq.QoS.AT_LEAST_ONCE, retain=True, packet_id=1)
        )
        assert isinstance(await producer.receive(), mq.PubAck)
        reader, _ = await connect(address, "reader")
        await subscribe(reader, ("soak/#", mq.QoS.AT_MOST_ONCE))
        received = 0

        async def read() -> None:
            nonlocal received
            while True:
                await receive_publish(reader)
                received += 1

        sent = peak = 0
        packet_id = 2
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            deadline = trio.current_time() + SOAK_S
            while trio.current_time() < deadline:
                await _publish_batch(producer, packet_id, 50)
                packet_id = 2 if packet_id > 60000 else packet_id + 50
                sent += 50
                peak = max(peak, _log_bytes(data))
            await wait_until(lambda: received >= sent, 30)  # the live consumer read everything
            nursery.cancel_scope.cancel()
        written = sent * len(BODY)
        final = _log_bytes(data)
        index = (data / "index" / "data.mdb").stat().st_size
        deleted = log_sink.named("store.segment_deleted")
        print(
            f"\nsoak: {sent} messages ({written / 1e6:.1f} MB of bodies) in {SOAK_S:.0f} s, "
            f"commit log peak {peak / 1e6:.2f} MB, final {final / 1e6:.2f} MB, "
            f"index file {index / 1e6:.2f} MB, "
            f"{len(deleted)} segments deleted, {len(log_sink.named('store.live_records_moved'))} moves"
        )
        assert written > 2 * BOUND, "the soak wrote too little to show anything"
        assert peak <= BOUND, f"the commit log grew to {peak} bytes"
        assert deleted
        # live state: the retained message, the persistent session
        fresh, _ = await connect(address, "fresh")
        await subscribe(fresh, ("state/r", mq.QoS.AT_LEAST_ONCE))
        retained = await receive_publish(fresh)
        assert (retained.topic, retained.payload, retained.retain) == ("state/r", b"retained", True)
        keeper, connack = await connect(address, "keeper", clean_start=False)
        assert connack.session_present
        first = await receive_publish(keeper)  # what its queue still holds (the rest expired)
        assert first.topic == "soak/x"
        for client in (producer, reader, fresh, keeper):
            await client.aclose()

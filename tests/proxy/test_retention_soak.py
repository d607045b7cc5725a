"""Soak (slow tier): the real server writes for a while with 256 KiB segments and a retention of about a
second; the commit log stays bounded, and the live state (a retained message, a persistent session) and a
live consumer come through. Prints the figures it measured."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from mqproxy.codecs import mqtt as mq
from mqproxy.settings import Settings
from tests.conftest import EventSink
from tests.mqtt.conftest import RawClient, connect, receive_publish, subscribe
from tests.proxy.conftest import running_server

pytestmark = pytest.mark.slow

SOAK_S = 15.0  # at least; on until 3 x BOUND was written (at most MAX_SOAK_S)
MAX_SOAK_S = 40.0
BODY = b"s" * 1024
SEGMENT = 256 * 1024
BOUND = 16 * SEGMENT  # 4 MiB: the least the soak writes is 3 x this


def _log_bytes(data: Path) -> int:
    total = 0
    for path in (data / "commitlog").iterdir():
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # retention deleted it meanwhile
            pass
    return total


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
        "clean_interval_seconds": 0.1,
    }
    # no request events: the test validates every captured event, 12k of them would take half a minute
    settings = Settings.for_tests(data, store=store, log={"request_sample_rate": 0.0})
    async with running_server(settings) as server:
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
        last = trio.Event()

        async def read() -> None:
            nonlocal received
            while True:
                message = await receive_publish(reader)
                received += 1
                if message.payload == b"last":
                    last.set()

        sent = peak = 0
        samples: list[tuple[float, int]] = []  # (seconds into the soak, commit-log bytes)
        packet_id = 2
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            began = trio.current_time()
            while (elapsed := trio.current_time() - began) < MAX_SOAK_S and (
                elapsed < SOAK_S or sent * len(BODY) < 3 * BOUND
            ):
                await _publish_batch(producer, packet_id, 50)
                packet_id = 2 if packet_id > 60000 else packet_id + 50
                sent += 50
                size = _log_bytes(data)
                peak = max(peak, size)
                samples.append((elapsed, size))
            await producer.send(mq.Publish("soak/x", b"last", mq.QoS.AT_LEAST_ONCE, packet_id=1))
            assert isinstance(await producer.receive(), mq.PubAck)
            with trio.fail_after(30):  # the live consumer keeps up (one behind by more than the
                await last.wait()  # retention would skip what expired, as a RocketMQ consumer does)
            nursery.cancel_scope.cancel()
        written = sent * len(BODY)
        final = _log_bytes(data)
        index = (data / "index" / "data.mdb").stat().st_size
        deleted = log_sink.named("store.segment_deleted")
        print(
            f"\nsoak: {sent} messages ({written / 1e6:.1f} MB of bodies) in {elapsed:.0f} s, "
            f"commit log peak {peak / 1e6:.2f} MB, final {final / 1e6:.2f} MB, "
            f"index file {index / 1e6:.2f} MB, "
            f"{len(deleted)} segments deleted, {len(log_sink.named('store.live_records_moved'))} moves, "
            f"live consumer got {received}"
        )
        assert written > 2 * BOUND, "the soak wrote too little to show anything"
        # bounded: far below what was written, and not growing (the last third peaks no higher than twice
        # the first third, which includes the first second when nothing has expired yet)
        assert peak < written / 4, f"the commit log grew to {peak} bytes"
        first = max(size for at, size in samples if at < elapsed / 3)
        late = max(size for at, size in samples if at > 2 * elapsed / 3)
        assert late <= 2 * first, f"the commit log kept growing: {first} then {late} bytes"
        assert deleted
        assert received > sent // 2
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

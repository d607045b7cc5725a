"""FrameOutbox: concurrent callers' frames leave together, whole and in order; back-pressure without a
queue of waiters; a write cut short (failed, timed out, cancelled part-way) gives the outbox up."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing

from mqproxy.remoting_client.outbox import FrameOutbox, OutboxBroken

from ..conftest import wait_until  # type: ignore[import-not-found]


def frame(caller: int, seq: int, size: int = 24) -> bytes:
    """A length-prefixed test frame naming its caller and sequence number."""
    payload = struct.pack(">ii", caller, seq) + bytes([caller % 251]) * size
    return struct.pack(">i", len(payload)) + payload


def unframe(data: bytes) -> list[tuple[int, int]]:
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from(">i", data, at)
        payload = data[at + 4 : at + 4 + length]
        assert len(payload) == length, "cut frame"
        caller, seq = struct.unpack_from(">ii", payload)
        assert payload[8:] == bytes([caller % 251]) * (length - 8), "frame bytes mixed up"
        out.append((caller, seq))
        at += 4 + length
    return out


class RecordingStream(trio.abc.SendStream):
    """Takes every write whole; each write waits (shielded, as if the bytes were already out) until
    ``release`` is set when ``hold`` is True."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.hold = False
        self.release = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        with trio.CancelScope(shield=True):
            if self.hold:
                await self.release.wait()
            await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class CutStream(RecordingStream):
    """Writes the first half of a write, then blocks (cancellable) as a full socket buffer does."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data)[: len(data) // 2])
        await trio.sleep_forever()


async def test_concurrent_callers_frames_arrive_whole_and_in_order_over_a_socket() -> None:
    a, b = trio.socket.socketpair()
    sender, receiver = trio.SocketStream(a), trio.SocketStream(b)
    outbox = FrameOutbox(sender, max_bytes=64 * 1024)
    callers, per_caller = 20, 50
    expected = callers * per_caller * len(frame(0, 0))
    received = bytearray()

    async def caller(n: int) -> None:
        for seq in range(per_caller):
            await outbox.put(frame(n, seq))
            if seq % 7 == n % 7:
                await trio.lowlevel.checkpoint()  # interleave with the other callers

    async def read() -> None:
        while len(received) < expected:
            received.extend(await receiver.receive_some(65536))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        for n in range(callers):
            nursery.start_soon(caller, n)
    got = unframe(bytes(received))
    assert len(got) == callers * per_caller
    for n in range(callers):
        assert [seq for c, seq in got if c == n] == list(range(per_caller))
    assert outbox.writes < callers * per_caller  # frames went out together
    assert outbox.broken is None
    await sender.aclose()
    await receiver.aclose()


async def test_callers_wait_for_room_and_all_wake_when_the_writer_takes_the_queue() -> None:
    stream = RecordingStream()
    stream.hold = True
    outbox = FrameOutbox(stream, max_bytes=3 * len(frame(0, 0)))
    done: list[int] = []

    async def caller(n: int) -> None:
        await outbox.put(frame(n, 0))
        done.append(n)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller, 0)  # the writer: held in its first write
        await wait_until(lambda: len(stream.writes) == 1)
        for n in range(1, 8):
            nursery.start_soon(caller, n)
        await trio.testing.wait_all_tasks_blocked()
        first = list(done)
        assert len(first) == 3  # three frames fill the outbox; four callers wait
        assert outbox.queued_bytes == 3 * len(frame(0, 0))
        stream.release.set()
    assert sorted(done) == list(range(8))
    got = unframe(b"".join(stream.writes))
    assert sorted(c for c, _ in got) == list(range(8))
    assert unframe(stream.writes[1]) == [(n, 0) for n in first]  # one write for the queued three
    assert len(stream.writes) < 8


async def test_a_writer_cancelled_part_way_gives_the_outbox_up() -> None:
    stream = CutStream()
    broken: list[tuple[str, str | None]] = []
    outbox = FrameOutbox(stream, max_bytes=2 * len(frame(0, 0)), on_broken=lambda *r: broken.append(r))
    outcomes: dict[int, str] = {}

    async def caller(n: int) -> None:
        try:
            await outbox.put(frame(n, 0))
            outcomes[n] = "queued"
        except OutboxBroken as exc:
            outcomes[n] = exc.reason

    writer_scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_in_scope, writer_scope, outbox.put(frame(9, 0)))
        await wait_until(lambda: len(stream.writes) == 1)
        for n in range(4):  # two fit in the outbox, two wait for room
            nursery.start_soon(caller, n)
        await trio.testing.wait_all_tasks_blocked()
        writer_scope.cancel()
    assert broken == [("write_cancelled", "cancelled part-way through a write")]
    assert sorted(outcomes.values()) == ["queued", "queued", "write_cancelled", "write_cancelled"]
    assert stream.writes == [frame(9, 0)[: len(frame(9, 0)) // 2]]  # nothing after the cut frame
    with pytest.raises(OutboxBroken):
        await outbox.put(frame(5, 0))


async def _in_scope(scope: trio.CancelScope, work: object) -> None:
    with scope:
        await work  # type: ignore[misc]


async def test_a_writer_cancelled_between_writes_hands_the_rest_over() -> None:
    stream = RecordingStream()
    stream.hold = True
    outbox = FrameOutbox(stream, max_bytes=1 << 20)
    async with trio.open_nursery() as nursery:
        outbox.nursery = nursery
        scope = trio.CancelScope()
        nursery.start_soon(_in_scope, scope, outbox.put(frame(1, 0)))
        await wait_until(lambda: len(stream.writes) == 1)
        await outbox.put(frame(2, 0))  # queued behind the write under way
        scope.cancel()  # the first write is out; the writer is cancelled before the second
        stream.release.set()
    assert [unframe(w) for w in stream.writes] == [[(1, 0)], [(2, 0)]]
    assert outbox.broken is None


async def test_a_peer_that_stops_reading_ends_the_outbox_after_the_write_timeout(autojump_clock) -> None:
    sender, receiver = trio.testing.lockstep_stream_pair()  # a write waits for the peer to read
    broken: list[str] = []
    outbox = FrameOutbox(
        sender, max_bytes=len(frame(0, 0)), write_timeout_s=5.0, on_broken=lambda r, d: broken.append(r)
    )
    errors: list[str] = []

    async def caller(n: int) -> None:
        try:
            await outbox.put(frame(n, 0))
        except OutboxBroken as exc:
            errors.append(exc.reason)

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(caller, n)
    assert broken == ["write_timeout"]
    assert trio.current_time() == pytest.approx(5.0)
    assert sorted(errors) == ["write_timeout", "write_timeout"]  # the writer and the caller left waiting
    await receiver.aclose()


async def test_a_failed_write_reports_connection_lost() -> None:
    a, b = trio.socket.socketpair()
    sender = trio.SocketStream(a)
    b.close()
    broken: list[str] = []
    outbox = FrameOutbox(sender, max_bytes=1024, on_broken=lambda r, d: broken.append(r))
    with pytest.raises(OutboxBroken) as info:
        await outbox.put(frame(0, 0))
    assert info.value.reason == "connection_lost"
    assert broken == ["connection_lost"]
    await sender.aclose()


async def test_flush_waits_until_every_frame_put_so_far_was_written() -> None:
    stream = RecordingStream()
    stream.hold = True
    outbox = FrameOutbox(stream, max_bytes=64 * 1024)
    flushed = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.put, frame(0, 0))  # the writer: held in its first write
        await wait_until(lambda: len(stream.writes) == 1)
        await outbox.put(frame(1, 0))  # queued behind it: put returns before the frame left

        async def flush() -> None:
            await outbox.flush()
            flushed.set()

        nursery.start_soon(flush)
        await trio.testing.wait_all_tasks_blocked()
        assert not flushed.is_set(), "a frame is still queued"
        stream.release.set()
    assert flushed.is_set()
    assert unframe(b"".join(stream.writes)) == [(0, 0), (1, 0)]
    await outbox.flush()  # nothing under way: returns at once


async def test_with_a_nursery_the_frames_of_one_scheduling_round_leave_in_one_write() -> None:
    stream = RecordingStream()
    async with trio.open_nursery() as nursery:
        outbox = FrameOutbox(stream, max_bytes=1 << 20, nursery=nursery)
        for n in range(5):
            nursery.start_soon(outbox.put, frame(n, 0))
    (write,) = stream.writes  # trio runs a round's tasks in either order
    assert sorted(unframe(write)) == [(n, 0) for n in range(5)]
    assert outbox.writes == 1


async def test_a_writer_cancelled_before_its_first_write_hands_its_frames_over() -> None:
    stream = RecordingStream()
    scope = trio.CancelScope()

    async def cancels_the_other_and_puts() -> None:
        scope.cancel()  # run after the other became the writer: it is cancelled in its yield
        await outbox.put(frame(2, 0))

    async with trio.open_nursery() as nursery:
        outbox = FrameOutbox(stream, max_bytes=1 << 20, nursery=nursery)
        nursery.start_soon(_in_scope, scope, outbox.put(frame(1, 0)))
        nursery.start_soon(cancels_the_other_and_puts)  # same round, either order: the same outcome
    (write,) = stream.writes
    assert sorted(unframe(write)) == [(1, 0), (2, 0)]
    assert outbox.broken is None


async def test_a_caller_waiting_for_room_gives_up_at_its_deadline(autojump_clock: object) -> None:
    stream = RecordingStream()
    stream.hold = True
    outbox = FrameOutbox(stream, max_bytes=len(frame(0, 0)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.put, frame(0, 0))  # the writer, held in its write
        await wait_until(lambda: len(stream.writes) == 1)
        await outbox.put(frame(1, 0))  # fills the queue
        with pytest.raises(trio.TooSlowError):
            await outbox.put(frame(2, 0), deadline=trio.current_time() + 2.0)
        assert trio.current_time() == pytest.approx(2.0, abs=0.1)
        stream.release.set()
    assert unframe(b"".join(stream.writes)) == [(0, 0), (1, 0)]
    assert outbox.broken is None

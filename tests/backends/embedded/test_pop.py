"""Pop consumption: receipts, ack, change-invisible, revive, order pop, restart (both backends)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.services import BrokerServices, ServiceSettings, open_services
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import AckOutcome, InitMode
from mqproxy.model.errors import (
    InvalidArgument,
    MalformedReceipt,
    MessageAlreadyAcked,
    OffsetOutOfRange,
    QueueNotFound,
    ReceiptExpired,
    TopicNotFound,
)
from mqproxy.model.receipts import PopResult, Receipt, pop_retry_topic
from mqproxy.model.types import Message, TagFilter

from .conftest import MakeBackend, MakeServices  # type: ignore[import-not-found]

G, T = "G", "Orders"


async def _fill(backend: MessageStore, n: int, queue_id: int = 0, tag: str = "A") -> None:
    await backend.create_topic(T, 2)
    for i in range(n):
        await backend.send(Message(T, f"m{i}".encode(), queue_id=queue_id, properties={"TAGS": tag}))


def _bodies(result: PopResult) -> list[bytes]:
    return [p.message.body for p in result.messages]


# --- receipts --------------------------------------------------------------------------------------
def test_receipt_golden_round_trip() -> None:
    text = "120 1700000000123 60000 3 0 broker-a 2 125"
    receipt = Receipt.decode(text)
    assert receipt == Receipt(120, 1_700_000_000_123, 60_000, 3, 0, "broker-a", 2, 125)
    assert receipt.encode() == text
    assert receipt.deadline_ms == 1_700_000_060_123
    assert receipt.real_topic("G", "T") == "T"
    assert Receipt.decode("1 2 3 4 1 b 0 5").real_topic("G", "T") == "%RETRY%G_T"
    assert Receipt.decode("1 2 3 4 2 b 0 5").real_topic("G", "T") == "%RETRY%G+T"
    assert Receipt.decode(text + " 999 extra").offset == 125


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1 2 3",
        "a 2 3 4 0 b 0 5",
        "1 2 3 4 7 b 0 5",
        "1 2 3 4 0 b -1 5",
        "1  2 3 4 0 b 0 5",
        "1 2 3 4 0 b 0 ²",
    ],
)
def test_malformed_receipts(text: str) -> None:
    with pytest.raises(MalformedReceipt):
        Receipt.decode(text)


@given(st.text(max_size=80))
def test_receipt_decode_only_raises_malformed(text: str) -> None:
    try:
        receipt = Receipt.decode(text)
    except MalformedReceipt:
        return
    assert Receipt.decode(receipt.encode()) == receipt


# --- pop / ack / revive ------------------------------------------------------------------------------
async def test_pop_hides_messages_and_ack_prevents_revive(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    clock = trio_clock_ms()
    async with make_services(now_ms=clock) as (backend, services):
        await _fill(backend, 3)
        popped = await services.pop.pop(G, T, 0, 2, 10_000, broker_name="b")
        assert _bodies(popped) == [b"m0", b"m1"]
        assert (popped.invisible_ms, popped.rest, popped.pop_time_ms) == (10_000, 1, clock())
        assert popped.start_offset_info() == "0 0 0"
        assert popped.msg_offset_info() == "0 0 0,1"
        first, second = popped.messages
        assert first.receipt.encode() == f"0 {clock()} 10000 {popped.revive_qid} 0 b 0 0"
        assert (first.topic, first.delivery_attempt) == (T, 1)
        assert _bodies(await services.pop.pop(G, T, 0, 32, 10_000)) == [b"m2"]
        assert (await services.pop.pop(G, T, 0, 32, 10_000)).messages == ()
        assert await services.pop.ack(G, T, first.receipt) is AckOutcome.ACKED
        assert await services.pop.ack(G, T, first.receipt.encode()) is AckOutcome.ALREADY_ACKED
        await trio.sleep(10.5)
        # m1 and m2 were not acked: revived into the pop retry topic, delivered again.
        again = await services.pop.pop(G, T, None, 32, 10_000)
        assert sorted(_bodies(again)) == [b"m1", b"m2"]
        assert {p.message.topic for p in again.messages} == {pop_retry_topic(G, T)} == {"%RETRY%G_Orders"}
        assert {(p.topic, p.delivery_attempt, p.receipt.retry_flag) for p in again.messages} == {(T, 2, 1)}
        assert all(p.message.properties["1ST_POP_TIME"] for p in again.messages)
        with pytest.raises(ReceiptExpired):
            await services.pop.ack(G, T, second.receipt)
        for p in again.messages:
            assert await services.pop.ack(G, T, p.receipt) is AckOutcome.ACKED
        await trio.sleep(60)
        assert (await services.pop.pop(G, T, None, 32, 10_000)).messages == ()
        assert services.pop.revived == 2
        assert services.pop.in_flight == 0


async def test_bad_pop_and_ack_requests(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        await _fill(backend, 1)
        pop = services.pop
        for count in (0, 33):
            with pytest.raises(InvalidArgument):
                await pop.pop(G, T, 0, count, 1000)
        with pytest.raises(InvalidArgument):
            await pop.pop(G, T, 0, 1, 0)
        with pytest.raises(InvalidArgument):
            await pop.pop("", T, 0, 1, 1000)
        with pytest.raises(TopicNotFound):
            await pop.pop(G, "Nope", None, 1, 1000)
        with pytest.raises(QueueNotFound):
            await pop.pop(G, T, 7, 1, 1000)
        (p,) = (await pop.pop(G, T, 0, 1, 1000)).messages
        r = p.receipt
        with pytest.raises(OffsetOutOfRange):
            await pop.ack(
                G, T, Receipt(r.ck_offset, r.pop_time_ms, r.invisible_ms, r.revive_qid, 0, "", 0, 5)
            )
        with pytest.raises(ReceiptExpired):  # wrong pop time: no such checkpoint
            await pop.ack(
                G, T, Receipt(r.ck_offset, r.pop_time_ms + 1, r.invisible_ms, r.revive_qid, 0, "", 0, 0)
            )
        with pytest.raises(QueueNotFound):
            await pop.ack(G, T, Receipt(0, r.pop_time_ms, 1000, 0, 0, "", 9, 0))
        with pytest.raises(TopicNotFound):
            await pop.ack(G, "Nope", r)
        with pytest.raises(MalformedReceipt):
            await pop.ack(G, T, "garbage")
        assert await pop.ack(G, T, r) is AckOutcome.ACKED


async def test_change_invisible(make_services: MakeServices, autojump_clock: trio.testing.MockClock) -> None:
    clock = trio_clock_ms()
    async with make_services(now_ms=clock) as (backend, services):
        await _fill(backend, 2)
        a, b = (await services.pop.pop(G, T, 0, 2, 10_000)).messages
        await trio.sleep(5)
        changed = await services.pop.change_invisible(G, T, a.receipt, 60_000)
        assert (changed.ck_offset, changed.offset, changed.pop_time_ms, changed.invisible_ms) == (
            0,
            0,
            clock(),
            60_000,
        )
        with pytest.raises(ReceiptExpired):  # the old handle is superseded
            await services.pop.ack(G, T, a.receipt)
        await services.pop.ack(G, T, b.receipt)
        with pytest.raises(MessageAlreadyAcked):
            await services.pop.change_invisible(G, T, b.receipt, 1000)
        await trio.sleep(10)
        assert (await services.pop.pop(G, T, None, 32, 10_000)).messages == ()  # not revived at 15 s
        await trio.sleep(51)
        (again,) = (await services.pop.pop(G, T, None, 32, 10_000)).messages
        assert (again.message.body, again.delivery_attempt) == (b"m0", 2)
        with pytest.raises(InvalidArgument):
            await services.pop.change_invisible(G, T, again.receipt, -1)


async def test_change_invisible_in_the_same_millisecond(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        await _fill(backend, 1)
        (a,) = (await services.pop.pop(G, T, 0, 1, 10_000)).messages
        changed = await services.pop.change_invisible(G, T, a.receipt, 20_000)
        assert changed.pop_time_ms == a.receipt.pop_time_ms + 1  # CK key (offset 0, time) stays unique
        again = await services.pop.change_invisible(G, T, changed, 30_000)
        assert again.pop_time_ms == a.receipt.pop_time_ms + 2
        for stale in (a.receipt, changed):
            with pytest.raises(ReceiptExpired):
                await services.pop.ack(G, T, stale)
        assert await services.pop.ack(G, T, again) is AckOutcome.ACKED
        await trio.sleep(40)
        assert (await services.pop.pop(G, T, None, 32, 5000)).messages == ()


async def test_filter_peek_and_has_message(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        await _fill(backend, 2, tag="A")
        await _fill(backend, 2, tag="B")
        assert await services.pop.has_message(G, T, None)
        peeked = await services.pop.peek(G, T, None, 32)
        assert [m.body for m in peeked] == [b"m0", b"m1", b"m0", b"m1"]
        popped = await services.pop.pop(G, T, 0, 32, 5000, tag_filter=TagFilter.parse("B"))
        assert [p.message.tags for p in popped.messages] == ["B", "B"]
        assert not await services.pop.has_message(G, T, 0)  # A messages were filtered past
        assert await services.pop.peek(G, T, 0, 5) == []


async def test_long_polling_wakes_on_arrival(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        await backend.create_topic(T, 2)
        start = trio.current_time()

        async def later() -> None:
            await trio.sleep(1.5)
            await backend.send(Message(T, b"late", queue_id=1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(later)
            popped = await services.pop.pop(G, T, None, 4, 5000, poll_s=10)
        assert _bodies(popped) == [b"late"]
        assert trio.current_time() - start == pytest.approx(1.5)
        empty = await services.pop.pop(G, T, None, 4, 5000, poll_s=2)
        assert empty.messages == ()
        assert trio.current_time() - start == pytest.approx(3.5)


async def test_long_poll_sees_a_retry_topic_created_while_it_waits(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        await _fill(backend, 1)
        first = await services.pop.pop(G, T, None, 1, 2000)
        assert _bodies(first) == [b"m0"]
        assert await backend.get_topic(pop_retry_topic(G, T)) is None
        start = trio.current_time()
        # Not acked: revived at 2 s into the retry topic, which does not exist yet when this poll starts.
        again = await services.pop.pop(G, T, None, 1, 2000, poll_s=20)
        assert _bodies(again) == [b"m0"]
        assert again.messages[0].delivery_attempt == 2
        assert trio.current_time() - start < 4


async def test_init_mode_max_starts_at_the_last_message(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        services = BrokerServices(backend)
        await _fill(backend, 5)
        popped = await services.pop.pop(G, T, 0, 32, 5000, init_mode=InitMode.MAX)
        assert _bodies(popped) == [b"m4"]


async def test_revive_past_max_reconsume_goes_to_dlq(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ServiceSettings(max_reconsume_times=1)
    async with make_services(settings) as (backend, services):
        await _fill(backend, 1)
        assert len((await services.pop.pop(G, T, 0, 1, 1000)).messages) == 1
        await trio.sleep(1.5)
        (retry,) = (await services.pop.pop(G, T, None, 1, 1000)).messages
        assert retry.message.reconsume_times == 1
        await trio.sleep(1.5)
        assert (await services.pop.pop(G, T, None, 1, 1000)).messages == ()
        (dead,) = (await backend.pull("%DLQ%G", 0, 0, 10)).messages
        assert dead.body == b"m0"
        assert dead.properties["DLQ_ORIGIN_TOPIC"] == "%RETRY%G_Orders"


async def test_concurrent_pops_never_share_a_message(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        await _fill(backend, 50, queue_id=0)
        await _fill(backend, 50, queue_id=1)
        got: list[bytes] = []

        async def consumer() -> None:
            while True:
                result = await services.pop.pop(G, T, None, 3, 60_000)
                if not result.messages:
                    return
                for p in result.messages:
                    got.append(p.message.body + bytes([p.receipt.queue_id]))
                    await services.pop.ack(G, T, p.receipt)

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(consumer)
        assert len(got) == 100
        assert len(set(got)) == 100


async def test_ack_many_reports_each_entry(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        await _fill(backend, 3, queue_id=0)
        await _fill(backend, 3, queue_id=1)
        a = await services.pop.pop(G, T, 0, 3, 5000)
        b = await services.pop.pop(G, T, 1, 3, 5000)
        receipts: list[Receipt | str] = [p.receipt for p in a.messages[:2]] + [b.messages[0].receipt.encode()]
        receipts += ["junk", a.messages[0].receipt]
        outcomes = await services.pop.ack_many(G, T, receipts)
        assert outcomes[:3] == [AckOutcome.ACKED] * 3
        assert isinstance(outcomes[3], MalformedReceipt)
        assert outcomes[4] is AckOutcome.ALREADY_ACKED
        await trio.sleep(6)
        again = await services.pop.pop(G, T, None, 32, 5000)
        assert sorted(_bodies(again)) == [b"m1", b"m2", b"m2"]  # only the un-acked ones revived


async def test_forward_to_dlq(make_services: MakeServices, autojump_clock: trio.testing.MockClock) -> None:
    async with make_services() as (backend, services):
        await _fill(backend, 2)
        a, b = (await services.pop.pop(G, T, 0, 2, 5000)).messages
        result = await services.pop.forward_to_dlq(G, T, a.receipt)
        assert result.topic == "%DLQ%G"
        (dead,) = (await backend.pull("%DLQ%G", 0, 0, 10)).messages
        assert (dead.body, dead.properties["DLQ_ORIGIN_TOPIC"]) == (b"m0", T)
        await services.pop.ack(G, T, b.receipt)
        for receipt in (a.receipt, b.receipt):
            with pytest.raises(MessageAlreadyAcked):
                await services.pop.forward_to_dlq(G, T, receipt)
        await trio.sleep(10)
        assert (await services.pop.pop(G, T, None, 32, 5000)).messages == ()


# --- order pop --------------------------------------------------------------------------------------
async def test_order_pop_blocks_the_queue_until_acked(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        await _fill(backend, 4)
        pop = services.pop
        first = await pop.pop(G, T, 0, 2, 10_000, order=True)
        assert _bodies(first) == [b"m0", b"m1"]
        assert first.revive_qid == 999
        assert first.order_count_info() == "0 qo0%0 0;0 qo0%1 0"
        assert (await pop.pop(G, T, 0, 2, 10_000, order=True)).messages == ()  # blocked
        await pop.ack(G, T, first.messages[0].receipt)
        assert await backend.query_consumer_offset(G, T, 0) == 1
        assert (await pop.pop(G, T, 0, 2, 10_000, order=True)).messages == ()  # still one in flight
        await trio.sleep(10.5)  # m1 un-acked: the same messages again, attempt count 1
        again = await pop.pop(G, T, 0, 2, 10_000, order=True)
        assert _bodies(again) == [b"m1", b"m2"]
        assert again.order_counts[(0, 0)] == [1, 0]
        with pytest.raises(ReceiptExpired):
            await pop.ack(G, T, first.messages[1].receipt)
        changed = await pop.change_invisible(G, T, again.messages[0].receipt, 30_000)
        assert changed.pop_time_ms == again.pop_time_ms
        assert changed.invisible_ms == 30_000
        for p in again.messages:
            await pop.ack(G, T, p.receipt)
        with pytest.raises(ReceiptExpired):
            await pop.change_invisible(G, T, again.messages[0].receipt, 1000)
        assert _bodies(await pop.pop(G, T, 0, 2, 10_000, order=True)) == [b"m3"]
        assert await backend.query_consumer_offset(G, T, 0) == 3


# --- restart -------------------------------------------------------------------------------------------
async def test_restart_revives_unacked_and_not_acked(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    clock = trio_clock_ms()
    path = tmp_path / "store"
    async with open_embedded_store(path) as store, open_services(store, now_ms=clock) as services:
        await _fill(store, 4)
        popped = await services.pop.pop(G, T, 0, 3, 30_000)
        a, _b, c = popped.messages
        await services.pop.ack(G, T, a.receipt)
        await trio.sleep(2)
    async with open_embedded_store(path) as store, open_services(store, now_ms=clock) as services:
        assert services.pop.in_flight == 2
        assert await services.pop.ack(G, T, c.receipt) is AckOutcome.ACKED  # a pre-restart receipt
        assert await services.pop.ack(G, T, a.receipt) is AckOutcome.ALREADY_ACKED  # replayed ack
        (d,) = (await services.pop.pop(G, T, 0, 32, 30_000)).messages
        assert d.message.body == b"m3"
        await trio.sleep(30)
        revived = await services.pop.pop(G, T, None, 32, 30_000)
        assert sorted(_bodies(revived)) == [b"m1", b"m3"]
        for p in revived.messages:
            await services.pop.ack(G, T, p.receipt)
        await trio.sleep(2)
    async with open_embedded_store(path) as store, open_services(store, now_ms=clock) as services:
        assert services.pop.in_flight == 0
        await trio.sleep(120)
        assert (await services.pop.pop(G, T, None, 32, 30_000)).messages == ()

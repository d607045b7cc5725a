"""Transactions: half messages, commit/rollback, check-back, discard, restart (both backends)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.services import ServiceSettings, open_services
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import Resolution, TransactionCheck
from mqproxy.model.errors import (
    InvalidArgument,
    TransactionAlreadyResolved,
    TransactionCheckWindowClosed,
    TransactionGroupMismatch,
    TransactionNotFound,
)
from mqproxy.model.properties import CHECK_MAX_TOPIC, HALF_TOPIC
from mqproxy.model.types import Message, StoredMessage

from .conftest import MakeServices  # type: ignore[import-not-found]

COMMIT, ROLLBACK = Resolution.COMMIT, Resolution.ROLLBACK


def half(uniq: str = "TX1", **props: str) -> Message:
    properties = {"TRAN_MSG": "true", "PGROUP": "PG", "UNIQ_KEY": uniq, "TAGS": "A", **props}
    return Message("Orders", b"tx", queue_id=1, properties=properties, sys_flag=0x4)


async def _all(backend: MessageStore, topic: str) -> list[StoredMessage]:
    if await backend.get_topic(topic) is None:
        return []
    return list((await backend.pull(topic, 1 if topic == "Orders" else 0, 0, 100)).messages)


class Checks:
    def __init__(self, online: bool = True) -> None:
        self.seen: list[tuple[float, TransactionCheck]] = []
        self.online = online

    async def __call__(self, check: TransactionCheck) -> bool:
        self.seen.append((trio.current_time(), check))
        return self.online


async def test_commit_makes_the_message_visible_once(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        prepared = await services.send(half())
        assert (prepared.topic, prepared.queue_id) == (HALF_TOPIC, 0)
        assert await _all(backend, "Orders") == []
        stored = (await backend.pull(HALF_TOPIC, 0, prepared.queue_offset, 1)).messages[0]
        assert stored.properties["REAL_TOPIC"] == "Orders"
        assert stored.properties["REAL_QID"] == "1"
        assert stored.properties["__transactionId__"] == "TX1"
        assert stored.sys_flag & 0xC == 0
        result = await services.transactions.end(
            resolution=COMMIT, producer_group="PG", commitlog_offset=prepared.commitlog_offset
        )
        assert result is not None
        assert (result.topic, result.queue_id) == ("Orders", 1)
        (committed,) = await _all(backend, "Orders")
        assert committed.sys_flag & 0xC == 0x8
        assert committed.properties["TRAN_PREPARED_QUEUE_OFFSET"] == str(prepared.queue_offset)
        for gone in ("REAL_TOPIC", "REAL_QID", "TRAN_HALF_TIME_MS"):
            assert gone not in committed.properties
        # the Java broker keeps TRAN_MSG on the committed message (consumers take the transaction id
        # from UNIQ_KEY when they see it)
        assert committed.properties["TRAN_MSG"] == "true"
        assert committed.properties["UNIQ_KEY"] == "TX1"
        with pytest.raises(TransactionAlreadyResolved):
            await services.transactions.end(
                resolution=COMMIT, producer_group="PG", commitlog_offset=prepared.commitlog_offset
            )
        assert services.transactions.unresolved == 0


async def test_concurrent_commits_store_the_message_once(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    """The producer's own END_TRANSACTION and its answer to a check-back can arrive together: the second
    one is refused while the first stores the committed message (a stock broker stores it twice)."""
    async with make_services() as (backend, services):
        prepared = await services.send(half())
        outcomes: list[object] = []

        async def commit(from_check: bool) -> None:
            try:
                outcomes.append(
                    await services.transactions.end(
                        resolution=COMMIT,
                        producer_group="PG",
                        commitlog_offset=prepared.commitlog_offset,
                        from_check=from_check,
                    )
                )
            except TransactionAlreadyResolved as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(commit, False)
            nursery.start_soon(commit, True)
        assert sorted(type(o).__name__ for o in outcomes) == ["SendResult", "TransactionAlreadyResolved"]
        assert [m.body for m in await _all(backend, "Orders")] == [b"tx"]
        assert services.transactions.unresolved == 0


async def test_rollback_and_unknown(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        prepared = await services.send(half())
        tx = services.transactions
        assert (
            await tx.end(resolution=Resolution.UNKNOWN, producer_group="PG", commitlog_offset=1 << 40) is None
        )
        assert tx.unresolved == 1
        assert (
            await tx.end(resolution=ROLLBACK, producer_group="PG", commitlog_offset=prepared.commitlog_offset)
            is None
        )
        assert tx.unresolved == 0
        await trio.sleep(60)
        assert await _all(backend, "Orders") == []


async def test_bad_end_requests(make_services: MakeServices, autojump_clock: trio.testing.MockClock) -> None:
    async with make_services() as (backend, services):
        tx = services.transactions
        plain = await backend.send(Message("Orders", b"plain", queue_id=1))
        prepared = await services.send(half())
        for offset in (1 << 40, -1, plain.commitlog_offset):
            with pytest.raises(TransactionNotFound):
                await tx.end(resolution=COMMIT, producer_group="PG", commitlog_offset=offset)
        with pytest.raises(TransactionNotFound):
            await tx.end(resolution=COMMIT, producer_group=None, transaction_id="nope")
        with pytest.raises(TransactionGroupMismatch):
            await tx.end(
                resolution=COMMIT, producer_group="OTHER", commitlog_offset=prepared.commitlog_offset
            )
        with pytest.raises(InvalidArgument, match="PGROUP"):
            await services.send(Message("Orders", b"x", properties={"TRAN_MSG": "true"}))
        assert [m.body for m in await _all(backend, "Orders")] == [b"plain"]


async def test_a_consumers_resend_of_a_committed_message_is_not_a_half_message(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    """The committed message keeps TRAN_MSG=true; the Java client's fallback when send-back fails sends
    it again with reconsumeTimes > 0 and a DELAY level, and that is stored (parked), not held as a half
    message (the Java broker makes the same exception)."""
    async with make_services() as (backend, services):
        resend = Message(
            "%RETRY%G",
            b"tx",
            properties={"TRAN_MSG": "true", "PGROUP": "PG", "DELAY": "3"},
            sys_flag=0x4,
            reconsume_times=1,
        )
        await services.send(resend)
        assert services.transactions.unresolved == 0
        assert await _all(backend, HALF_TOPIC) == []
        first_try = dataclasses.replace(resend, reconsume_times=0)
        await services.send(first_try)
        assert services.transactions.unresolved == 1


async def test_end_by_transaction_id_and_delayed_commit(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ServiceSettings(delay_levels="1s 2s")
    async with make_services(settings) as (backend, services):
        await services.send(half("TXD", DELAY="2"))
        await services.transactions.end(resolution=COMMIT, producer_group=None, transaction_id="TXD")
        assert await _all(backend, "Orders") == []
        await trio.sleep(2.1)
        (delivered,) = await _all(backend, "Orders")
        assert delivered.properties["UNIQ_KEY"] == "TXD"


async def test_check_back_then_discard(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock, log_sink: Any
) -> None:
    checks = Checks()
    settings = ServiceSettings(
        transaction_timeout_s=6, transaction_check_interval_s=30, transaction_check_max=3
    )
    async with make_services(settings, check_back=checks) as (backend, services):
        start = trio.current_time()
        prepared = await services.send(half())
        await trio.sleep(5.9)
        assert checks.seen == []
        await trio.sleep(64.1)
        times = [round(t - start, 1) for t, _ in checks.seen]
        assert times == [6.0, 36.0, 66.0]
        _, check = checks.seen[0]
        assert (check.producer_group, check.transaction_id, check.check_times) == ("PG", "TX1", 1)
        assert (check.half.commitlog_offset, check.half.queue_offset) == (
            prepared.commitlog_offset,
            prepared.queue_offset,
        )
        assert (check.message.topic, check.message.queue_id) == ("Orders", 1)
        assert checks.seen[2][1].message.properties["TRANSACTION_CHECK_TIMES"] == "3"
        assert services.transactions.unresolved == 1
        await trio.sleep(30)  # the 4th due check finds check_max reached: discard
        assert services.transactions.unresolved == 0
        assert len(checks.seen) == 3
        assert [m.body for m in await _all(backend, CHECK_MAX_TOPIC)] == [b"tx"]
        with pytest.raises(TransactionAlreadyResolved):
            await services.transactions.end(
                resolution=COMMIT, producer_group="PG", commitlog_offset=prepared.commitlog_offset
            )
    (event,) = log_sink.named("txn.discarded")
    assert (event["group"], event["topic"], event["reason"]) == ("PG", "Orders", "check_max_exceeded")


async def test_a_failing_check_back_does_not_stop_the_checker(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    calls: list[str] = []

    async def broken(check: TransactionCheck) -> bool:
        calls.append(check.transaction_id)
        raise RuntimeError("producer went away")

    settings = ServiceSettings(
        transaction_timeout_s=1, transaction_check_interval_s=1, transaction_check_max=5
    )
    async with make_services(settings, check_back=broken) as (_backend, services):
        await services.send(half())
        await trio.sleep(3.5)
        assert calls == ["TX1", "TX1", "TX1"]


async def test_immunity_window(make_services: MakeServices, autojump_clock: trio.testing.MockClock) -> None:
    checks = Checks()
    async with make_services(check_back=checks) as (backend, services):
        start = trio.current_time()
        late = await services.send(half("TXL", CHECK_IMMUNITY_TIME_IN_SECONDS="20"))
        await trio.sleep(21)
        assert [round(t - start) for t, _ in checks.seen] == [20]
        with pytest.raises(TransactionCheckWindowClosed):
            await services.transactions.end(
                resolution=COMMIT, producer_group="PG", commitlog_offset=late.commitlog_offset
            )
        await services.transactions.end(
            resolution=COMMIT, producer_group="PG", commitlog_offset=late.commitlog_offset, from_check=True
        )
        assert len(await _all(backend, "Orders")) == 1


async def test_immunity_shorter_than_the_timeout_comes_first(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    """The immunity time replaces the timeout (the Java broker checks after it), so a short one is
    checked before the timeout; a malformed one falls back to the timeout."""
    checks = Checks()
    settings = ServiceSettings(transaction_timeout_s=6, transaction_check_interval_s=30)
    async with make_services(settings, check_back=checks) as (_backend, services):
        start = trio.current_time()
        await services.send(half("TXS", CHECK_IMMUNITY_TIME_IN_SECONDS="1"))
        await services.send(half("TXM", CHECK_IMMUNITY_TIME_IN_SECONDS="soon"))
        await trio.sleep(7)
        seen = sorted((round(t - start), check.transaction_id) for t, check in checks.seen)
        assert seen == [(1, "TXS"), (6, "TXM")]


async def test_restart_keeps_half_messages_checkable_and_counts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    clock = trio_clock_ms()
    path = tmp_path / "store"
    settings = ServiceSettings(
        transaction_timeout_s=6, transaction_check_interval_s=30, transaction_check_max=2
    )
    first, second = Checks(), Checks()
    async with (
        open_embedded_store(path) as store,
        open_services(store, settings, check_back=first, now_ms=clock) as services,
    ):
        a = await services.send(half("A"))
        b = await services.send(half("B"))
        c = await services.send(half("C"))
        await services.transactions.end(
            resolution=ROLLBACK, producer_group="PG", commitlog_offset=a.commitlog_offset
        )
        await trio.sleep(7)
        assert sorted(ch.transaction_id for _, ch in first.seen) == ["B", "C"]
    async with (
        open_embedded_store(path) as store,
        open_services(store, settings, check_back=second, now_ms=clock) as services,
    ):
        assert services.transactions.unresolved == 2
        with pytest.raises(TransactionAlreadyResolved):
            await services.transactions.end(
                resolution=COMMIT, producer_group="PG", commitlog_offset=a.commitlog_offset
            )
        await trio.sleep(30)  # second check of B and C, after the restart
        assert sorted(ch.check_times for _, ch in second.seen) == [2, 2]
        await services.transactions.end(
            resolution=COMMIT, producer_group="PG", commitlog_offset=b.commitlog_offset
        )
        await trio.sleep(31)  # C has had check_max checks: discarded, not checked again
        assert len(second.seen) == 2
        assert services.transactions.unresolved == 0
        assert [m.properties["UNIQ_KEY"] for m in await _all(store, "Orders")] == ["B"]
        assert [m.properties["UNIQ_KEY"] for m in await _all(store, CHECK_MAX_TOPIC)] == ["C"]
        await trio.sleep(2)  # let the checker commit its replay start
    async with open_embedded_store(path) as store, open_services(store, settings, now_ms=clock) as services:
        assert services.transactions.unresolved == 0
        with pytest.raises(TransactionAlreadyResolved):
            await services.transactions.end(
                resolution=COMMIT, producer_group="PG", commitlog_offset=c.commitlog_offset
            )

"""Send-back: %RETRY% with growing delay, DLQ after max reconsume times (both backends)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mqproxy.backends.embedded.retry import dlq_topic, retry_topic
from mqproxy.backends.embedded.services import BrokerServices, ServiceSettings
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.model.errors import InvalidArgument
from mqproxy.model.properties import SCHEDULE_TOPIC
from mqproxy.model.types import Message, StoredMessage

from .conftest import MakeBackend, MakeServices  # type: ignore[import-not-found]


async def _consumed(backend: MessageStore, reconsume_times: int = 0) -> StoredMessage:
    props = {"TAGS": "A", "UNIQ_KEY": "U1", "KEYS": "k"}
    message = Message("Orders", b"body", queue_id=1, flag=5, properties=props, sys_flag=1)
    message.reconsume_times = reconsume_times
    sent = await backend.send(message)
    return (await backend.pull("Orders", 1, sent.queue_offset, 1)).messages[0]


async def _only(backend: MessageStore, topic: str) -> StoredMessage:
    result = await backend.pull(topic, 0, 0, 10)
    (message,) = result.messages
    return message


async def test_first_send_back_waits_level_3_then_lands_in_retry_topic(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        consumed = await _consumed(backend)
        back = await services.retry.send_back("G", consumed, delay_level=0, origin_msg_id="OFFSETID")
        assert (back.dead, back.delay_level, back.result.topic) == (False, 3, SCHEDULE_TOPIC)
        await trio.sleep(9.9)
        assert (await backend.pull(retry_topic("G"), 0, 0, 10)).messages == ()
        await trio.sleep(0.2)
        retried = await _only(backend, "%RETRY%G")
        assert retried.reconsume_times == 1
        assert (retried.body, retried.flag, retried.sys_flag, retried.tags) == (b"body", 5, 1, "A")
        assert retried.properties["RETRY_TOPIC"] == "Orders"
        assert retried.properties["ORIGIN_MESSAGE_ID"] == "OFFSETID"
        assert "DELAY" not in retried.properties
        assert (await backend.get_topic("%RETRY%G")).read_queues == 1  # type: ignore[union-attr]


async def test_second_send_back_keeps_origin_and_grows_delay(
    make_services: MakeServices, autojump_clock: trio.testing.MockClock
) -> None:
    async with make_services() as (backend, services):
        first = await _consumed(backend)
        await services.retry.send_back("G", first, origin_msg_id="FIRST")
        await trio.sleep(10.5)
        retried = await _only(backend, "%RETRY%G")
        back = await services.retry.send_back("G", retried, origin_msg_id="SECOND")
        assert back.delay_level == 4  # 3 + reconsume_times (1): 30 s
        await trio.sleep(29.9)
        assert len((await backend.pull("%RETRY%G", 0, 0, 10)).messages) == 1
        await trio.sleep(0.2)
        again = (await backend.pull("%RETRY%G", 0, 1, 10)).messages[0]
        assert again.reconsume_times == 2
        assert again.properties["ORIGIN_MESSAGE_ID"] == "FIRST"
        assert again.properties["RETRY_TOPIC"] == "Orders"


async def test_max_reconsume_times_goes_to_dlq(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        services = BrokerServices(backend)
        await services.start()
        consumed = await _consumed(backend, reconsume_times=3)
        back = await services.retry.send_back("G", consumed, max_reconsume_times=3)
        assert back.dead
        assert back.result.topic == dlq_topic("G") == "%DLQ%G"
        dead = await _only(backend, "%DLQ%G")
        assert dead.reconsume_times == 4
        assert dead.properties["DLQ_ORIGIN_TOPIC"] == "Orders"
        assert dead.properties["DLQ_ORIGIN_MESSAGE_ID"] == "U1"
        assert dead.properties["ORIGIN_MESSAGE_ID"] == "U1"
        # One below the limit is still retried.
        below = await _consumed(backend, reconsume_times=2)
        assert not (await services.retry.send_back("G", below, max_reconsume_times=3)).dead


async def test_default_limit_is_16_and_negative_delay_is_dlq(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        services = BrokerServices(backend)
        await services.start()
        assert not (await services.retry.send_back("G", await _consumed(backend, reconsume_times=15))).dead
        assert (await services.retry.send_back("G", await _consumed(backend, reconsume_times=16))).dead
        assert (await services.retry.send_back("G", await _consumed(backend), delay_level=-1)).dead


async def test_large_delay_level_is_clamped(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        services = BrokerServices(backend, ServiceSettings(delay_levels="1s 2s"))
        await services.start()
        back = await services.retry.send_back("G", await _consumed(backend), delay_level=99)
        assert (back.delay_level, back.result.queue_id) == (2, 1)
        deep = await services.retry.send_back("G", await _consumed(backend, reconsume_times=7))
        assert deep.delay_level == 2


async def test_dead_letter_directly_and_bad_group(make_backend: MakeBackend) -> None:
    async with make_backend() as backend:
        services = BrokerServices(backend)
        await services.start()
        consumed = await _consumed(backend)
        result = await services.retry.dead_letter("G", consumed, origin_msg_id="X")
        assert result.topic == "%DLQ%G"
        assert (await _only(backend, "%DLQ%G")).properties["DLQ_ORIGIN_MESSAGE_ID"] == "X"
        with pytest.raises(InvalidArgument):
            await services.retry.send_back("", consumed)
        with pytest.raises(InvalidArgument):
            await services.retry.dead_letter("", consumed)

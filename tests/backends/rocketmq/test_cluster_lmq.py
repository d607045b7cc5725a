"""MQTT's light message queues on the rocketmq backend against a stock Apache RocketMQ 5.3 cluster of two
brokers (``enableLmq``, ``enableMultiDispatch``), with two mqproxy nodes (two facades behind the MQTT
gateway's :class:`~mqproxy.mqtt.store.FacadeStore`): what one node dispatches, the other reads."""

from __future__ import annotations

import itertools

import pytest
import trio

from mqproxy.backends.rocketmq.cluster import LMQ_BROKER_KEY
from mqproxy.backends.rocketmq.lmq import lmq_offsets
from mqproxy.backends.rocketmq.vqueues import unpack_offset
from mqproxy.codecs.remoting_codes import RequestCode
from mqproxy.model.types import Message, PullStatus
from mqproxy.mqtt.store import FacadeStore

from ...conftest import wait_until  # type: ignore[import-not-found]
from .conftest import open_node

pytestmark = pytest.mark.e2e

_names = itertools.count()


def _name(stem: str) -> str:
    return f"{stem}{next(_names)}"


async def test_both_nodes_name_the_same_lmq_broker_from_the_kv(stock2) -> None:
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        first = await a.cluster.lmq_broker()
        assert first == "broker-a"  # nothing was stored: the first master in sorted order
        assert await b.cluster.lmq_broker() == first
        assert await a.cluster._kv_get(LMQ_BROKER_KEY) == [first]
        # an LMQ has a queue per broker (each fills its own copy); queue q is the broker at index q + 1
        assert (await b.get_topic("%LMQ%anything")).read_queues == 2  # type: ignore[union-attr]
        assert (await b.create_topic("%LMQ%anything")).write_queues == 2
        assert a.cluster.lmq_queue_of(first) == b.cluster.lmq_queue_of(first) == 0
        assert await a.cluster.lmq_send_order() == ["broker-a", "broker-b"]


async def test_dispatched_on_one_node_is_read_from_both_lmqs_on_the_other(stock2) -> None:
    parent = _name("LmqParent")  # no such topic yet: the dispatching send creates it
    lmq_x, lmq_y = f"%LMQ%{parent}%x", f"%LMQ%{parent}%y"
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        store_a, store_b = FacadeStore(a), FacadeStore(b)
        results = [
            await store_a.send(Message(parent, b"m0", dispatch=(lmq_x, lmq_y))),
            await store_a.send(Message(parent, b"m1", dispatch=(lmq_y, lmq_x, lmq_y))),
            await store_a.send(Message(parent, b"m2", dispatch=(lmq_y,))),
        ]
        lmq_broker_index = a.cluster.index.index(await a.cluster.lmq_broker())
        assert {unpack_offset(r.commitlog_offset)[0] for r in results} == {lmq_broker_index}

        for lmq, bodies in ((lmq_x, [b"m0", b"m1"]), (lmq_y, [b"m0", b"m1", b"m2"])):
            await _dispatched(store_b, lmq, len(bodies))
            pulled = await store_b.pull(lmq, 0, 0, 32)
            assert pulled.status is PullStatus.FOUND
            assert [m.body for m in pulled.messages] == bodies
            assert pulled.next_offset == len(bodies)
            assert [lmq_offsets(m.properties)[lmq] for m in pulled.messages] == list(range(len(bodies)))
            assert [m.commitlog_offset for m in pulled.messages] == [r.commitlog_offset for r in results][
                : len(bodies)
            ]
            for message, result in zip(pulled.messages, results, strict=False):
                # the message's own coordinates, as the embedded store's LMQ pulls give them
                assert (message.topic, message.queue_id, message.queue_offset) == (
                    parent,
                    result.queue_id,
                    result.queue_offset,
                )
            assert await store_b.max_offset(lmq, 0) == len(bodies)
            assert await store_b.min_offset(lmq, 0) == 0
            tail = await store_b.pull(lmq, 0, len(bodies), 32)
            assert tail.status is PullStatus.NO_NEW_MSG

        found = await store_b.get_message(results[2].commitlog_offset)
        assert found is not None
        assert found.body == b"m2"
        assert found.topic == parent


async def test_batch_with_dispatch_is_sent_in_order_and_dispatched(stock2) -> None:
    parent = _name("LmqBatch")
    lmq = f"%LMQ%{parent}"
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        results = await FacadeStore(a).send_batch(
            [Message(parent, f"b{n}".encode(), dispatch=(lmq,)) for n in range(3)]
        )
        assert len({r.commitlog_offset for r in results}) == 3
        await _dispatched(FacadeStore(b), lmq, 3)
        pulled = await FacadeStore(b).pull(lmq, 0, 0, 32)
        assert [m.body for m in pulled.messages] == [b"b0", b"b1", b"b2"]


async def test_session_group_offsets_on_an_lmq_round_trip_across_nodes(stock2) -> None:
    lmq = _name("%LMQ%offsets")
    group = "%MQTT%client-1"
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        store_a, store_b = FacadeStore(a), FacadeStore(b)
        await store_a.send(Message("LmqOffsetsParent", b"o", dispatch=(lmq,)))
        assert await store_b.query_consumer_offset(group, lmq, 0) is None
        await store_a.commit_consumer_offset(group, lmq, 0, 1)  # the group is new to the broker
        assert await store_b.query_consumer_offset(group, lmq, 0) == 1
        await store_b.commit_consumer_offset(group, lmq, 0, 0)
        assert await store_a.query_consumer_offset(group, lmq, 0) == 0


async def test_an_lmq_offset_searched_by_time(stock2) -> None:
    """What a subscription lane positioned late relies on (``Cursor.place``): the first offset stored at or
    after a time, the queue's end for a time after its last message, 0 for a queue that is empty."""
    parent = _name("LmqSearch")
    lmq = f"%LMQ%{parent}"
    async with open_node(stock2.namesrv_addr, 1001) as a:
        store = FacadeStore(a)
        assert await store.search_offset(lmq, 0, 1) == 0
        assert await store.search_offset(lmq, 1, 1) == 0  # the other broker's copy, never filled
        for n in range(3):
            await store.send(Message(parent, f"s{n}".encode(), dispatch=(lmq,)))
        await _dispatched(store, lmq, 3)
        times = [m.store_timestamp_ms for m in (await store.pull(lmq, 0, 0, 8)).messages]
        assert len(times) == 3
        for at in (0, times[0], times[1], times[2], times[2] + 1, times[2] + 60_000):
            first_since = next((i for i, stored in enumerate(times) if stored >= at), len(times))
            assert await store.search_offset(lmq, 0, at) == first_since, at


async def test_wait_on_an_lmq_is_woken_by_a_send_through_the_other_node(stock2) -> None:
    parent = _name("LmqWake")
    lmq = f"%LMQ%{parent}"
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        store_a, store_b = FacadeStore(a), FacadeStore(b)
        await store_a.send(Message(parent, b"before", dispatch=(lmq,)))
        await _dispatched(store_b, lmq, 1)
        offset = 1
        assert await store_b.wait_for_message(lmq, 0, offset - 1, 20.0) is True  # already there
        assert await store_b.wait_for_message(lmq, 0, offset, 0.5) is False  # nothing comes

        held, sending = _watch_long_polls(b), trio.Event()
        outcome: list[tuple[bool, bool]] = []

        async def wait() -> None:
            woken = await store_b.wait_for_message(lmq, 0, offset, 20.0)
            outcome.append((woken, sending.is_set()))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await held.wait()  # the long poll is on its way to the broker (it finds nothing yet)
                sending.set()
                await store_a.send(Message(parent, b"after", dispatch=(lmq,)))
        assert outcome == [(True, True)]  # woken (a timeout answers False), by the send
        assert [m.body for m in (await store_b.pull(lmq, 0, offset, 8)).messages] == [b"after"]


async def test_wait_on_an_ordinary_queue_is_woken_by_a_send_through_the_other_node(stock2) -> None:
    topic = _name("WakeTopic")
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        await a.create_topic(topic, 1)
        await wait_until(lambda: b.cluster.view(topic, fresh=True), 10, poll_s=0.2)
        offset = await b.max_offset(topic, 0)
        held = _watch_long_polls(b)
        outcome: list[bool] = []

        async def wait() -> None:
            outcome.append(await b.wait_for_message(topic, 0, offset, 20.0))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await held.wait()
                await FacadeStore(a).send(Message(topic, b"w", queue_id=0))
        assert outcome == [True]


async def _dispatched(store: FacadeStore, lmq: str, count: int) -> None:
    """Wait until ``lmq`` holds ``count`` messages: the broker dispatches to consume queues (and LMQs)
    asynchronously (its ReputMessageService), shortly after a send is answered."""

    async def reached() -> bool:
        return await store.max_offset(lmq, 0) >= count

    await wait_until(reached, 10, poll_s=0.02)


def _watch_long_polls(node) -> trio.Event:
    """An event set when ``node`` sends its next suspending PULL_MESSAGE."""
    pool = node.cluster.pool
    real = pool.request
    issued = trio.Event()

    async def spy(addr, command, *, timeout_s=None):
        if command.code == RequestCode.PULL_MESSAGE and int(command.ext_fields.get("sysFlag", "0")) & 0x2:
            issued.set()
        return await real(addr, command, timeout_s=timeout_s)

    pool.request = spy
    return issued

"""The rocketmq backend's BrokerFacade against a stock Apache RocketMQ cluster of two brokers, with two
mqproxy nodes (two facades) in one process: what one node writes, the other reads."""

from __future__ import annotations

import itertools

import pytest
import trio

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.messages import to_client
from mqproxy.backends.rocketmq.vqueues import unpack_offset
from mqproxy.codecs.message_record import encode_records
from mqproxy.facade.api import EndTransaction, PopRequest, PullRequest, SendRequest
from mqproxy.facade.types import QueueRef, Resolution, TransactionCheck
from mqproxy.model.errors import ClusterUnavailable
from mqproxy.model.types import ConsumerInfo, Message, PullStatus, Subscription

from ...conftest import wait_until  # type: ignore[import-not-found]
from .conftest import open_node, stock_rocketmq

pytestmark = pytest.mark.e2e

_names = itertools.count()


def _topic(stem: str) -> str:
    return f"{stem}{next(_names)}"


async def test_two_nodes_number_queues_alike_and_read_each_others_messages(stock2) -> None:
    topic = _topic("Numbered")
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        config = await a.create_topic(topic, 2)
        assert config.read_queues == 4  # two queues on each of two brokers
        view_a = await a.cluster.view(topic)
        view_b = await b.cluster.view(topic)
        assert view_a is not None
        assert view_b is not None
        assert view_a.queues.entries == view_b.queues.entries
        assert {e.broker for e in view_a.queues.entries} == {"broker-a", "broker-b"}

        sent = {}
        for vq in range(4):
            outcome = await a.send(SendRequest(Message(topic, f"m{vq}".encode(), queue_id=vq), "pg"))
            assert outcome.queue_id == vq
            sent[vq] = outcome.result
        brokers_used = {unpack_offset(r.commitlog_offset)[0] for r in sent.values()}
        assert len(brokers_used) == 2  # the packed offsets name both brokers
        for vq, result in sent.items():
            pulled = await b.pull(PullRequest("g-read", topic, vq, result.queue_offset, 8))
            assert pulled.status is PullStatus.FOUND
            assert [m.body for m in pulled.messages] == [f"m{vq}".encode()]
            assert pulled.messages[0].queue_id == vq
            assert pulled.messages[0].commitlog_offset == result.commitlog_offset
            found = await b.get_message(result.commitlog_offset)
            assert found is not None
            assert found.body == f"m{vq}".encode()


async def test_pulled_records_pass_through_as_the_reencoding_of_the_client_view(stock2) -> None:
    """A real broker's records, patched in place by the node, are byte for byte the re-encoding of what
    the decoding path (decode, to_client) gives: the same messages, with the node's coordinates."""
    topic = _topic("Passed")
    properties = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "7F00000100002A9F0000000000000001", "p": "v"}
    async with open_node(stock2.namesrv_addr, 1001) as a:
        await a.create_topic(topic, 2)
        for vq in range(4):
            for n in range(3):
                message = Message(topic, f"m{vq}-{n}".encode() * 20, queue_id=vq, properties=dict(properties))
                await a.send(SendRequest(message, "pg"))
        view = await a.cluster.view(topic)
        assert view is not None
        for vq in range(4):
            pulled = await a.pull(PullRequest("g-pass", topic, vq, 0, 8))
            assert pulled.records is not None, "the broker's records passed through"
            real = view.real(vq)
            assert real is not None
            command = a._pull_command(
                "g-pass",
                topic,
                real.broker,
                real.queue_id,
                0,
                8,
                sysFlag=4,
                subscription="*",
                expressionType="TAG",
            )  # the same records, read straight from the broker
            raw = await a.cluster.broker_call(real.broker, command)
            index = await a.cluster.broker_index(real.broker)
            decoded = tuple(
                to_client(m, real.broker, index, view, a.advertised) for m in wire.records(raw.body)
            )
            assert pulled.messages == decoded
            assert [m.queue_id for m in decoded] == [vq] * 3
            for legacy in (True, False):
                assert pulled.records.data == encode_records(decoded, legacy=legacy)


async def test_offsets_committed_through_one_node_are_read_through_the_other(stock2) -> None:
    topic = _topic("Offsets")
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        await a.create_topic(topic, 1)
        for vq in range(2):
            await a.send(SendRequest(Message(topic, b"x", queue_id=vq)))
            await a.send(SendRequest(Message(topic, b"y", queue_id=vq)))
            # the broker indexes a message into its queue shortly after answering the send
            await wait_until(lambda vq=vq: _max_offset_is(b, topic, vq, 2), 10, poll_s=0.05)
            await a.commit_consumer_offset("g-off", topic, vq, 1 + vq)
        assert [await b.query_consumer_offset("g-off", topic, vq) for vq in range(2)] == [1, 2]
        assert await b.query_consumer_offset("g-none", topic, 0) is None


async def test_members_of_both_nodes_are_one_group_and_locks_hold_across_nodes(stock2) -> None:
    topic = _topic("Members")
    group = "g-members"
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        await a.create_topic(topic, 1)
        subs = (Subscription(topic, "*"),)
        assert await a.register_consumer(ConsumerInfo("client-1", group, subs))
        assert await b.register_consumer(ConsumerInfo("client-2", group, subs))

        async def both_listed() -> bool:
            return await a.consumer_ids(group) == ["client-1", "client-2"]

        await wait_until(both_listed, 10, poll_s=0.2)
        assert await b.consumer_ids(group) == ["client-1", "client-2"]

        queues = [QueueRef(topic, 0), QueueRef(topic, 1)]
        assert await a.lock_batch(group, "client-1", queues) == set(queues)
        assert await b.lock_batch(group, "client-2", queues) == set()
        assert await a.release_client(group, "client-1") == 2
        assert await b.lock_batch(group, "client-2", queues) == set(queues)

        assert await a.unregister_consumer(group, "client-1")
        await wait_until(lambda: _ids_are(b, group, ["client-2"]), 10, poll_s=0.2)


async def _max_offset_is(node, topic: str, queue_id: int, offset: int) -> bool:
    return await node.max_offset(topic, queue_id) == offset


async def _ids_are(node, group: str, ids: list[str]) -> bool:
    return await node.consumer_ids(group) == ids


async def test_popped_through_one_node_acked_through_the_other(stock2) -> None:
    topic = _topic("Pop")
    group = "g-pop"
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        await a.create_topic(topic, 1)
        for vq in range(2):
            await a.send(SendRequest(Message(topic, f"p{vq}".encode(), queue_id=vq)))
        got = []
        with trio.fail_after(30):
            while len(got) < 2:
                result = await a.pop(PopRequest(group, topic, 4, 60_000, hold_s=1.0))
                got += list(result.messages)
        assert sorted(p.message.body for p in got) == [b"p0", b"p1"]
        for popped in got:
            await b.ack(group, topic, popped.receipt.encode())
        again = await b.pop(PopRequest(group, topic, 4, 60_000, hold_s=0.5))
        assert again.messages == ()


async def test_check_back_reaches_the_node_of_the_producer_and_the_other_node_commits(stock2) -> None:
    topic = _topic("Tx")
    async with open_node(stock2.namesrv_addr, 1001) as a, open_node(stock2.namesrv_addr, 1002) as b:
        await a.create_topic(topic, 1)
        checks: list[TransactionCheck] = []
        got_check = trio.Event()

        async def producer(check: TransactionCheck) -> bool:
            checks.append(check)
            got_check.set()
            return True

        a.add_check_back(producer)
        message = Message(topic, b"tx-body", properties={"TRAN_MSG": "true"}, sys_flag=0x4)
        outcome = await a.send(SendRequest(message, "pg-tx"))
        assert outcome.parked == "half"
        with trio.fail_after(60):
            await got_check.wait()
        check = checks[0]
        assert check.producer_group == "pg-tx"
        assert check.message.body == b"tx-body"
        await b.end_transaction(
            EndTransaction(
                Resolution.COMMIT,
                producer_group="pg-tx",
                commitlog_offset=check.half.commitlog_offset,
                tran_state_table_offset=check.half.queue_offset,
                from_check=True,
            )
        )

        async def committed() -> bool:
            total = 0
            for vq in range(2):
                total += await b.max_offset(topic, vq)
            return total == 1

        await wait_until(committed, 20, poll_s=0.2)


async def test_a_broker_added_later_appends_its_queues(stock2, tmp_path) -> None:
    topic = _topic("Grow")
    async with open_node(stock2.namesrv_addr, 1001) as a:
        await a.create_topic(topic, 2)
        before = (await a.cluster.view(topic)).queues.entries  # type: ignore[union-attr]
        if len(stock2.broker_list) < 3:
            await trio.to_thread.run_sync(stock2.add_broker)
        new = stock2.broker_list[2]
        await trio.to_thread.run_sync(
            lambda: stock2.mqadmin("updateTopic", "-b", new.addr, "-t", topic, "-r", "2", "-w", "2")
        )

        async def grown() -> bool:
            view = await a.cluster.view(topic, fresh=True)
            return view is not None and len(view.queues) == 6

        await wait_until(grown, 30, poll_s=0.2)
        async with open_node(stock2.namesrv_addr, 1002) as b:
            after = (await b.cluster.view(topic)).queues.entries  # type: ignore[union-attr]
        assert after[:4] == before
        assert {e.broker for e in after[4:]} == {new.name}


async def test_an_unreachable_cluster_is_reported_not_fatal() -> None:
    port = stock_rocketmq.free_port()
    async with open_node(f"127.0.0.1:{port}", 1003, request_timeout_s=0.5) as node:
        assert node.health() is not None
        assert f"127.0.0.1:{port}" in node.health()
        with pytest.raises(ClusterUnavailable):
            await node.send(SendRequest(Message("AnyTopic", b"x"), create_queues=4))

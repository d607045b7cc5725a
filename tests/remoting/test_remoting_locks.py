"""LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (orderly consumers) and CHECK_CLIENT_CONFIG."""

from __future__ import annotations

import json

import orjson
import pytest
import trio

from mqproxy.codecs.remoting import SERIALIZE_ROCKETMQ, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.types import QueueRef
from mqproxy.remoting.session import RemotingSession


def lock_body(client_id: str, *queues: int, group: str = "G") -> bytes:
    mq_set = [{"brokerName": "broker-a", "queueId": q, "topic": "T"} for q in queues]
    return json.dumps({"consumerGroup": group, "clientId": client_id, "onlyThisBroker": False,
                       "mqSet": mq_set}).encode()  # fmt: skip


def locked(response) -> list[int]:
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    return sorted(q["queueId"] for q in orjson.loads(response.body)["lockOKMQSet"])


async def test_locks_are_exclusive_renewable_and_expire(wire, session, ctx, autojump_clock, broker) -> None:
    other = RemotingSession(broker, ctx)
    assert locked(await session.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("a@1", 0, 1)))) == [
        0,
        1,
    ]
    assert locked(await other.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("b@2", 1, 2)))) == [2]
    await trio.sleep(40)
    # a renews within the TTL; b still cannot take queue 1
    assert locked(await session.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("a@1", 0, 1)))) == [
        0,
        1,
    ]
    await trio.sleep(40)
    assert locked(await other.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("b@2", 1)))) == []
    await trio.sleep(21)  # 61 s after a's last renewal: expired
    assert locked(await other.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("b@2", 1)))) == [1]
    # the same queue in another group is independent
    assert locked(
        await other.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("c@3", 1, group="H")))
    ) == [1]


async def test_unlock_and_connection_close_release(wire, session, ctx, broker) -> None:
    other = RemotingSession(broker, ctx)
    await session.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("a@1", 0, 1)))
    assert await session.handle(wire(RequestCode.UNLOCK_BATCH_MQ, None, lock_body("a@1", 0), flag=2)) is None
    assert locked(await other.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("b@2", 0, 1)))) == [0]
    await session.close()
    assert locked(await other.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("b@2", 0, 1)))) == [0, 1]
    # unlocking someone else's queue does nothing
    await session.handle(wire(RequestCode.UNLOCK_BATCH_MQ, None, lock_body("a@1", 0, 1)))
    assert await broker.lock_holder("G", QueueRef("T", 0)) == "b@2"


async def test_empty_mq_set(wire, session) -> None:
    assert locked(await session.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("a@1")))) == []


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b'{"clientId": "a"}', b'{"consumerGroup": "G"}',
     b'{"consumerGroup": "G", "clientId": "a", "mqSet": {"topic": "T"}}',
     b'{"consumerGroup": "G", "clientId": "a", "mqSet": [{"topic": "T", "brokerName": "b", "queueId": "1"}]}',
     b'{"consumerGroup": "G", "clientId": "a", "mqSet": [{"topic": "T", "brokerName": "b", "queueId": -1}]}',
     b'{"consumerGroup": "G", "clientId": "a", "mqSet": [{"brokerName": "b", "queueId": 1}]}'],
)  # fmt: skip
async def test_malformed_lock_body(body, wire, session) -> None:
    response = await session.handle(wire(RequestCode.LOCK_BATCH_MQ, None, body))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert (response.remark or "").startswith("lock request body")


@pytest.mark.parametrize(
    ("subscription", "code"),
    [({"expressionType": "TAG", "subString": "A"}, ResponseCode.SUCCESS),
     ({"expressionType": "SQL92", "subString": "a > 1"}, ResponseCode.SUCCESS),
     ({"expressionType": "SQL92", "subString": "a >"}, ResponseCode.SUBSCRIPTION_PARSE_FAILED),
     ({"expressionType": "GROOVY", "subString": "a"}, ResponseCode.SUBSCRIPTION_PARSE_FAILED),
     (None, ResponseCode.SUCCESS)],
)  # fmt: skip
async def test_check_client_config(subscription, code, wire, session) -> None:
    body = json.dumps({"clientId": "a@1", "group": "G", "subscriptionData": subscription}).encode()
    response = await session.handle(wire(RequestCode.CHECK_CLIENT_CONFIG, None, body))
    assert response is not None
    assert response.code == code
    garbage = await session.handle(wire(RequestCode.CHECK_CLIENT_CONFIG, None, b"\xff"))
    assert garbage is not None
    assert garbage.code == ResponseCode.INVALID_PARAMETER


# --- on the broker facade's lock table (shared with gRPC) ------------------------------------------


def heartbeat(client_id: str, group: str) -> bytes:
    return json.dumps(
        {
            "clientID": client_id,
            "consumerDataSet": [
                {
                    "groupName": group,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "subscriptionDataSet": [{"topic": "T", "subString": "*"}],
                }
            ],
            "producerDataSet": [],
        }
    ).encode()


async def test_locks_live_in_the_facade(wire, session, ctx, autojump_clock, broker) -> None:
    other = RemotingSession(broker, ctx)
    assert locked(await session.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("a@1", 0, 1)))) == [
        0,
        1,
    ]
    assert await broker.lock_holder("G", QueueRef("T", 0)) == "a@1"
    assert locked(await other.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("b@2", 1, 2)))) == [2]
    assert await session.handle(wire(RequestCode.UNLOCK_BATCH_MQ, None, lock_body("a@1", 0), flag=2)) is None
    assert await broker.lock_holder("G", QueueRef("T", 0)) is None
    await session.close()
    assert await broker.lock_holder("G", QueueRef("T", 1)) is None
    assert await broker.lock_holder("G", QueueRef("T", 2)) == "b@2"


async def test_lock_for_another_groups_queue_is_refused(wire, session, broker, autojump_clock) -> None:
    assert (await session.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("a@1", "G")))).code == 0
    for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        response = await session.handle(wire(code, None, lock_body("a@1", 0, group="H")))
        assert response.code == ResponseCode.NO_PERMISSION
        assert response.remark == "client a@1 is not a member of consumer group H; it cannot lock its queues"
    assert await broker.lock_holder("H", QueueRef("T", 0)) is None
    assert locked(await session.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("a@1", 0)))) == [0]


async def test_empty_mq_set_has_a_remark(wire, session, autojump_clock) -> None:
    response = await session.handle(wire(RequestCode.LOCK_BATCH_MQ, None, lock_body("a@1")))
    assert (locked(response), response.remark) == ([], "MessageQueue set is empty")


async def test_lock_with_a_binary_header(binary, session, broker, autojump_clock) -> None:
    response = await session.handle(binary(RequestCode.LOCK_BATCH_MQ, {}, lock_body("a@1", 3)))
    assert locked(response) == [3]
    assert encode_command(response)[4] == SERIALIZE_ROCKETMQ
    assert await broker.lock_holder("G", QueueRef("T", 3)) == "a@1"

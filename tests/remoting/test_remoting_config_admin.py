"""UPDATE_AND_CREATE_TOPIC, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP and DELETE_SUBSCRIPTIONGROUP (what
``mqadmin updateTopic/updateSubGroup/deleteSubGroup -b`` send) through RemotingSession."""

from __future__ import annotations

import json

import pytest

from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.types import GroupConfig, TopicMessageType


def topic_ext(topic: str, **overrides: str) -> dict[str, str]:
    """mqadmin's CreateTopicRequestHeader."""
    ext = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": "8",
        "writeQueueNums": "8",
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }
    ext.update(overrides)
    return ext


def group_body(name: str, **overrides: object) -> bytes:
    """A SubscriptionGroupConfig as the Java admin serializes it (fastjson, unknown keys included)."""
    config: dict[str, object] = {
        "groupName": name,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": False,
        "consumeMessageOrderly": False,
        "retryQueueNums": 1,
        "retryMaxTimes": 16,
        "groupRetryPolicy": {"type": "CUSTOMIZED"},
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
        "groupSysFlag": 0,
        "consumeTimeoutMinute": 15,
        "subscriptionDataSet": None,
        "attributes": {},
    }
    config.update(overrides)
    return json.dumps(config).encode()


async def test_update_and_create_topic_types_it(wire, session, broker, backend) -> None:
    created = await session.handle(
        wire(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_ext("Typed", attributes="+message.type=FIFO"))
    )
    assert created.code == ResponseCode.SUCCESS
    config = await backend.get_topic("Typed")
    assert (config.read_queues, config.write_queues) == (8, 8)
    assert broker.topic_type("Typed") is TopicMessageType.FIFO
    # updated without the attribute: the type stays; a topic created without one is NORMAL
    again = await session.handle(wire(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_ext("Typed")))
    assert again.code == ResponseCode.SUCCESS
    assert broker.topic_type("Typed") is TopicMessageType.FIFO
    await session.handle(wire(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_ext("Plain")))
    assert broker.topic_type("Plain") is TopicMessageType.NORMAL


@pytest.mark.parametrize(
    "ext",
    [
        topic_ext("RMQ_SYS_TRANS_HALF_TOPIC"),
        topic_ext("rmq_sys_BROKER_METADATA"),
        topic_ext("TBW102"),
        topic_ext("bad topic"),
        topic_ext("T", readQueueNums="0", writeQueueNums="0"),
        topic_ext("T", attributes="+message.type=QUEUE"),
    ],
)
async def test_update_and_create_topic_refuses(ext, wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.UPDATE_AND_CREATE_TOPIC, ext))
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert await backend.get_topic("T") is None


async def test_subscription_group_update_and_delete(wire, session, broker) -> None:
    body = group_body("FifoG", consumeMessageOrderly=True, retryMaxTimes=3)
    created = await session.handle(wire(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body))
    assert created.code == ResponseCode.SUCCESS
    assert broker.group_config("FifoG") == GroupConfig("FifoG", consume_orderly=True, retry_max_times=3)
    deleted = await session.handle(wire(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "FifoG"}))
    assert deleted.code == ResponseCode.SUCCESS
    assert broker.group_config("FifoG") is None
    missing = await session.handle(wire(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "FifoG"}))
    assert missing.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b"{not json", group_body(""), group_body("bad group"), group_body("G", retryMaxTimes=-1)],
)
async def test_subscription_group_refuses_malformed_bodies(body, wire, session, broker) -> None:
    response = await session.handle(wire(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body))
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert broker.group_config("G") is None

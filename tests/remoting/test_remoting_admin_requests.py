"""Admin and lookup requests of mqadmin and the clients' admin APIs: topics, cluster, topic list,
QUERY_MESSAGE, VIEW_MESSAGE_BY_ID (answers as a stock RocketMQ 5.3 broker and name server give them)."""

from __future__ import annotations

import json

import pytest

from mqproxy.broker.types import Message, TopicConfig
from mqproxy.codecs.message_record import decode_records
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode


def create_topic(topic: str, **overrides: str) -> dict[str, str]:
    """UPDATE_AND_CREATE_TOPIC as the Java admin sends it."""
    ext = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": "3", "writeQueueNums": "3", "perm": "6",
           "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}  # fmt: skip
    ext.update(overrides)
    return ext


async def test_update_and_create_topic(wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic("Made")))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert await backend.get_topic("Made") == TopicConfig("Made", read_queues=3, write_queues=3, perm=6)
    again = await session.handle(wire(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic("Made", perm="4")))
    assert again is not None
    assert again.code == ResponseCode.SUCCESS
    assert (await backend.get_topic("Made")) == TopicConfig("Made", read_queues=3, write_queues=3, perm=4)


@pytest.mark.parametrize(
    ("topic", "remark"),
    [
        ("bad topic", "The specified topic: bad topic, contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
        ("x" * 128, f"The specified topic: {'x' * 128}, is longer than topic max length: 127"),
        ("TBW102", "The topic[TBW102] is conflict with system topic."),
        ("rmq_sys_mine", "The topic[rmq_sys_mine] is conflict with system topic."),
    ],
)
async def test_update_and_create_topic_refusals(topic, remark, wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic(topic)))
    assert response is not None
    assert (response.code, response.remark) == (ResponseCode.INVALID_PARAMETER, remark)


async def test_cluster_info_and_topic_list(wire, session, backend) -> None:
    await backend.create_topic("Listed", 2)
    response = await session.handle(wire(RequestCode.GET_BROKER_CLUSTER_INFO, None))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert json.loads(response.body) == {
        "brokerAddrTable": {"broker-a": {"brokerAddrs": {"0": "10.0.0.8:8080"}, "brokerName": "broker-a",
                                         "cluster": "DefaultCluster", "enableActingMaster": False}},
        "clusterAddrTable": {"DefaultCluster": ["broker-a"]},
    }  # fmt: skip
    listed = await session.handle(wire(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, None))
    assert listed is not None
    topics = json.loads(listed.body)["topicList"]
    assert {"Listed", "DefaultCluster", "broker-a"} <= set(topics)


async def test_query_message_by_key_and_by_unique_key(wire, session, backend) -> None:
    sent = [
        await backend.send(Message("Q", f"m{i}".encode(), properties={"KEYS": f"k{i % 2} all", "UNIQ_KEY": f"U{i}"}))
        for i in range(4)
    ]
    ext = {"topic": "Q", "key": "k0", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": str(2**62)}
    response = await session.handle(wire(RequestCode.QUERY_MESSAGE, ext))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(response.body)] == [b"m0", b"m2"]  # commit-log order
    assert response.ext_fields["indexLastUpdatePhyoffset"] == str(sent[2].commitlog_offset)
    capped = await session.handle(wire(RequestCode.QUERY_MESSAGE, dict(ext, key="all", maxNum="2")))
    assert capped is not None
    assert [r.body for r in decode_records(capped.body)] == [b"m2", b"m3"]  # the newest two
    unique = dict(ext, key="U3", maxNum="1", _UNIQUE_KEY_QUERY="true")
    by_id = await session.handle(wire(RequestCode.QUERY_MESSAGE, unique))
    assert by_id is not None
    assert [r.body for r in decode_records(by_id.body)] == [b"m3"]
    missing = await session.handle(wire(RequestCode.QUERY_MESSAGE, dict(ext, key="nope")))
    assert missing is not None
    assert (missing.code, missing.remark) == (
        ResponseCode.QUERY_NOT_FOUND,
        "can not find message, maybe time range not correct",
    )


async def test_view_message_by_id(wire, session, backend) -> None:
    sent = await backend.send(Message("V", b"viewed", properties={"TAGS": "T1"}))
    response = await session.handle(wire(RequestCode.VIEW_MESSAGE_BY_ID, {"topic": "V", "offset": str(sent.commitlog_offset)}))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    (record,) = decode_records(response.body)
    assert (record.body, record.topic, record.properties["TAGS"]) == (b"viewed", "V", "T1")
    missing = await session.handle(wire(RequestCode.VIEW_MESSAGE_BY_ID, {"topic": "V", "offset": "999999"}))
    assert missing is not None
    assert (missing.code, missing.remark) == (ResponseCode.SYSTEM_ERROR, "can not find message by the offset, 999999")

"""Admin and lookup requests of mqadmin and the clients' admin APIs: topics, cluster, topic list,
QUERY_MESSAGE, VIEW_MESSAGE_BY_ID (answers as a stock RocketMQ 5.3 broker and name server give them)."""

from __future__ import annotations

import json
import re

import pytest

from mqproxy.codecs.message_record import decode_records
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.types import Message, TopicConfig


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
        (
            "bad topic",
            "The specified topic: bad topic, contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$",
        ),
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
        await backend.send(
            Message("Q", f"m{i}".encode(), properties={"KEYS": f"k{i % 2} all", "UNIQ_KEY": f"U{i}"})
        )
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
    response = await session.handle(
        wire(RequestCode.VIEW_MESSAGE_BY_ID, {"topic": "V", "offset": str(sent.commitlog_offset)})
    )
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    (record,) = decode_records(response.body)
    assert (record.body, record.topic, record.properties["TAGS"]) == (b"viewed", "V", "T1")
    missing = await session.handle(wire(RequestCode.VIEW_MESSAGE_BY_ID, {"topic": "V", "offset": "999999"}))
    assert missing is not None
    assert (missing.code, missing.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "can not find message by the offset, 999999",
    )


# --- consumer groups: GET_CONSUME_STATS, GET_CONSUMER_CONNECTION_LIST, QUERY_TOPIC_CONSUME_BY_WHO -------


def java_heartbeat(client_id: str, group: str, topic: str, expression: str = "TagA || TagB") -> bytes:
    return json.dumps({"clientID": client_id, "consumerDataSet": [{
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
        "groupName": group, "messageModel": "CLUSTERING", "unitMode": False,
        "subscriptionDataSet": [{"expressionType": "TAG", "subString": expression, "topic": topic}]}],
        "producerDataSet": []}).encode()  # fmt: skip


def fastjson_keyed(body: bytes) -> dict[str, object]:
    """ConsumeStats as fastjson writes it (object keys) turned into JSON with "topic/queue" keys."""
    text = body.decode()
    fixed = re.sub(r'\{"brokerName":"([^"]*)","queueId":(\d+),"topic":"([^"]*)"\}:', r'"\3/\2":', text)
    return json.loads(fixed)


async def test_consume_stats_of_a_group(wire, session, backend) -> None:
    await backend.create_topic("CS", 2)
    for i in range(5):
        await backend.send(Message("CS", f"m{i}".encode(), queue_id=0))
    await backend.commit_consumer_offset("G", "CS", 0, 3)
    pulled = {"consumerGroup": "G", "topic": "CS", "queueId": "0", "queueOffset": "3", "maxMsgNums": "32",
              "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
              "subscription": "*"}  # fmt: skip
    assert (await session.handle(wire(RequestCode.PULL_MESSAGE, pulled))).code == ResponseCode.SUCCESS
    response = await session.handle(wire(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "G"}))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert b'{"brokerName":"broker-a","queueId":0,"topic":"CS"}:' in response.body  # fastjson's object keys
    stats = fastjson_keyed(response.body)
    assert stats["consumeTps"] == 0.0
    first = stats["offsetTable"]["CS/0"]
    assert (first["brokerOffset"], first["consumerOffset"], first["pullOffset"]) == (5, 3, 5)
    assert first["lastTimestamp"] > 0  # store time of the last consumed message
    assert stats["offsetTable"]["CS/1"] == {"brokerOffset": 0, "consumerOffset": 0, "lastTimestamp": 0,
                                            "pullOffset": 0}  # fmt: skip
    listed = await session.handle(
        wire(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "G", "topicList": "CS;Nope"})
    )
    assert set(fastjson_keyed(listed.body)["offsetTable"]) == {"CS/0", "CS/1"}
    none = await session.handle(wire(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "Nobody"}))
    assert fastjson_keyed(none.body) == {"consumeTps": 0.0, "offsetTable": {}}


async def test_consume_stats_keep_only_subscribed_topics_of_a_live_group(wire, session, backend) -> None:
    for topic in ("Sub", "Old"):
        await backend.create_topic(topic, 1)
        await backend.commit_consumer_offset("G", topic, 0, 0)
    await session.handle(wire(RequestCode.HEART_BEAT, None, java_heartbeat("c@1", "G", "Sub")))
    response = await session.handle(wire(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "G"}))
    assert set(fastjson_keyed(response.body)["offsetTable"]) == {"Sub/0"}


async def test_consumer_connection_list_and_topic_consume_by_who(wire, session, backend) -> None:
    offline = await session.handle(wire(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "G"}))
    assert offline is not None
    assert (offline.code, offline.remark) == (
        ResponseCode.CONSUMER_NOT_ONLINE,
        "the consumer group[G] not online",
    )
    await session.handle(wire(RequestCode.HEART_BEAT, None, java_heartbeat("c@1", "G", "T")))
    response = await session.handle(wire(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "G"}))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    body = json.loads(response.body)
    assert body["connectionSet"] == [{"clientAddr": "", "clientId": "c@1", "language": "JAVA", "version": 0}]
    assert (body["consumeType"], body["messageModel"], body["consumeFromWhere"]) == (
        "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_FIRST_OFFSET")  # fmt: skip
    subscription = body["subscriptionTable"]["T"]
    assert (subscription["subString"], subscription["tagsSet"]) == ("TagA || TagB", ["TagA", "TagB"])
    assert subscription["codeSet"] == [2598919, 2598920]  # Java String.hashCode
    await backend.commit_consumer_offset("Offline", "T", 0, 1)
    who = await session.handle(wire(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "T"}))
    assert json.loads(who.body) == {"groupList": ["G", "Offline"]}


async def test_topic_config(wire, session, backend) -> None:
    await backend.update_topic(TopicConfig("TC", read_queues=3, write_queues=2, perm=6))
    response = await session.handle(wire(RequestCode.GET_TOPIC_CONFIG, {"topic": "TC", "lo": "false"}))
    assert response is not None
    assert json.loads(response.body) == {"attributes": {}, "order": False, "perm": 6, "readQueueNums": 3,
                                         "topicFilterType": "SINGLE_TAG", "topicName": "TC",
                                         "topicSysFlag": 0, "writeQueueNums": 2}  # fmt: skip
    missing = await session.handle(wire(RequestCode.GET_TOPIC_CONFIG, {"topic": "Nope"}))
    assert (missing.code, missing.remark) == (
        ResponseCode.TOPIC_NOT_EXIST,
        "No topic in this broker. topic: Nope",
    )


# --- server-side assignment: SET_MESSAGE_REQUEST_MODE, QUERY_ASSIGNMENT ------------------------------------


def assignment_query(topic: str, client_id: str, strategy: str = "AVG", model: str = "CLUSTERING") -> bytes:
    return json.dumps({"topic": topic, "consumerGroup": "G", "clientId": client_id, "strategyName": strategy,
                       "messageModel": model}).encode()  # fmt: skip


def assigned(response) -> list[tuple[int, str]] | None:
    body = json.loads(response.body)
    if "messageQueueAssignments" not in body:
        return None
    return sorted((a["messageQueue"]["queueId"], a["mode"]) for a in body["messageQueueAssignments"])


async def test_set_consume_mode_then_query_assignment(wire, session, backend, autojump_clock) -> None:
    session = session
    await backend.create_topic("P", 4)
    for client in ("a@1", "b@1"):
        await session.handle(wire(RequestCode.HEART_BEAT, None, java_heartbeat(client, "G", "P", "*")))
    pull = await session.handle(wire(RequestCode.QUERY_ASSIGNMENT, None, assignment_query("P", "a@1")))
    assert assigned(pull) == [(0, "PULL"), (1, "PULL")]  # AVG over two clients
    circle = await session.handle(
        wire(RequestCode.QUERY_ASSIGNMENT, None, assignment_query("P", "b@1", "AVG_BY_CIRCLE"))
    )
    assert assigned(circle) == [(1, "PULL"), (3, "PULL")]
    mode = {"topic": "P", "consumerGroup": "G", "mode": "POP", "popShareQueueNum": 0}
    response = await session.handle(
        wire(RequestCode.SET_MESSAGE_REQUEST_MODE, None, json.dumps(mode).encode())
    )
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    pop = await session.handle(wire(RequestCode.QUERY_ASSIGNMENT, None, assignment_query("P", "a@1")))
    assert assigned(pop) == [(-1, "POP")]  # every queue, popped
    retry = await session.handle(
        wire(RequestCode.QUERY_ASSIGNMENT, None, assignment_query("%RETRY%G", "a@1"))
    )
    assert assigned(retry) == [(0, "PULL")]  # retry topics are always pulled
    unknown = await session.handle(
        wire(RequestCode.QUERY_ASSIGNMENT, None, assignment_query("P", "a@1", "CONSISTENT"))
    )
    assert assigned(unknown) is None  # no list: the client keeps what it has


@pytest.mark.parametrize(
    ("mode", "code", "remark"),
    [
        (
            {"topic": "%RETRY%G", "mode": "POP"},
            ResponseCode.NO_PERMISSION,
            "retry topic is not allowed to set mode",
        ),
        ({"topic": "Nope", "mode": "POP"}, ResponseCode.TOPIC_NOT_EXIST, "topic[Nope] not exist"),
        ({"topic": "P", "mode": "PUSH"}, ResponseCode.INVALID_PARAMETER, "mode 'PUSH' is not PULL or POP"),
    ],
)
async def test_set_consume_mode_refusals(mode, code, remark, wire, session, backend, autojump_clock) -> None:
    await backend.create_topic("P", 4)
    body = json.dumps({"consumerGroup": "G", "popShareQueueNum": 0, **mode}).encode()
    response = await session.handle(wire(RequestCode.SET_MESSAGE_REQUEST_MODE, None, body))
    assert response is not None
    assert (response.code, response.remark) == (code, remark)


async def test_consume_modes_survive_a_restart_of_the_services(tmp_path, autojump_clock) -> None:
    from mqproxy.backends.embedded.assignment import RequestModes
    from mqproxy.backends.embedded.embedded import open_embedded_store
    from mqproxy.facade.types import RequestMode

    async with open_embedded_store(tmp_path) as store:
        await store.create_topic("P", 4)
        await RequestModes(store).set("P", "G", RequestMode("POP", 2))
    async with open_embedded_store(tmp_path) as store:
        assert await RequestModes(store).get("P", "G") == RequestMode("POP", 2)
        assert await RequestModes(store).get("P", "Other") is None

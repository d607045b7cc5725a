"""Routes, heartbeats, group membership, NOTIFY_CONSUMER_IDS_CHANGED, unknown codes, error mapping."""

from __future__ import annotations

import json

import orjson
import pytest

from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.errors import StoreUnavailable
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.registry import ConnectionRegistry
from mqproxy.remoting.session import RemotingSession


def heartbeat(client_id: str, group: str = "G", *, topic: str = "T", enums: str = "names") -> bytes:
    if enums == "ints":  # C++ (jsoncpp): integer enums, trailing newline, no producerDataSet
        consumer = {"consumeFromWhere": 0, "consumeType": 1, "groupName": group, "messageModel": 1,
                    "subscriptionDataSet": [{"classFilterMode": False, "codeSet": [], "expressionType": "TAG",
                                             "subString": "TagA || TagB", "subVersion": "1700000000000",
                                             "tagsSet": ["TagA", "TagB"], "topic": topic}],
                    "unitMode": False}  # fmt: skip
        return (json.dumps({"clientID": client_id, "consumerDataSet": [consumer]}) + "\n").encode()
    consumer = {"consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_ACTIVELY",
                "groupName": group, "messageModel": "BROADCASTING",
                "subscriptionDataSet": [{"subString": "*", "topic": topic}]}  # fmt: skip
    return json.dumps({"clientID": client_id, "consumerDataSet": [consumer], "producerDataSet": []}).encode()


class FakePeer:
    """Stands in for a connection: records the NOTIFY_CONSUMER_IDS_CHANGED it would send."""

    def __init__(self) -> None:
        self.notified: list[str] = []

    def notify_consumer_ids_changed(self, group: str) -> None:
        self.notified.append(group)


# --- routes --------------------------------------------------------------------------------------------


async def test_route_for_a_new_topic_points_at_the_proxy(wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, version=401))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert b'"brokerAddrs":{"0":"10.0.0.8:8080"}' in response.body
    assert orjson.loads(response.body) == {
        "brokerDatas": [{"brokerAddrs": {"0": "10.0.0.8:8080"}, "brokerName": "broker-a",
                         "cluster": "DefaultCluster", "enableActingMaster": False}],
        "filterServerTable": {},
        "queueDatas": [{"brokerName": "broker-a", "perm": 6, "readQueueNums": 4, "topicSysFlag": 0,
                        "writeQueueNums": 4}],
    }  # fmt: skip
    assert response.ext_fields == {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
    assert await backend.get_topic("T") is not None


@pytest.mark.parametrize(
    ("topic", "perm", "queues"), [("TBW102", 7, 4), ("%RETRY%G", 6, 1), ("%DLQ%G", 6, 1)]
)
async def test_route_for_special_topics(topic, perm, queues, wire, session) -> None:
    response = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    (queue_data,) = orjson.loads(response.body)["queueDatas"]
    assert (queue_data["perm"], queue_data["readQueueNums"], queue_data["writeQueueNums"]) == (
        perm,
        queues,
        queues,
    )


async def test_route_without_auto_create(wire, manual_session) -> None:
    session = manual_session
    response = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}))
    assert response is not None
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert response.remark == "No topic route info in name server for the topic: T"
    assert response.body == b""
    template = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}))
    assert template is not None
    assert template.code == ResponseCode.SUCCESS
    retry = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "%RETRY%G"}))
    assert retry is not None
    assert retry.code == ResponseCode.SUCCESS
    assert await session.broker.get_topic("T") is None


@pytest.mark.parametrize("topic", ["bad topic", "", "x" * 300])
async def test_route_for_an_illegal_topic(topic, wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
    assert response is not None
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert await backend.get_topic(topic) is None


async def test_route_without_topic(wire, session) -> None:
    response = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {}))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert response.remark == "header field 'topic' is missing"


# --- heartbeats and groups -----------------------------------------------------------------------------


async def test_java_heartbeat_without_ext_fields(wire, session, backend, events) -> None:
    body = json.dumps({
        "clientID": "192.0.2.2@4242#99", "heartbeatFingerprint": 0, "withoutSub": False,
        "consumerDataSet": [{"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                             "consumeType": "CONSUME_PASSIVELY", "groupName": "G",
                             "messageModel": "CLUSTERING", "unitMode": False,
                             "subscriptionDataSet": [{"classFilterMode": False, "codeSet": [],
                                                      "expressionType": "TAG", "subString": "*",
                                                      "subVersion": 1, "tagsSet": [], "topic": "T"}]}],
        "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}, {"groupName": "PG"}],
    }).encode()  # fmt: skip
    request = wire(RequestCode.HEART_BEAT, None, body)
    assert request.ext_fields == {}
    response = await session.handle(request)
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert response.remark == ""
    assert await backend.consumer_ids("G") == ["192.0.2.2@4242#99"]
    retry = await backend.get_topic("%RETRY%G")
    assert retry is not None
    assert retry.write_queues == 1
    assert session.client_id == "192.0.2.2@4242#99"
    assert (events[-1].op, events[-1].client_id, events[-1].group) == ("HEART_BEAT", "192.0.2.2@4242#99", "G")


async def test_cpp_heartbeat_with_integer_enums(wire, session, backend) -> None:
    request = wire(RequestCode.HEART_BEAT, {"AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "x"},
                   heartbeat("127.0.0.1@77#DEFAULT", enums="ints"), language="CPP", version=333)  # fmt: skip
    response = await session.handle(request)
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    info = await backend.consumer_info("G", "127.0.0.1@77#DEFAULT")
    assert info is not None
    assert (info.consume_type, info.message_model) == ("CONSUME_PASSIVELY", "CLUSTERING")
    assert [(s.topic, s.expression) for s in info.subscriptions] == [("T", "TagA || TagB")]


async def test_alions_heartbeat_with_enum_names(wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.HEART_BEAT, {}, heartbeat("192.0.2.2@5"), version=121))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    info = await backend.consumer_info("G", "192.0.2.2@5")
    assert info is not None
    assert (info.consume_type, info.message_model) == ("CONSUME_ACTIVELY", "BROADCASTING")


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[1, 2]", b'{"consumerDataSet": []}', b'{"clientID": ""}',
     b'{"clientID": "c", "consumerDataSet": {"groupName": "G"}}',
     b'{"clientID": "c", "consumerDataSet": [{"subscriptionDataSet": []}]}',
     b'{"clientID": "c", "consumerDataSet": [{"groupName": ["G"]}]}',
     b'{"clientID": "c\xff", "consumerDataSet": []}',
     b'{"clientID": "c", "consumerDataSet": [{"groupName": "bad group!"}]}'],
)  # fmt: skip
async def test_malformed_heartbeat(body, wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.HEART_BEAT, None, body))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert response.remark
    assert await backend.consumer_ids("G") == []
    assert session.memberships == set()


async def test_consumer_list(wire, backend, broker) -> None:
    ctx = ServerContext("10.0.0.8", 8080)
    first, second = RemotingSession(broker, ctx), RemotingSession(broker, ctx)
    assert await first.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("b@2"))) is not None
    assert await second.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("a@1"))) is not None
    response = await first.handle(wire(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert orjson.loads(response.body) == {"consumerIdList": ["a@1", "b@2"]}
    empty = await first.handle(wire(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "Other"}))
    assert empty is not None
    assert empty.code == ResponseCode.SYSTEM_ERROR
    assert empty.remark == "no consumer for this group, Other"


async def test_notify_members_on_join_unregister_and_close(wire, backend, broker) -> None:
    """A join tells every member, the joining one included (a Java broker notifies getAllChannel(); a
    new Java consumer whose start-up rebalance lost the heartbeat lock would otherwise wait 20 s);
    a leave tells the members that remain."""
    registry = ConnectionRegistry()
    ctx = ServerContext("10.0.0.8", 8080, groups=registry)
    peer_a, peer_b, peer_c = FakePeer(), FakePeer(), FakePeer()
    a = RemotingSession(broker, ctx, conn=peer_a)
    b = RemotingSession(broker, ctx, conn=peer_b)
    c = RemotingSession(broker, ctx, conn=peer_c)
    await a.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("a@1")))
    assert peer_a.notified == ["G"]  # alone in the group, and told so
    await b.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("b@2")))
    assert (peer_a.notified, peer_b.notified) == (["G", "G"], ["G"])
    await b.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("b@2")))  # periodic: no change
    assert (peer_a.notified, peer_b.notified) == (["G", "G"], ["G"])
    await c.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("c@3")))
    assert (peer_a.notified, peer_b.notified, peer_c.notified) == (["G"] * 3, ["G"] * 2, ["G"])
    # UNREGISTER_CLIENT as C++ sends it (the unused group is "")
    unregister = {"clientID": "b@2", "producerGroup": "", "consumerGroup": "G"}
    response = await b.handle(wire(RequestCode.UNREGISTER_CLIENT, unregister, language="CPP"))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert (peer_a.notified, peer_b.notified, peer_c.notified) == (["G"] * 4, ["G"] * 2, ["G"] * 2)
    assert await backend.consumer_ids("G") == ["a@1", "c@3"]
    # connection A ends without unregistering
    await a.close()
    assert await backend.consumer_ids("G") == ["c@3"]
    assert (peer_a.notified, peer_c.notified) == (["G"] * 4, ["G"] * 3)
    assert registry.connections("G") == [peer_c]


async def test_unregister_producer_only(wire, session, backend) -> None:
    response = await session.handle(
        wire(RequestCode.UNREGISTER_CLIENT, {"clientID": "x@1", "producerGroup": "PG"})
    )
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    missing = await session.handle(wire(RequestCode.UNREGISTER_CLIENT, {"producerGroup": "PG"}))
    assert missing is not None
    assert missing.code == ResponseCode.INVALID_PARAMETER
    assert "clientID" in (missing.remark or "")


async def test_closing_an_old_connection_keeps_a_reconnected_client(wire, backend, broker) -> None:
    registry = ConnectionRegistry()
    ctx = ServerContext("10.0.0.8", 8080, groups=registry)
    old, new = RemotingSession(broker, ctx, conn=FakePeer()), RemotingSession(broker, ctx, conn=FakePeer())
    await old.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("x@1")))
    await new.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("x@1")))
    await old.close()
    assert await backend.consumer_ids("G") == ["x@1"]
    await new.close()
    assert await backend.consumer_ids("G") == []


# --- generic behaviour ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "op"), [(9999, "UNKNOWN_9999"), (324, "SEND_REPLY_MESSAGE"), (-5, "UNKNOWN_-5")]
)
async def test_unknown_code(code, op, wire, session, events) -> None:
    response = await session.handle(wire(code, {"x": 1}, opaque=1234))
    assert response is not None
    assert (response.code, response.opaque, response.flag) == (
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        1234,
        1,
    )
    assert response.remark == f" request type {code} not supported"
    assert response.ext_fields == {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
    assert (events[-1].op, events[-1].status, events[-1].outcome) == (
        op,
        "REQUEST_CODE_NOT_SUPPORTED",
        "error",
    )


async def test_oneway_unknown_code_is_not_answered(wire, session) -> None:
    assert await session.handle(wire(9999, {}, flag=2)) is None


async def test_handler_bug_becomes_system_error(wire, session, backend, monkeypatch) -> None:
    async def broken(topic: str) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(backend, "get_topic", broken)
    response = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}))
    assert response is not None
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark == "RuntimeError: boom"
    monkeypatch.undo()
    again = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}))
    assert again is not None
    assert again.code == ResponseCode.SUCCESS


async def test_store_unavailable_maps_to_service_not_available(wire, session, backend, monkeypatch) -> None:
    async def closed(message: object) -> None:
        raise StoreUnavailable("store is closing")

    monkeypatch.setattr(backend, "send", closed)
    ext = {"a": "PG", "b": "T", "e": "0", "f": "0", "g": "0", "h": "0"}
    response = await session.handle(wire(RequestCode.SEND_MESSAGE_V2, ext, b"x"))
    assert response is not None
    assert response.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert response.remark == "StoreUnavailable: store is closing"


async def test_response_header_is_json_with_server_version(wire, session) -> None:
    from mqproxy.codecs.remoting import encode_command

    response = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, opaque=3))
    assert response is not None
    frame = encode_command(response)
    header_len = int.from_bytes(frame[4:8], "big")
    assert frame[4] == 0  # serialize type JSON in the top byte
    header = orjson.loads(frame[8 : 8 + header_len])
    assert header["version"] == 479
    assert header["language"] == "JAVA"
    assert header["opaque"] == 3


async def test_heartbeat_without_a_group_leaves_it(wire, backend, broker) -> None:
    registry = ConnectionRegistry()
    ctx = ServerContext("10.0.0.8", 8080, groups=registry)
    watcher, leaver = FakePeer(), FakePeer()
    a = RemotingSession(broker, ctx, conn=watcher)
    b = RemotingSession(broker, ctx, conn=leaver)
    await a.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("a@1")))
    await b.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("b@2")))
    assert watcher.notified == ["G", "G"]  # its own join, then b's
    # b's consumer of G shut down; its process keeps heartbeating for another group only
    await b.handle(wire(RequestCode.HEART_BEAT, None, heartbeat("b@2", group="H")))
    assert await backend.consumer_ids("G") == ["a@1"]
    assert await backend.consumer_ids("H") == ["b@2"]
    assert watcher.notified == ["G", "G", "G"]
    assert leaver.notified == ["G", "H"]  # joined G, then joined H (leaving G tells only who stays)
    assert registry.connections("G") == [watcher]

"""Reading name-server answers, in standard JSON and in the Java servers' fastjson dialect."""

from __future__ import annotations

import pytest

from mqproxy.backends.rocketmq.topology import TopologyError, loads_java_json, parse_cluster, parse_route
from mqproxy.backends.rocketmq.wire import check, command, heartbeat_body, java_hash
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.model.errors import BrokerRefused
from mqproxy.model.types import ConsumerInfo, Subscription

FASTJSON_ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},"brokerName":"broker-a",'
    b'"cluster":"C"},{"brokerAddrs":{1:"127.0.0.1:10931"},"brokerName":"broker-b","cluster":"C"}],'
    b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4},'
    b'{"brokerName":"broker-b","perm":4,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2}]}'
)


def test_a_fastjson_route_names_masters_and_queue_counts() -> None:
    route = parse_route("T", FASTJSON_ROUTE)
    a, b = route.brokers["broker-a"], route.brokers["broker-b"]
    assert a.addr == "127.0.0.1:10911"
    assert a.queue_count == 4
    assert a.writable(3)
    assert not a.writable(4)
    assert b.addr is None
    assert not b.readable(0)
    assert not route.brokers["broker-b"].writable(0)


def test_standard_json_reads_the_same() -> None:
    standard = FASTJSON_ROUTE.replace(b"{0:", b'{"0":').replace(b",1:", b',"1":').replace(b"{1:", b'{"1":')
    assert parse_route("T", standard) == parse_route("T", FASTJSON_ROUTE)


@pytest.mark.parametrize(
    "body", [b"", b"[]", b"{not json", b'{"queueDatas": [{"perm": 6}]}', b'{"brokerDatas": 3}']
)
def test_an_unreadable_route_is_a_topology_error(body: bytes) -> None:
    with pytest.raises(TopologyError):
        parse_route("T", body)


def test_cluster_info_lists_masters_and_clusters() -> None:
    body = (
        b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:1"},"brokerName":"broker-a"}},'
        b'"clusterAddrTable":{"C":["broker-a"]}}'
    )
    info = parse_cluster(body)
    assert info.masters == {"broker-a": "127.0.0.1:1"}
    assert info.clusters == {"C": ("broker-a",)}
    assert loads_java_json(b'{"offsetTable":{"T@g":{0:5,1:7}}}') == {"offsetTable": {"T@g": {"0": 5, "1": 7}}}


def test_java_hash_is_string_hash_code() -> None:
    assert [java_hash(t) for t in ("hello", "TagA", "", "中文")] == [99162322, 2598919, 0, 646394]
    assert java_hash("a" * 40) < 2**31  # wraps as a Java int


def test_a_heartbeat_carries_tag_codes_and_producer_groups() -> None:
    import orjson

    body = orjson.loads(
        heartbeat_body("cid", [ConsumerInfo("cid", "g", (Subscription("T", "TagA || TagB"),))], ["pg"])
    )
    (consumer,) = body["consumerDataSet"]
    (sub,) = consumer["subscriptionDataSet"]
    assert sub["tagsSet"] == ["TagA", "TagB"]
    assert sub["codeSet"] == [java_hash("TagA"), java_hash("TagB")]
    assert body["producerDataSet"] == [{"groupName": "pg"}]
    assert body["clientID"] == "cid"


def test_header_values_are_text_and_refusals_keep_code_and_remark() -> None:
    request = command(10, {"a": 1, "b": True, "c": None})
    assert request.ext_fields == {"a": "1", "b": "true"}
    with pytest.raises(BrokerRefused) as caught:
        check(RemotingCommand(code=26, remark="Group g not exist!"))
    assert (caught.value.code, caught.value.remark) == (26, "Group g not exist!")
    ok = RemotingCommand(code=19)
    assert check(ok, 19) is ok

"""Reading a broker's GET_CONSUME_STATS body (fastjson's MessageQueue-keyed map) for the lag metrics."""

from __future__ import annotations

from mqproxy.backends.rocketmq.stats import ConsumeStat, parse_consume_stats
from mqproxy.remoting.consumer_admin import fastjson_map


def test_reads_every_queue_of_a_fastjson_body() -> None:
    table = fastjson_map([
        ({"brokerName": "broker-a", "queueId": 0, "topic": "T"},
         {"brokerOffset": 5, "consumerOffset": 3, "lastTimestamp": 1, "pullOffset": 5}),
        ({"brokerName": "broker-b", "queueId": 3, "topic": "%RETRY%G"},
         {"brokerOffset": 0, "consumerOffset": 0, "lastTimestamp": 0, "pullOffset": 0}),
    ])
    body = b'{"consumeTps":0.5,"offsetTable":' + table + b"}"
    assert list(parse_consume_stats("G", body)) == [
        ConsumeStat("G", "T", "broker-a", 0, 5, 3),
        ConsumeStat("G", "%RETRY%G", "broker-b", 3, 0, 0),
    ]


def test_as_a_stock_broker_writes_it_and_skips_malformed_entries() -> None:
    body = (b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"b1","queueId":1,"topic":"Orders"}:'
            b'{"brokerOffset":120,"consumerOffset":100,"lastTimestamp":1700000000000,"pullOffset":110},'
            b'{"brokerName":"b1","topic":"Orders"}:{"brokerOffset":1}}}')
    assert list(parse_consume_stats("G", body)) == [ConsumeStat("G", "Orders", "b1", 1, 120, 100)]
    assert list(parse_consume_stats("G", b"{}")) == []

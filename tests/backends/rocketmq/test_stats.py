"""Reading a broker's GET_CONSUME_STATS body (fastjson's MessageQueue-keyed map) for the lag metrics."""

from __future__ import annotations

from mqproxy.backends.rocketmq.stats import ConsumeStat, consume_stats, parse_consume_stats
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.errors import ClusterUnavailable
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


class FakeCluster:
    """Brokers answering GET_ALL_CONSUMER_OFFSET / GET_CONSUME_STATS from tables; ``down`` ones fail."""

    def __init__(
        self, offsets: dict[str, bytes], stats: dict[tuple[str, str], bytes], down: set[str]
    ) -> None:
        self.offsets, self.stats, self.down = offsets, stats, down
        self.asked: list[tuple[str, int, dict[str, str]]] = []

    def masters(self) -> dict[str, str]:
        return {name: f"10.0.0.{i}:10911" for i, name in enumerate(sorted({*self.offsets, *self.down}))}

    async def broker_call(self, broker: str, request: RemotingCommand) -> RemotingCommand:
        self.asked.append((broker, request.code, dict(request.ext_fields)))
        if broker in self.down:
            raise ClusterUnavailable(f"{broker} unreachable")
        if request.code == RequestCode.GET_ALL_CONSUMER_OFFSET:
            return RemotingCommand(ResponseCode.SUCCESS, body=self.offsets[broker])
        body = self.stats.get((broker, request.ext_fields["consumerGroup"]))
        if body is None:
            return RemotingCommand(ResponseCode.SYSTEM_ERROR, remark="no such group")
        return RemotingCommand(ResponseCode.SUCCESS, body=body)


def _stats(*rows: tuple[str, str, int, int, int]) -> bytes:
    table = fastjson_map([
        ({"brokerName": b, "queueId": q, "topic": t}, {"brokerOffset": bo, "consumerOffset": co})
        for t, b, q, bo, co in rows
    ])
    return b'{"consumeTps":0.0,"offsetTable":' + table + b"}"


async def test_asks_every_master_for_each_groups_stats_skipping_system_and_unreachable() -> None:
    offsets = {
        "b1": b'{"offsetTable":{"T@G":{0:5},"%RETRY%G@G":{0:0},"rmq_sys_SYNC@CID_SYS":{0:1},"U@H":{1:2}}}',
    }
    stats = {
        ("b1", "G"): _stats(("T", "b1", 0, 9, 5), ("%RETRY%G", "b1", 0, 0, 0), ("rmq_sys_X", "b1", 0, 4, 0)),
        ("b1", "H"): _stats(("U", "b1", 1, 2, 2)),
    }
    cluster = FakeCluster(offsets, stats, down={"b2"})
    found = await consume_stats(cluster)  # type: ignore[arg-type]
    assert found == [
        ConsumeStat("G", "T", "b1", 0, 9, 5),
        ConsumeStat("G", "%RETRY%G", "b1", 0, 0, 0),
        ConsumeStat("H", "U", "b1", 1, 2, 2),
    ]
    asked = [(b, e["consumerGroup"]) for b, code, e in cluster.asked if code == RequestCode.GET_CONSUME_STATS]
    assert asked == [("b1", "G"), ("b1", "H")]  # not the system group; no more asked of the one down
    assert ("b2", RequestCode.GET_ALL_CONSUMER_OFFSET, {}) in cluster.asked

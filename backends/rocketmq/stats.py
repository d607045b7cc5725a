"""
mqproxy.backends.rocketmq.stats
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Consumer progress as the brokers themselves report it, for the lag metrics: what ``mqadmin
consumerProgress`` shows, read the way it reads it. Read-only.

Contracts:

* :func:`consume_stats` asks every master broker for the groups with committed offsets
  (GET_ALL_CONSUMER_OFFSET, keys ``topic@group``), then each such group's GET_CONSUME_STATS; every row
  is one real queue (broker name, the broker's own queue id) with the broker's ``brokerOffset`` and
  ``consumerOffset``, exactly as in the broker's answer. System topics and groups are left out. A broker
  that cannot be reached, or refuses, is skipped (its queues are absent from the answer).
* :func:`parse_consume_stats` reads a ConsumeStats body (fastjson writes its ``offsetTable`` with
  MessageQueue objects as map keys, which is not JSON); pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import orjson

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.topology import TopologyError, loads_java_json
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.errors import BackendError

if TYPE_CHECKING:
    from mqproxy.backends.rocketmq.cluster import Cluster

__all__ = ["ConsumeStat", "consume_stats", "parse_consume_stats"]

#: Topic prefixes of the brokers' own bookkeeping (not consumer lag anyone acts on).
SYSTEM_TOPICS: Final = ("rmq_sys_", "RMQ_SYS_", "SCHEDULE_TOPIC", "TRANS_CHECK", "TBW102")
#: One ``{MessageQueue}:{OffsetWrapper}`` entry: both objects are flat (no nested braces).
_ENTRY: Final = re.compile(rb"(\{[^{}]*\})\s*:\s*(\{[^{}]*\})")


@dataclass(frozen=True, slots=True)
class ConsumeStat:
    """One queue of one group as a broker reports it (``mqadmin consumerProgress`` prints one row)."""

    group: str
    topic: str
    broker: str
    queue_id: int
    broker_offset: int
    consumer_offset: int


def _offset_table(body: bytes) -> bytes:
    start = body.find(b'"offsetTable"')
    if start < 0:
        return b""
    return body[body.find(b"{", start) + 1 :]


def parse_consume_stats(group: str, body: bytes) -> Iterator[ConsumeStat]:
    """The rows of a GET_CONSUME_STATS body; malformed entries are skipped."""
    for key_text, value_text in _ENTRY.findall(_offset_table(body)):
        try:
            key, value = orjson.loads(key_text), orjson.loads(value_text)
            yield ConsumeStat(
                group,
                str(key["topic"]),
                str(key["brokerName"]),
                int(key["queueId"]),
                int(value.get("brokerOffset", 0)),
                int(value.get("consumerOffset", 0)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            continue


def _system(topic: str) -> bool:
    return topic.startswith(SYSTEM_TOPICS)


async def _groups(cluster: Cluster, broker: str) -> set[str]:
    response = await cluster.broker_call(broker, wire.command(RequestCode.GET_ALL_CONSUMER_OFFSET))
    if response.code != ResponseCode.SUCCESS or not response.body:
        return set()
    table = loads_java_json(response.body).get("offsetTable") or {}
    groups = set()
    for key in table:
        topic, _, group = str(key).partition("@")
        if group and not _system(topic):
            groups.add(group)
    return groups


async def consume_stats(cluster: Cluster) -> list[ConsumeStat]:
    """Every group's per-queue progress on every reachable master broker (see the module contract)."""
    found: list[ConsumeStat] = []
    for broker in cluster.masters():
        try:
            groups = await _groups(cluster, broker)
            for group in sorted(groups):
                request = wire.command(RequestCode.GET_CONSUME_STATS, {"consumerGroup": group})
                response = await cluster.broker_call(broker, request)
                if response.code != ResponseCode.SUCCESS or not response.body:
                    continue
                found.extend(s for s in parse_consume_stats(group, response.body) if not _system(s.topic))
        except (BackendError, TopologyError):
            continue
    return found

"""
mqproxy.backends.rocketmq.wire
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Sans-IO requests to stock RocketMQ name servers and brokers, and the reading of their answers.

Contracts:

* Builders return a :class:`~mqproxy.codecs.remoting.RemotingCommand` with the header keys a Java
  5.x client sends (``SEND_MESSAGE_V2`` short keys, ``bname`` where the broker reads it).
* :func:`check` turns a non-success response into :class:`~mqproxy.model.errors.BrokerRefused` carrying
  the broker's code and remark; codes that are normal flow for a request are passed in ``ok``.
* Message records are decoded with :mod:`mqproxy.codecs.message_record`; nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Final

import orjson

from mqproxy.codecs.message_record import decode_records, encode_properties
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.errors import BrokerRefused
from mqproxy.model.types import ConsumerInfo, FilterExpression, Message, StoredMessage

__all__ = [
    "KV_NAMESPACE",
    "PUT_KV_CONFIG",
    "check",
    "command",
    "group_body",
    "heartbeat_body",
    "java_hash",
    "records",
    "send_request",
]

#: Name-server KV codes (RocketMQ ``RequestCode.PUT_KV_CONFIG`` / ``GET_KV_CONFIG``).
PUT_KV_CONFIG: Final = 100
GET_KV_CONFIG: Final = int(RequestCode.GET_KV_CONFIG)
#: The KV namespace every mqproxy node keeps its shared numbering in.
KV_NAMESPACE: Final = "mqproxy"
#: The template topic a broker auto-creates new topics from.
DEFAULT_TOPIC: Final = "TBW102"


def command(code: int, ext: Mapping[str, object] | None = None, body: bytes = b"") -> RemotingCommand:
    """A request with every header value as text (the broker reads them as strings)."""
    fields = {
        k: (str(v).lower() if isinstance(v, bool) else str(v))
        for k, v in (ext or {}).items()
        if v is not None
    }
    return RemotingCommand(code=code, ext_fields=fields, body=body)


def check(response: RemotingCommand, *ok: int) -> RemotingCommand:
    """``response`` if its code is SUCCESS or one of ``ok``, else :class:`BrokerRefused`."""
    if response.code == ResponseCode.SUCCESS or response.code in ok:
        return response
    raise BrokerRefused(response.code, response.remark or "")


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (the tag codes a broker filters consume queues by)."""
    h = 0
    data = text.encode("utf-16-le")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] | data[i + 1] << 8)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _tags(expression: str) -> list[str]:
    text = expression.strip()
    if text in ("", "*"):
        return []
    return sorted({t.strip() for t in text.split("||") if t.strip()})


def subscription_json(topic: str, expression: str, kind: str) -> dict[str, object]:
    """One ``SubscriptionData`` as a heartbeat carries it."""
    tags = _tags(expression) if kind == "TAG" else []
    return {
        "classFilterMode": False,
        "topic": topic,
        "subString": expression if expression.strip() else "*",
        "tagsSet": tags,
        "codeSet": [java_hash(t) for t in tags],
        "subVersion": 0,
        "expressionType": kind,
    }


def heartbeat_body(
    client_id: str, consumers: Iterable[ConsumerInfo], producer_groups: Iterable[str]
) -> bytes:
    """A HEART_BEAT body registering ``consumers`` and ``producer_groups`` for ``client_id``."""
    return orjson.dumps(
        {
            "clientID": client_id,
            "consumerDataSet": [
                {
                    "groupName": info.group,
                    "consumeType": info.consume_type,
                    "messageModel": info.message_model,
                    "consumeFromWhere": info.consume_from_where,
                    "subscriptionDataSet": [
                        subscription_json(s.topic, s.expression, s.expression_type)
                        for s in info.subscriptions
                    ],
                    "unitMode": False,
                }
                for info in consumers
            ],
            "producerDataSet": [{"groupName": g} for g in producer_groups],
        }
    )


def send_request(
    message: Message,
    broker: str,
    queue_id: int,
    producer_group: str,
    max_reconsume_times: int | None,
    default_queue_nums: int,
) -> RemotingCommand:
    """SEND_MESSAGE_V2 of ``message`` to ``queue_id`` of ``broker``."""
    return command(
        RequestCode.SEND_MESSAGE_V2,
        {
            "a": producer_group or "MQPROXY_PRODUCER",
            "b": message.topic,
            "c": DEFAULT_TOPIC,
            "d": default_queue_nums,
            "e": queue_id,
            "f": message.sys_flag,
            "g": message.born_timestamp_ms or int(time.time() * 1000),  # 0 reads as "ancient" to a broker
            "h": message.flag,
            "i": encode_properties(message.properties),
            "j": message.reconsume_times,
            "k": False,
            "l": max_reconsume_times,
            "m": False,
            "n": broker,
        },
        message.body,
    )


def group_body(name: str, *, orderly: bool = False, retry_max_times: int = 16) -> bytes:
    """An UPDATE_AND_CREATE_SUBSCRIPTIONGROUP body (RocketMQ ``SubscriptionGroupConfig``)."""
    return orjson.dumps(
        {
            "groupName": name,
            "consumeEnable": True,
            "consumeFromMinEnable": True,
            "consumeBroadcastEnable": True,
            "consumeMessageOrderly": orderly,
            "retryQueueNums": 1,
            "retryMaxTimes": retry_max_times,
            "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True,
        }
    )


def filter_fields(message_filter: FilterExpression | None) -> tuple[str, str]:
    if message_filter is None:
        return "*", "TAG"
    return (message_filter.expression or "*"), message_filter.kind


def records(body: bytes) -> list[StoredMessage]:
    """The messages of a pull / view / query body."""
    return [record.to_stored_message() for record in decode_records(body)] if body else []


def lock_body(group: str, client_id: str, queues: Iterable[tuple[str, str, int]]) -> bytes:
    """A LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body for (topic, broker, queue id) triples."""
    return orjson.dumps(
        {
            "consumerGroup": group,
            "clientId": client_id,
            "mqSet": [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in queues],
            "onlyThisBroker": False,
        }
    )

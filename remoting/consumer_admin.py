"""
mqproxy.remoting.consumer_admin
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

What ``mqadmin consumerProgress``/``consumerConnection``/``queryMsgById`` (message tracks) ask a broker
about consumer groups, answered as a Java broker's ``AdminBrokerProcessor`` does.

* GET_CONSUME_STATS (208): header ``consumerGroup``, optional ``topic`` or ``topicList`` (``;``-joined).
  Topics: the list, else the topic, else every topic the group committed offsets on; without a list,
  a group with live members keeps only topics it subscribes to. Per readable queue: ``brokerOffset``
  (max offset), ``consumerOffset`` (committed, 0 if none), ``pullOffset`` (where the group last pulled
  to, at least the consumer offset), ``lastTimestamp`` (store time of the last consumed message, 0 if
  none). Body ConsumeStats in fastjson's form, whose map keys are MessageQueue objects (not standard
  JSON; fastjson reads it).
* GET_CONSUMER_CONNECTION_LIST (203): header ``consumerGroup``; ConsumerConnection of the live
  members (client id, address, language, version; subscriptions, consume type, model, from-where), or
  CONSUMER_NOT_ONLINE (206) "the consumer group[<g>] not online".
* QUERY_TOPIC_CONSUME_BY_WHO (300): header ``topic``; GroupList of the live groups subscribing to it
  and the groups with committed offsets on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.api import PullRequest
from mqproxy.model.errors import BackendError
from mqproxy.model.types import ConsumerInfo, PullStatus
from mqproxy.remoting.context import BROKER_NAME
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import Fields
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

_TOPIC_LIST_SEPARATOR: Final = ";"


def fastjson_map(entries: list[tuple[dict[str, Any], dict[str, Any]]]) -> bytes:
    """A JSON object whose keys are objects, as fastjson writes ``Map<MessageQueue, V>``."""
    return b"{" + b",".join(orjson.dumps(k) + b":" + orjson.dumps(v) for k, v in entries) + b"}"


def _queue(topic: str, queue_id: int) -> dict[str, Any]:
    return {"brokerName": BROKER_NAME, "queueId": queue_id, "topic": topic}


async def _members(session: RemotingSession, group: str) -> list[ConsumerInfo]:
    broker = session.broker
    members = [await broker.consumer_info(group, client_id) for client_id in await broker.consumer_ids(group)]
    return [m for m in members if m is not None]


async def get_consume_stats(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    fields = Fields(request.ext_fields)
    group = fields.text("consumerGroup")
    note.group = group
    listed = [t for t in (fields.optional_text("topicList") or "").split(_TOPIC_LIST_SEPARATOR) if t.strip()]
    topics = await _stats_topics(session, group, listed, fields.optional_text("topic") or "")
    entries: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for topic in topics:
        config = await session.broker.get_topic(topic)
        if config is None:
            continue
        for queue_id in range(config.read_queues):
            entries.append((_queue(topic, queue_id), await _offsets(session, group, topic, queue_id)))
    body = b'{"consumeTps":0.0,"offsetTable":' + fastjson_map(entries) + b"}"
    return Reply(ResponseCode.SUCCESS, body=body)


async def _stats_topics(session: RemotingSession, group: str, listed: list[str], topic: str) -> list[str]:
    if listed:
        return listed
    broker = session.broker
    if topic.strip():
        topics = {topic}
    else:
        topics = {o.topic for o in await broker.consumer_offsets() if o.group == group}
    subscribed = {s.topic for m in await _members(session, group) for s in m.subscriptions}
    if subscribed:
        topics &= subscribed
    return sorted(topics)


async def _offsets(session: RemotingSession, group: str, topic: str, queue_id: int) -> dict[str, int]:
    broker = session.broker
    broker_offset = await broker.max_offset(topic, queue_id)
    committed = await broker.query_consumer_offset(group, topic, queue_id)
    consumer_offset = max(committed or 0, 0)
    last = 0
    if consumer_offset > 0:
        try:
            result = await broker.pull(PullRequest(group, topic, queue_id, consumer_offset - 1, 1))
        except BackendError:
            result = None
        if result is not None and result.status is PullStatus.FOUND:
            last = result.messages[0].store_timestamp_ms
    pulled = session.ctx.pull_offsets.get(group, topic, queue_id)
    return {
        "brokerOffset": broker_offset,
        "consumerOffset": consumer_offset,
        "lastTimestamp": last,
        "pullOffset": max(consumer_offset, pulled or 0),
    }


def _subscription_data(subscription: Any) -> dict[str, Any]:
    tags = (
        []
        if subscription.expression.strip() in ("", "*")
        else [t.strip() for t in subscription.expression.split("||") if t.strip()]
    )
    if subscription.expression_type != "TAG":
        tags = []
    return {
        "classFilterMode": False,
        "codeSet": [_java_hash(t) for t in tags],
        "expressionType": subscription.expression_type,
        "subString": subscription.expression,
        "subVersion": 0,
        "tagsSet": tags,
        "topic": subscription.topic,
    }


def _java_hash(text: str) -> int:
    """Java ``String.hashCode`` (tags' codes in SubscriptionData)."""
    units = text.encode("utf-16-be")
    value = 0
    for i in range(0, len(units), 2):
        value = (31 * value + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


async def get_consumer_connection_list(
    session: RemotingSession, request: RemotingCommand, note: Note
) -> Reply:
    group = Fields(request.ext_fields).text("consumerGroup")
    note.group = group
    members = await _members(session, group)
    if not members:
        raise RequestError(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
    connections = []
    subscriptions: dict[str, dict[str, Any]] = {}
    for member in members:
        connections.append(_connection(session, group, member.client_id))
        for subscription in member.subscriptions:
            subscriptions[subscription.topic] = _subscription_data(subscription)
    first = members[0]
    body = {
        "connectionSet": connections,
        "consumeFromWhere": first.consume_from_where,
        "consumeType": first.consume_type,
        "messageModel": first.message_model,
        "subscriptionTable": subscriptions,
    }
    return Reply(ResponseCode.SUCCESS, body=orjson.dumps(body))


def _connection(session: RemotingSession, group: str, client_id: str) -> dict[str, Any]:
    """Connection of one member: its connection's peer address, language and version when known."""
    peer = session.ctx.groups.owner(group, client_id)
    member_session = getattr(peer, "session", None)
    host, port = getattr(member_session, "peer", ("", 0))
    return {
        "clientAddr": f"{host}:{port}" if host else "",
        "clientId": client_id,
        "language": getattr(member_session, "language", None) or "JAVA",
        "version": getattr(member_session, "version", None) or 0,
    }


async def query_topic_consume_by_who(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    topic = Fields(request.ext_fields).text("topic")
    note.topic = topic
    broker = session.broker
    groups = {o.group for o in await broker.consumer_offsets() if o.topic == topic}
    for group in await broker.consumer_groups():
        if any(s.topic == topic for m in await _members(session, group) for s in m.subscriptions):
            groups.add(group)
    return Reply(ResponseCode.SUCCESS, body=orjson.dumps({"groupList": sorted(groups)}))

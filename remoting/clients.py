"""
mqproxy.remoting.clients
~~~~~~~~~~~~~~~~~~~~~~~~

Client and consumer-group bookkeeping (spec §3.8, §3.9, §3.12, §5.1, §10.3).

* HEART_BEAT (34): body HeartbeatData JSON (Java sends no ``extFields`` at all; C++ sends integer
  enums, Java/ali-ons their names). Records the client id on the session, registers every consumer
  group with its subscriptions, ensures ``%RETRY%<group>`` (one queue), and sends
  NOTIFY_CONSUMER_IDS_CHANGED to every connection of the group, the heartbeating one included, when
  membership or subscriptions changed (a Java broker notifies ``getAllChannel()``: a new Java consumer
  whose own start-up rebalance was skipped, "lock heartBeat, but failed", relies on it). Repeated
  identical heartbeats are idempotent; a group this client announced before on this connection and
  no longer lists is left (as if it had sent UNREGISTER_CLIENT). Producer groups
  (``producerDataSet``, ``CLIENT_INNER_PRODUCER`` aside) are recorded for transaction check-backs.
* UNREGISTER_CLIENT (35): removes ``clientID`` from the named consumer group and notifies the rest;
  a named producer group stops receiving check-backs on this connection.
* GET_CONSUMER_LIST_BY_GROUP (38): ``{"consumerIdList": [...]}`` of live members, or SYSTEM_ERROR
  "no consumer for this group" like a Java broker.
* CHECK_CLIENT_CONFIG (46): SUCCESS for TAG subscriptions and SQL92 ones that compile,
  SUBSCRIPTION_PARSE_FAILED otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.model.sql92 import Sql92Error, compile_sql92
from mqproxy.model.topics import RETRY_PREFIX
from mqproxy.model.types import ConsumerInfo, Subscription
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import Fields, UnregisterHeader, parse_header
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

#: Java enum constants in ordinal order: C++ heartbeats send the ordinal, others the name.
CONSUME_TYPES: Final = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY", "CONSUME_POP")
MESSAGE_MODELS: Final = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM: Final = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)
#: Producer group every Java client with consumers announces; never interesting in logs.
_INNER_PRODUCER: Final = "CLIENT_INNER_PRODUCER"


def _bad_body(problem: str) -> RequestError:
    return RequestError(ResponseCode.INVALID_PARAMETER, f"heartbeat body {problem}")


def _text(obj: dict[str, Any], key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if value is None:
        raise _bad_body(f"lacks {key!r}")
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _bad_body(f"has a non-string {key!r}")
    return str(value)


def _enum(obj: dict[str, Any], key: str, names: tuple[str, ...], default: str) -> str:
    """A Java enum sent as its name or its ordinal; missing or unknown values give ``default``."""
    value = obj.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    if isinstance(value, str) and value in names:
        return value
    return default


def _list(obj: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _bad_body(f"has a malformed {key!r}")
    return value


def parse_heartbeat(body: bytes) -> tuple[str, list[ConsumerInfo], list[str]]:
    """(client id, consumer memberships, producer groups) from a HeartbeatData body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _bad_body("is not JSON") from None
    if not isinstance(data, dict):
        raise _bad_body("is not a JSON object")
    client_id = _text(data, "clientID")
    if not client_id:
        raise _bad_body("has an empty 'clientID'")
    consumers: list[ConsumerInfo] = []
    for item in _list(data, "consumerDataSet"):
        group = _text(item, "groupName")
        subscriptions = tuple(
            Subscription(
                topic=_text(sub, "topic"),
                expression=_text(sub, "subString", "*"),
                expression_type=_text(sub, "expressionType", "TAG").upper() or "TAG",
            )
            for sub in _list(item, "subscriptionDataSet")
        )
        consumers.append(
            ConsumerInfo(
                client_id=client_id,
                group=group,
                subscriptions=subscriptions,
                consume_type=_enum(item, "consumeType", CONSUME_TYPES, "CONSUME_PASSIVELY"),
                message_model=_enum(item, "messageModel", MESSAGE_MODELS, "CLUSTERING"),
                consume_from_where=_enum(item, "consumeFromWhere", CONSUME_FROM, "CONSUME_FROM_LAST_OFFSET"),
            )
        )
    producers = [_text(item, "groupName") for item in _list(data, "producerDataSet")]
    return client_id, consumers, producers


async def heart_beat(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    client_id, consumers, producers = parse_heartbeat(request.body)
    session.client_id = client_id
    named = [c.group for c in consumers] + [p for p in producers if p != _INNER_PRODUCER]
    note.group = named[0] if named else None
    broker, groups = session.broker, session.ctx.groups
    announced = {info.group for info in consumers}
    dropped = sorted(g for g, cid in session.memberships if cid == client_id and g not in announced)
    for group in dropped:  # the client stopped consuming this group without UNREGISTER_CLIENT
        await _leave(session, group, client_id)
    announced_producers = {p for p in producers if p != _INNER_PRODUCER}
    for group in session.producer_groups - announced_producers:
        if groups.leave_producer(group, session.conn):
            broker.announce_producer(group, present=False)
    for group in announced_producers:  # re-joining keeps the newest connection preferred
        groups.join_producer(group, session.conn)
        broker.announce_producer(group)
    session.producer_groups = announced_producers
    for info in consumers:
        # registered first: a facade in front of several backends learns there where the group's retry
        # topic belongs (with its subscribed topics)
        changed = await broker.register_consumer(info)
        retry_topic = RETRY_PREFIX + info.group
        if retry_topic not in session.ensured_topics:
            await broker.create_topic(retry_topic, 1)
            session.ensured_topics.add(retry_topic)
        groups.join(info.group, client_id, session.conn)
        session.memberships.add((info.group, client_id))
        if changed:
            groups.notify_changed(info.group, None)
    return Reply(ResponseCode.SUCCESS, remark="")


async def unregister_client(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(UnregisterHeader, request.ext_fields)
    note.group = header.consumer_group or header.producer_group
    session.client_id = session.client_id or header.client_id
    if header.consumer_group is not None:
        await _leave(session, header.consumer_group, header.client_id)
    if header.producer_group is not None and header.producer_group in session.producer_groups:
        session.producer_groups.discard(header.producer_group)
        if session.ctx.groups.leave_producer(header.producer_group, session.conn):
            session.broker.announce_producer(header.producer_group, present=False)
    return Reply(ResponseCode.SUCCESS)


async def _leave(session: RemotingSession, group: str, client_id: str) -> None:
    """Remove ``client_id`` from ``group`` and tell the group's other connections."""
    session.ctx.groups.leave(group, client_id, session.conn)
    session.memberships.discard((group, client_id))
    if await session.broker.unregister_consumer(group, client_id):
        session.ctx.groups.notify_changed(group, session.conn)


async def get_consumer_list(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    group = Fields(request.ext_fields).text("consumerGroup")
    note.group = group
    ids = await session.broker.consumer_ids(group)
    if not ids:
        return Reply(ResponseCode.SYSTEM_ERROR, remark=f"no consumer for this group, {group[:255]}")
    return Reply(ResponseCode.SUCCESS, body=orjson.dumps({"consumerIdList": ids}))


async def check_client_config(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    """CHECK_CLIENT_CONFIG (46): Java consumers ask it at start for non-TAG subscriptions. SQL92 must
    compile (as at a Java broker with ``enablePropertyFilter``); other types are refused, both with
    SUBSCRIPTION_PARSE_FAILED."""
    try:
        data = orjson.loads(request.body) if request.body else {}
    except orjson.JSONDecodeError:
        raise RequestError(ResponseCode.INVALID_PARAMETER, "client config body is not JSON") from None
    if not isinstance(data, dict):
        raise RequestError(ResponseCode.INVALID_PARAMETER, "client config body is not a JSON object")
    group = data.get("group")
    note.group = group if isinstance(group, str) else None
    subscription = data.get("subscriptionData")
    kind = subscription.get("expressionType") if isinstance(subscription, dict) else None
    if kind is None or str(kind).upper() == "TAG":
        return Reply(ResponseCode.SUCCESS)
    if str(kind).upper() != "SQL92":
        raise RequestError(
            ResponseCode.SUBSCRIPTION_PARSE_FAILED,
            f"expression type {str(kind)[:32]!r} is not supported, only TAG and SQL92",
        )
    assert isinstance(subscription, dict)
    try:
        compile_sql92(str(subscription.get("subString") or ""))
    except Sql92Error as exc:
        raise RequestError(
            ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"Invalid MessageSelector. {exc}"[:512]
        ) from None
    return Reply(ResponseCode.SUCCESS)

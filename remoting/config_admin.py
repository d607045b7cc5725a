"""
mqproxy.remoting.config_admin
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The admin requests that set consumer-group metadata (what ``mqadmin updateSubGroup -b`` /
``deleteSubGroup -b`` send to a broker), kept by the broker facade's group configs
(UPDATE_AND_CREATE_TOPIC, which also sets a topic's message type, is in :mod:`.topic_admin`):

* UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): body = RocketMQ's ``SubscriptionGroupConfig`` as JSON
  (``groupName``, ``consumeMessageOrderly``, ``retryMaxTimes``; other keys ignored).
* DELETE_SUBSCRIPTIONGROUP (207): header ``groupName``; SUBSCRIPTION_GROUP_NOT_EXIST when it has no config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.types import GroupConfig
from mqproxy.model.errors import IllegalTopic
from mqproxy.model.topics import (
    validate_topic,
)
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import Fields
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

__all__ = ["delete_subscription_group", "update_and_create_subscription_group"]


def _group_config(body: bytes) -> GroupConfig:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise RequestError(ResponseCode.INVALID_PARAMETER, "body is not a SubscriptionGroupConfig") from None
    name = raw.get("groupName") if isinstance(raw, dict) else None
    if not isinstance(name, str) or not name:
        raise RequestError(ResponseCode.INVALID_PARAMETER, "SubscriptionGroupConfig has no groupName")
    try:
        validate_topic(name)  # groups follow the topic character rules
    except IllegalTopic:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"illegal group name {name[:64]!r}") from None
    retry_max_times = raw.get("retryMaxTimes", 16)
    if not isinstance(retry_max_times, int) or not 0 <= retry_max_times <= 1000:
        raise RequestError(
            ResponseCode.INVALID_PARAMETER, f"retryMaxTimes {retry_max_times!r} outside 0..1000"
        )
    return GroupConfig(
        name=name,
        consume_orderly=bool(raw.get("consumeMessageOrderly", False)),
        retry_max_times=retry_max_times,
    )


async def update_and_create_subscription_group(
    session: RemotingSession, request: RemotingCommand, note: Note
) -> Reply:
    config = _group_config(request.body)
    note.group = config.name
    await session.broker.put_group_config(config)
    return Reply(ResponseCode.SUCCESS)


async def delete_subscription_group(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    name = Fields(request.ext_fields).text("groupName")
    note.group = name
    if not await session.broker.delete_group_config(name):
        raise RequestError(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group {name} does not exist"
        )
    return Reply(ResponseCode.SUCCESS)

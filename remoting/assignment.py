"""
mqproxy.remoting.assignment
~~~~~~~~~~~~~~~~~~~~~~~~~~~

Server-side rebalancing (:meth:`~mqproxy.facade.api.Membership.query_assignment`) over remoting.

* SET_MESSAGE_REQUEST_MODE (401, ``mqadmin setConsumeMode``): body ``{"topic", "consumerGroup", "mode":
  "PULL"|"POP", "popShareQueueNum"}``. A retry topic is NO_PERMISSION "retry topic is not allowed to set
  mode", an unknown topic TOPIC_NOT_EXIST "topic[<t>] not exist", as at a Java broker.
* QUERY_ASSIGNMENT (400, a 5.x push consumer with ``clientRebalance=false``): body ``{"topic",
  "consumerGroup", "clientId", "strategyName", "messageModel"}``; answers ``{"messageQueueAssignments":
  [{"messageQueue": {...}, "mode": ...}]}``, or no list (the client keeps what it has) for an unknown
  topic or strategy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.types import RequestMode
from mqproxy.model.topics import RETRY_PREFIX
from mqproxy.remoting.context import BROKER_NAME
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

_MODES = ("PULL", "POP")


def _body(request: RemotingCommand, what: str) -> dict[str, Any]:
    try:
        data = orjson.loads(request.body) if request.body else None
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"{what} body is not a JSON object")
    return data


def _text(data: dict[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"{what} body lacks {key!r}")
    return value


async def set_message_request_mode(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    data = _body(request, "request mode")
    topic, group = _text(data, "topic", "request mode"), _text(data, "consumerGroup", "request mode")
    note.topic, note.group = topic, group
    mode = str(data.get("mode") or "").upper()
    if mode not in _MODES:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"mode {mode[:16]!r} is not PULL or POP")
    share = data.get("popShareQueueNum", 0)
    if isinstance(share, bool) or not isinstance(share, int):
        raise RequestError(ResponseCode.INVALID_PARAMETER, "popShareQueueNum is not an integer")
    if topic.startswith(RETRY_PREFIX):
        raise RequestError(ResponseCode.NO_PERMISSION, "retry topic is not allowed to set mode")
    if await session.broker.get_topic(topic) is None:
        raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    await session.broker.set_request_mode(topic, group, RequestMode(mode, share))
    return Reply(ResponseCode.SUCCESS)


async def query_assignment(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    data = _body(request, "assignment query")
    topic, group = _text(data, "topic", "assignment query"), _text(data, "consumerGroup", "assignment query")
    client_id = _text(data, "clientId", "assignment query")
    note.topic, note.group = topic, group
    assigned = await session.broker.query_assignment(
        topic,
        group,
        client_id,
        strategy=str(data.get("strategyName") or ""),
        broadcasting=str(data.get("messageModel") or "") == "BROADCASTING",
    )
    if assigned is None:
        return Reply(ResponseCode.SUCCESS, body=b"{}")
    assignments = [
        {
            "messageQueue": {"brokerName": BROKER_NAME, "queueId": q, "topic": topic},
            "mode": assigned.mode.mode,
        }
        for q in assigned.queue_ids
    ]
    return Reply(ResponseCode.SUCCESS, body=orjson.dumps({"messageQueueAssignments": assignments}))

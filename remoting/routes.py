"""
mqproxy.remoting.routes
~~~~~~~~~~~~~~~~~~~~~~~

GET_ROUTEINFO_BY_TOPIC (105): the proxy answers as the name server. The route names one broker,
``broker-a`` in ``DefaultCluster``, whose every ``brokerAddrs`` entry is this proxy's advertised address
(spec §8.3), so clients send all broker traffic back here. Map keys are quoted (standard JSON, which
every known client parses, spec §5.2).

Unknown topics: auto-created when the server allows it (``%RETRY%``/``%DLQ%`` with one queue), else
TOPIC_NOT_EXIST (17) with the name server's remark, which makes producers fall back to ``TBW102``.
A consumer group's ``%RETRY%<group>`` route is always served (consumers ask it before heartbeating).
``TBW102`` always has a route (perm 7: read, write, inherit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.model.errors import IllegalTopic
from mqproxy.model.topics import AUTO_CREATE_TEMPLATE_TOPIC, RETRY_PREFIX, validate_topic
from mqproxy.model.types import PERM_INHERIT, PERM_READ, PERM_WRITE, TopicConfig
from mqproxy.remoting.context import BROKER_NAME, CLUSTER_NAME
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import Fields
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession


def route_body(config: TopicConfig, address: str, *, perm: int | None = None) -> bytes:
    """TopicRouteData JSON for one topic served by this proxy at ``address``."""
    route = {
        "brokerDatas": [
            {
                "brokerAddrs": {"0": address},
                "brokerName": BROKER_NAME,
                "cluster": CLUSTER_NAME,
                "enableActingMaster": False,
            }
        ],
        "filterServerTable": {},
        "queueDatas": [
            {
                "brokerName": BROKER_NAME,
                "perm": config.perm if perm is None else perm,
                "readQueueNums": config.read_queues,
                "topicSysFlag": config.sys_flag,
                "writeQueueNums": config.write_queues,
            }
        ],
    }
    return orjson.dumps(route)


def _not_found(topic: str) -> RequestError:
    return RequestError(
        ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic[:255]}"
    )


async def get_route(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    topic = Fields(request.ext_fields).text("topic")
    note.topic = topic
    try:
        validate_topic(topic)
    except IllegalTopic:
        raise _not_found(topic) from None
    broker, ctx = session.broker, session.ctx
    config = await broker.get_topic(topic)
    perm = None
    if topic == AUTO_CREATE_TEMPLATE_TOPIC:
        if config is None:
            config = await broker.create_topic(topic, ctx.default_queue_count)
        perm = PERM_READ | PERM_WRITE | PERM_INHERIT
    elif config is None:
        # a group's retry topic always exists for its consumers (the broker creates it per group)
        if not (ctx.auto_create_topics or topic.startswith(RETRY_PREFIX)):
            raise _not_found(topic)
        config = await broker.create_topic(topic, None)
    return Reply(ResponseCode.SUCCESS, body=route_body(config, ctx.advertised_address, perm=perm))

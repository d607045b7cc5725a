"""
mqproxy.remoting.topic_admin
~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Topic and cluster administration as ``mqadmin`` and the clients' admin APIs use it: the proxy answers
both the name-server half and the broker half.

* UPDATE_AND_CREATE_TOPIC (17), broker: header ``topic``, ``readQueueNums``, ``writeQueueNums``,
  ``perm``, optional ``topicSysFlag`` and ``attributes`` (``+message.type=FIFO``, …; ``defaultTopic``,
  ``topicFilterType``, ``order`` are accepted and not kept). Creates the topic or replaces its config, and
  types it: the attribute's type, else the type it had, else NORMAL. Refusals as the Java broker's
  (``TopicValidator``): INVALID_PARAMETER with its remark for a blank, illegal or too long name, and for
  a system topic ("conflict with system topic").
* GET_TOPIC_CONFIG (351), broker: the topic's TopicConfig (``mqadmin consumerProgress`` reads it), or
  TOPIC_NOT_EXIST "No topic in this broker. topic: <t>".
* GET_BROKER_CLUSTER_INFO (106), name server: ClusterInfo of the one logical broker (every address is
  the proxy's own, as in routes).
* GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206), name server: TopicList ``{"topicList": [...]}`` of every
  topic, plus the cluster and broker names the Java name server lists as topics too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import orjson

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.types import TopicMessageType, parse_topic_attributes
from mqproxy.model.topics import MAX_RETRY_TOPIC_BYTES, MAX_TOPIC_BYTES, SYSTEM_TOPIC_PREFIX, is_retry_or_dlq
from mqproxy.model.types import TopicConfig
from mqproxy.remoting.context import BROKER_NAME, CLUSTER_NAME
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import Fields
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

#: RocketMQ ``TopicValidator``'s system topics (besides the ``rmq_sys_`` prefix).
SYSTEM_TOPICS: Final = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "CHECKPOINT_TOPIC",
        CLUSTER_NAME,
        BROKER_NAME,
    }
)
_LEGAL: Final = frozenset("%|-_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def topic_problem(topic: str) -> str | None:
    """The Java ``TopicValidator.validateTopic`` remark for an invalid name, or None."""
    if not topic.strip():
        return "The specified topic is blank."
    if not set(topic) <= _LEGAL:
        return f"The specified topic: {topic}, contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    if is_retry_or_dlq(topic):
        if len(topic) > MAX_RETRY_TOPIC_BYTES:
            return (
                f"The specified topic is DLQ or Retry topic: {topic}, and it's longer than topic max "
                f"length: {MAX_RETRY_TOPIC_BYTES}"
            )
    elif len(topic) > MAX_TOPIC_BYTES:
        return f"The specified topic: {topic}, is longer than topic max length: {MAX_TOPIC_BYTES}"
    return None


async def update_and_create_topic(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    fields = Fields(request.ext_fields)
    topic = fields.text("topic")
    note.topic = topic
    problem = topic_problem(topic)
    if problem is None and is_system_topic(topic):
        problem = f"The topic[{topic}] is conflict with system topic."
    if problem is not None:
        raise RequestError(ResponseCode.INVALID_PARAMETER, problem[:512])
    config = TopicConfig(
        topic,
        read_queues=fields.integer("readQueueNums"),
        write_queues=fields.integer("writeQueueNums"),
        perm=fields.integer("perm"),
        sys_flag=fields.integer("topicSysFlag", 0),
    )
    message_type = parse_topic_attributes(fields.text("attributes", ""))  # InvalidArgument: nothing changes
    await session.broker.update_topic(config)
    if message_type is None:  # the topic's message type: the attribute's, else the one it had, else NORMAL
        message_type = session.broker.topic_type(topic) or TopicMessageType.NORMAL
    await session.broker.set_topic_type(topic, message_type)
    return Reply(ResponseCode.SUCCESS)


async def get_topic_config(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    topic = Fields(request.ext_fields).text("topic")
    note.topic = topic
    config = await session.broker.get_topic(topic)
    if config is None:
        raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}"[:512])
    body = {  # TopicConfigAndQueueMapping: a TopicConfig (no static-topic mapping here)
        "attributes": {},
        "order": False,
        "perm": config.perm,
        "readQueueNums": config.read_queues,
        "topicFilterType": "SINGLE_TAG",
        "topicName": config.name,
        "topicSysFlag": config.sys_flag,
        "writeQueueNums": config.write_queues,
    }
    return Reply(ResponseCode.SUCCESS, body=orjson.dumps(body))


def broker_data(address: str) -> dict[str, object]:
    """The BrokerData of the one logical broker (as in routes)."""
    return {
        "brokerAddrs": {"0": address},
        "brokerName": BROKER_NAME,
        "cluster": CLUSTER_NAME,
        "enableActingMaster": False,
    }


async def get_broker_cluster_info(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    body = {
        "brokerAddrTable": {BROKER_NAME: broker_data(session.ctx.advertised_address)},
        "clusterAddrTable": {CLUSTER_NAME: [BROKER_NAME]},
    }
    return Reply(ResponseCode.SUCCESS, body=orjson.dumps(body))


async def get_all_topic_list(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    names = set(await session.broker.topic_names())
    names.update((CLUSTER_NAME, BROKER_NAME))
    return Reply(ResponseCode.SUCCESS, body=orjson.dumps({"topicList": sorted(names)}))

"""
mqproxy.grpc_service.resources
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

:class:`Resources`: how the RPC handlers name and find what a request points at, over the broker facade.
Topic and group names are validated (ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP) and recorded on the
:class:`~.call.Call` for the request log; a topic is looked up (auto-created when allowed, else
TOPIC_NOT_FOUND); a queue must exist on its topic; filter expressions are tags only
(ILLEGAL_FILTER_EXPRESSION for SQL92).
"""

from __future__ import annotations

from typing import Any

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.facade.api import BrokerFacade
from mqproxy.grpc_service.call import Call
from mqproxy.grpc_service.errors import ApiError
from mqproxy.grpc_service.telemetry import ClientRegistry, ServerSettings
from mqproxy.model.errors import IllegalTopic
from mqproxy.model.topics import validate_topic
from mqproxy.model.types import FilterExpression, TopicConfig

__all__ = ["Resources"]


class Resources:
    """What every handler group shares: the facade, the server's settings and the registry of live
    clients (``auto_create_topics``: QueryRoute and SendMessage create a missing topic)."""

    def __init__(
        self,
        broker: BrokerFacade,
        *,
        auto_create_topics: bool = True,
        server_settings: ServerSettings | None = None,
        clients: ClientRegistry | None = None,
    ) -> None:
        self.broker = broker
        self.auto_create_topics = auto_create_topics
        self.server_settings = server_settings or ServerSettings()
        self.clients = clients or ClientRegistry()

    @staticmethod
    def topic_name(call: Call, resource: Any) -> str:
        name = resource.name
        call.topic = name
        try:
            validate_topic(name)
        except IllegalTopic as exc:
            raise ApiError(pb.Code.ILLEGAL_TOPIC, str(exc)) from None
        return name

    @staticmethod
    def group_name(call: Call, resource: Any) -> str:
        name = resource.name
        call.group = name or None
        if not name:
            raise ApiError(pb.Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        try:
            validate_topic(name)  # same character rules and length limit as topics
        except IllegalTopic:
            raise ApiError(pb.Code.ILLEGAL_CONSUMER_GROUP, f"illegal consumer group {name[:64]!r}") from None
        return name

    @staticmethod
    def message_filter(expression: Any) -> FilterExpression:
        if expression.type == pb.FilterType.SQL:
            raise ApiError(pb.Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported")
        return FilterExpression(expression.expression or "*")

    async def topic(self, topic: str, *, create: bool) -> TopicConfig:
        config = await self.broker.get_topic(topic)
        if config is None and create and self.auto_create_topics:
            config = await self.broker.create_topic(topic, None)
        if config is None:
            raise ApiError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        return config

    async def queue(self, call: Call, mq: Any) -> tuple[str, int]:
        """The topic and id of an existing queue a ``MessageQueue`` names."""
        topic = self.topic_name(call, mq.topic)
        config = await self.topic(topic, create=False)
        if not 0 <= mq.id < max(config.read_queues, config.write_queues):
            raise ApiError(pb.Code.BAD_REQUEST, f"topic {topic} has no queue {mq.id}")
        return topic, mq.id

    def is_fifo_group(self, group: str) -> bool:
        """The group's config says ``consumeMessageOrderly``."""
        config = self.broker.group_config(group)
        return config is not None and config.consume_orderly

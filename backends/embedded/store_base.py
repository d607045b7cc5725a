"""What every :class:`~mqproxy.backends.embedded.store.MessageStore` of this package shares: the topic
table, consumer-group membership, ``send`` as a one-message ``send_batch``, and ``pull`` (range checks
and the result) over the store's own scan of a queue, or its records as a remoting pull body.

A store subclasses :class:`StoreBase`, fills ``_topics`` / ``_consumers`` in its ``__init__`` and
overrides the hooks: :meth:`StoreBase._check_open` (raise once the store is closed),
:meth:`StoreBase._persist_topic` (make a created or updated topic config durable before it is used) and
:meth:`StoreBase._pull_source` (a readable queue's bounds and how to scan it) and, optionally,
:meth:`StoreBase._wire_source` (the same, as remoting pull records).
"""

from __future__ import annotations

from collections.abc import Sequence

from mqproxy.backends.embedded.groups import ConsumerRegistry
from mqproxy.backends.embedded.pulls import PullScan, WireScan, read_pull, read_wire_pull
from mqproxy.model.errors import TopicNotFound
from mqproxy.model.topics import TopicTable
from mqproxy.model.types import ConsumerInfo, Message, PullResult, SendResult, TagFilter, TopicConfig


class StoreBase:
    """Topic metadata and consumer-group membership over ``_topics`` and ``_consumers``."""

    _topics: TopicTable
    _consumers: ConsumerRegistry

    # --- hooks ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        """Raise :class:`~mqproxy.model.errors.StoreUnavailable` if the store is closed (default: never)."""

    def _persist_topic(self, config: TopicConfig) -> None:
        """Make ``config`` durable; called before the topic table holds it (default: memory only)."""

    def _pull_source(self, topic: str, queue_id: int) -> tuple[int, int, PullScan]:
        """(min offset, max offset, scan) of a readable queue; raises as :meth:`pull` does."""
        raise NotImplementedError

    def _wire_source(self, topic: str, queue_id: int) -> tuple[WireScan, int, int] | None:
        """(scan, min offset, max offset) reading a readable queue as remoting pull records, or None
        where the store does not offer that (default); raises as :meth:`pull` does."""
        return None

    # --- produce -------------------------------------------------------------------------------
    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        raise NotImplementedError

    async def send(self, message: Message) -> SendResult:
        return (await self.send_batch([message]))[0]

    # --- consume -------------------------------------------------------------------------------
    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        tag_filter: TagFilter | None = None,
        max_bytes: int = 4 * 1024 * 1024,
        wire: bool = False,
    ) -> PullResult:
        if wire and tag_filter is None:
            source = self._wire_source(topic, queue_id)
            wired = None if source is None else read_wire_pull(*source, offset, max_count, max_bytes)
            if wired is not None:
                return wired
        min_offset, max_offset, scan = self._pull_source(topic, queue_id)
        return read_pull(scan, min_offset, max_offset, offset, max_count, tag_filter, max_bytes)

    def pull_now(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult:
        """:meth:`pull` without a filter as a plain call (a read never waits): for a caller running inside
        the store's notify of a write, e.g. a watch callback (the MQTT push hubs' hand-off). Same answers
        and errors."""
        min_offset, max_offset, scan = self._pull_source(topic, queue_id)
        return read_pull(scan, min_offset, max_offset, offset, max_count, None, 4 * 1024 * 1024)

    # --- metadata ------------------------------------------------------------------------------
    async def get_topic(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        self._check_open()
        return self._create(topic, queue_count)

    async def update_topic(self, config: TopicConfig) -> TopicConfig:
        self._check_open()
        planned = self._topics.plan_update(config)
        self._persist_topic(planned)
        self._topics.load(planned)
        return planned

    async def topic_names(self) -> list[str]:
        return self._topics.names()

    def _create(self, topic: str, queue_count: int | None) -> TopicConfig:
        planned = self._topics.plan_create(topic, queue_count)
        if planned is None:
            return self._topics.require(topic)
        self._persist_topic(planned)
        self._topics.load(planned)
        return planned

    def _config_for_send(self, topic: str) -> TopicConfig:
        config = self._topics.get(topic)
        if config is not None:
            return config
        if not self._topics.auto_create:
            raise TopicNotFound(topic)
        return self._create(topic, None)

    # --- consumer groups -----------------------------------------------------------------------
    async def register_consumer(self, info: ConsumerInfo) -> bool:
        return self._consumers.register(info)

    async def unregister_consumer(self, group: str, client_id: str) -> bool:
        return self._consumers.unregister(group, client_id)

    async def consumer_ids(self, group: str) -> list[str]:
        return self._consumers.ids(group)

    async def consumer_groups(self) -> list[str]:
        return self._consumers.groups()

    async def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None:
        return self._consumers.info(group, client_id)

"""
mqproxy.backends.embedded.broker
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

:class:`EmbeddedBroker`: the :class:`~mqproxy.facade.BrokerFacade` over one
:class:`~mqproxy.backends.embedded.store.MessageStore` and the broker services that run on it (delays,
retry and dead letters, transactions with check-back, pop, queue locks, group and topic metadata, consume
modes). Every decision a broker makes is made here, once, for every protocol: half messages, delay parking,
retry-topic sends past their limit going to the dead-letter topic, topic auto-creation, long polling.

Open it with :func:`open_embedded_broker`; its background tasks (delivery of due messages, revive,
transaction check-back) run until the block exits.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Container, Iterable, Sequence
from contextlib import asynccontextmanager

import trio

from mqproxy.backends.embedded.assignment import assign, effective_mode
from mqproxy.backends.embedded.filters import compile_filter, select
from mqproxy.backends.embedded.retry import DEFAULT_MAX_RECONSUME_TIMES
from mqproxy.backends.embedded.schedule import recall_handle
from mqproxy.backends.embedded.services import BrokerServices, ServiceSettings, is_transactional
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.api import (
    EndTransaction,
    LmqDispatch,
    MessageQuery,
    PopRequest,
    PullRequest,
    QueueAssignment,
    QueueSpan,
    SendOutcome,
    SendRequest,
)
from mqproxy.facade.types import (
    AckOutcome,
    CheckBack,
    GroupConfig,
    QueueRef,
    RequestMode,
    SendBackResult,
    TopicMessageType,
    TransactionCheck,
)
from mqproxy.model.errors import BackendError, BadFilter, QueueNotFound, TopicNotFound
from mqproxy.model.properties import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TIMER_DELIVER_MS,
    PROXY_BROKER_NAME,
    SCHEDULE_TOPIC,
)
from mqproxy.model.receipts import PopResult
from mqproxy.model.sql92 import Sql92Filter
from mqproxy.model.topics import DLQ_PREFIX, RETRY_PREFIX, is_lmq
from mqproxy.model.types import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_UNIQ_KEY,
    ConsumerInfo,
    ConsumerOffset,
    FilterExpression,
    Message,
    PullResult,
    PullStatus,
    SendResult,
    StoredMessage,
    TagFilter,
    TopicConfig,
)
from mqproxy.runtime.tasks import running

__all__ = ["EmbeddedBroker", "open_embedded_broker"]


class EmbeddedBroker:
    """The broker facade of one process: a store and the services over it (see the module docstring)."""

    def __init__(
        self,
        store: MessageStore,
        services: BrokerServices,
        *,
        auto_create_topics: bool = True,
        default_queue_count: int = 4,
        broker_name: str = PROXY_BROKER_NAME,
    ) -> None:
        self.store = store
        self.services = services
        self.auto_create_topics = auto_create_topics
        self.default_queue_count = default_queue_count
        self.broker_name = broker_name
        self._check_backs: list[CheckBack] = []
        self._lmq_dispatch: LmqDispatch | None = None
        self._rng = random.Random()
        services.transactions.check_back = self._check_back

    # --- lifecycle and figures ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover the services' state and run their background tasks until cancelled."""
        await self.services.run(task_status=task_status)

    @property
    def max_reconsume_times(self) -> int:
        return self.services.settings.max_reconsume_times

    def unresolved_transactions(self) -> int:
        return self.services.transactions.unresolved

    def pops_in_flight(self) -> int:
        return self.services.pop.in_flight

    # --- producing ------------------------------------------------------------------------------

    def add_check_back(self, sender: CheckBack) -> None:
        self._check_backs.append(sender)

    async def _check_back(self, check: TransactionCheck) -> bool:
        for sender in self._check_backs:
            if await sender(check):
                return True
        return False

    def announce_producer(self, group: str, present: bool = True) -> None:
        """Check-backs find producers through :meth:`add_check_back`; nothing to register here."""

    def watch_groups(self, listener: Callable[[str], None]) -> None:
        """Every member is on this process: there is nothing to watch (see the facade contract)."""

    def set_lmq_dispatch(self, dispatch: LmqDispatch) -> None:
        self._lmq_dispatch = dispatch

    def clamp_delay_level(self, level: int) -> int:
        return self.services.scheduler.clamp_level(level) if level > 0 else 0

    async def send(self, request: SendRequest) -> SendOutcome:
        message = request.message
        half = is_transactional(message)
        if half and request.producer_group:
            message.properties.setdefault(PROPERTY_PRODUCER_GROUP, request.producer_group)
        if message.topic.startswith(RETRY_PREFIX):
            limit = request.max_reconsume_times
            if limit is None:
                limit = DEFAULT_MAX_RECONSUME_TIMES
            if message.reconsume_times > limit:  # spent: straight to the dead-letter topic, undelayed
                message.topic = DLQ_PREFIX + message.topic[len(RETRY_PREFIX) :]
                message.queue_id = 0
                message.properties.pop(PROPERTY_DELAY_LEVEL, None)
                await self.store.create_topic(message.topic, 1)
        elif request.create_queues is not None and self.auto_create_topics:
            if await self.store.get_topic(message.topic) is None:
                count = min(max(request.create_queues, 1), self.default_queue_count)
                await self.store.create_topic(message.topic, count)
        self._dispatch_lmqs(message)
        parked = "half" if half else ("delay" if self.services.scheduler.park(message) is not None else "")
        if parked:
            message.queue_id = await self._delivery_queue(message.topic, message.queue_id)
        result = await self.services.send(message)
        level = 0
        if parked == "delay":
            raw = message.properties.get(PROPERTY_DELAY_LEVEL, "").strip()
            level = self.clamp_delay_level(int(raw)) if raw.lstrip("-").isdigit() else 0
        handle = ""
        deliver_at = message.properties.get(PROPERTY_TIMER_DELIVER_MS, "")
        uniq = message.properties.get(PROPERTY_UNIQ_KEY, "")
        if result.topic == SCHEDULE_TOPIC and deliver_at.isdigit() and uniq:
            handle = recall_handle(message.topic, uniq, int(deliver_at), broker_name=self.broker_name)
        queue_id = message.queue_id if parked else result.queue_id
        return SendOutcome(result, message.topic, queue_id, parked, level, handle)

    async def _delivery_queue(self, topic: str, queue_id: int) -> int:
        """The queue a parked (delayed or half) message will reach, checked now since it is stored
        elsewhere first; a negative id picks one at random, as the broker does before storing."""
        config = await self.store.get_topic(topic)
        if config is None:
            raise TopicNotFound(f"topic {topic} does not exist")
        if queue_id >= config.write_queues:
            raise QueueNotFound(f"{topic} has {config.write_queues} write queues, not {queue_id + 1}")
        return queue_id if queue_id >= 0 else self._rng.randrange(max(config.write_queues, 1))

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        for message in messages:
            self._dispatch_lmqs(message)
        return await self.store.send_batch(messages)

    def _dispatch_lmqs(self, message: Message) -> None:
        """Name the light queues of a message that names none (the installed :data:`LmqDispatch`)."""
        if not message.dispatch and self._lmq_dispatch is not None:
            if PROPERTY_INNER_MULTI_DISPATCH not in message.properties:
                message.dispatch = self._lmq_dispatch(message.properties)

    async def end_transaction(self, end: EndTransaction) -> SendResult | None:
        return await self.services.transactions.end(
            resolution=end.resolution,
            producer_group=end.producer_group,
            commitlog_offset=end.commitlog_offset,
            transaction_id=end.transaction_id or None,
            from_check=end.from_check,
        )

    async def recall(self, topic: str, handle: str) -> str:
        return await self.services.scheduler.recall(topic, handle)

    # --- consuming ------------------------------------------------------------------------------

    async def pull(self, request: PullRequest) -> PullResult:
        compiled = compile_filter(request.message_filter)
        tags = compiled if isinstance(compiled, TagFilter) else None
        sql = compiled if isinstance(compiled, Sql92Filter) else None
        if request.commit_offset >= 0:
            await self.store.commit_consumer_offset(
                request.group, request.topic, request.queue_id, request.commit_offset
            )
        deadline = trio.current_time() + max(request.hold_s, 0.0)
        offset = request.offset
        woke = False
        while True:
            result = await self.store.pull(
                request.topic, request.queue_id, offset, request.max_count,
                tag_filter=tags, max_bytes=request.max_bytes, wire=request.wire and sql is None,
            )  # fmt: skip
            if sql is not None:
                result = select(result, sql)
            if result.status in (PullStatus.FOUND, PullStatus.OFFSET_ILLEGAL):
                return result
            if result.status is PullStatus.NO_MATCHED_MSG:
                offset = result.next_offset
                if offset < result.max_offset:  # scan limit reached: let the client come straight back
                    return result
            elif woke:  # woken but still nothing new: do not spin
                return result
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                return result
            woke = await self.store.wait_for_message(request.topic, request.queue_id, offset, remaining)
            if not woke:
                return result

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        return await self.store.wait_for_message(topic, queue_id, offset, timeout_s)

    def watch_queue(
        self, topic: str, queue_id: int, offset: int, callback: Callable[[], None]
    ) -> bool | None:
        """``wait_for_message`` without a task, when the store has it (see
        :meth:`EmbeddedReading.watch_queue`): True if ``callback`` will be called once, False if a
        message is there already, None if the store cannot watch (the caller long-polls)."""
        watch = getattr(self.store, "watch_queue", None)
        return None if watch is None else bool(watch(topic, queue_id, offset, callback))

    def unwatch_queue(self, topic: str, queue_id: int, callback: Callable[[], None]) -> None:
        unwatch = getattr(self.store, "unwatch_queue", None)
        if unwatch is not None:
            unwatch(topic, queue_id, callback)

    def pull_queue_now(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult | None:
        """The store's ``pull_now`` (a pull without a filter as a plain call); None if it has none."""
        pull_now = getattr(self.store, "pull_now", None)
        return None if pull_now is None else pull_now(topic, queue_id, offset, max_count)  # type: ignore[no-any-return]

    async def get_message(self, commitlog_offset: int, *, topic: str = "") -> StoredMessage | None:
        return await self.store.get_message(commitlog_offset)

    async def query_messages(self, query: MessageQuery) -> list[StoredMessage]:
        return await self.store.query_messages(
            query.topic, query.key, query.max_count, query.begin_ms, query.end_ms
        )

    async def send_back(
        self,
        group: str,
        message: StoredMessage,
        *,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        origin_msg_id: str = "",
    ) -> SendBackResult:
        return await self.services.retry.send_back(
            group,
            message,
            delay_level=delay_level,
            max_reconsume_times=max_reconsume_times,
            origin_msg_id=origin_msg_id or None,
        )

    async def dead_letter(self, group: str, message: StoredMessage, *, origin_msg_id: str = "") -> SendResult:
        """Move ``message`` to the group's dead-letter topic now."""
        return await self.services.retry.dead_letter(group, message, origin_msg_id=origin_msg_id or None)

    # --- popping --------------------------------------------------------------------------------

    async def pop(self, request: PopRequest) -> PopResult:
        compiled = compile_filter(request.message_filter)
        if isinstance(compiled, Sql92Filter):
            raise BadFilter("SQL92 filters are not supported for pop consumption")
        return await self.services.pop.pop(
            request.group,
            request.topic,
            request.queue_id,
            request.max_count,
            request.invisible_ms,
            tag_filter=compiled,
            order=request.order,
            init_mode=request.init_mode,
            poll_s=request.hold_s,
            broker_name=self.broker_name,
        )

    async def ack(self, group: str, topic: str, receipt: str) -> AckOutcome:
        return await self.services.pop.ack(group, topic, receipt)

    async def ack_many(
        self, group: str, topic: str, receipts: Sequence[str]
    ) -> list[AckOutcome | BackendError]:
        return await self.services.pop.ack_many(group, topic, receipts)

    async def change_invisible(self, group: str, topic: str, receipt: str, invisible_ms: int) -> str:
        return (await self.services.pop.change_invisible(group, topic, receipt, invisible_ms)).encode()

    async def forward_to_dlq(self, group: str, topic: str, receipt: str) -> SendResult:
        return await self.services.pop.forward_to_dlq(group, topic, receipt)

    async def peek(
        self,
        group: str,
        topic: str,
        queue_id: int | None,
        max_count: int,
        *,
        message_filter: FilterExpression | None = None,
    ) -> list[StoredMessage]:
        compiled = compile_filter(message_filter)
        if isinstance(compiled, Sql92Filter):
            raise BadFilter("SQL92 filters are not supported for peek")
        return await self.services.pop.peek(group, topic, queue_id, max_count, tag_filter=compiled)

    async def has_message(self, group: str, topic: str, queue_id: int | None) -> bool:
        return await self.services.pop.has_message(group, topic, queue_id)

    # --- offsets --------------------------------------------------------------------------------

    async def span(self, topic: str, queue_id: int) -> QueueSpan:
        return QueueSpan(
            await self.store.min_offset(topic, queue_id), await self.store.max_offset(topic, queue_id)
        )

    async def min_offset(self, topic: str, queue_id: int) -> int:
        return await self.store.min_offset(topic, queue_id)

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return await self.store.max_offset(topic, queue_id)

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await self.store.search_offset(topic, queue_id, timestamp_ms)

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        return await self.store.earliest_store_time(topic, queue_id)

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return await self.store.query_consumer_offset(group, topic, queue_id)

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        await self.store.commit_consumer_offset(group, topic, queue_id, offset)

    async def consumer_offsets(self) -> list[ConsumerOffset]:
        return await self.store.consumer_offsets()

    # --- locks ----------------------------------------------------------------------------------

    async def lock_batch(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> set[QueueRef]:
        return self.services.locks.lock_batch(group, client_id, queues)

    async def unlock(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> None:
        self.services.locks.unlock(group, client_id, queues)

    async def release_client(self, group: str, client_id: str) -> int:
        return self.services.locks.release_client(group, client_id)

    async def lock_holder(self, group: str, queue: QueueRef) -> str | None:
        return self.services.locks.holder(group, queue)

    # --- membership -----------------------------------------------------------------------------

    async def register_consumer(self, info: ConsumerInfo) -> bool:
        return await self.store.register_consumer(info)

    async def unregister_consumer(self, group: str, client_id: str) -> bool:
        return await self.store.unregister_consumer(group, client_id)

    async def consumer_ids(self, group: str) -> list[str]:
        return await self.store.consumer_ids(group)

    async def consumer_groups(self) -> list[str]:
        return await self.store.consumer_groups()

    async def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None:
        return await self.store.consumer_info(group, client_id)

    async def query_assignment(
        self, topic: str, group: str, client_id: str, *, strategy: str = "", broadcasting: bool = False
    ) -> QueueAssignment | None:
        mode = effective_mode(topic, await self.services.request_modes.get(topic, group))
        if is_lmq(topic):
            queues = [0]
        else:
            config = await self.store.get_topic(topic)
            if config is None:
                return None
            queues = list(range(config.read_queues))
        if not queues:
            return None
        clients = await self.store.consumer_ids(group)
        assigned = assign(
            mode=mode,
            strategy=strategy,
            client_id=client_id,
            queues=queues,
            clients=clients,
            broadcasting=broadcasting,
        )
        return None if assigned is None else QueueAssignment(mode, tuple(assigned))

    # --- admin ----------------------------------------------------------------------------------

    async def get_topic(self, topic: str) -> TopicConfig | None:
        return await self.store.get_topic(topic)

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        return await self.store.create_topic(topic, queue_count)

    async def update_topic(self, config: TopicConfig) -> TopicConfig:
        return await self.store.update_topic(config)

    async def topic_names(self) -> list[str]:
        return await self.store.topic_names()

    def topic_type(self, topic: str) -> TopicMessageType | None:
        return self.services.metadata.topic_type(topic)

    async def set_topic_type(self, topic: str, message_type: TopicMessageType | None) -> None:
        await self.services.metadata.set_topic_type(topic, message_type)

    def group_config(self, group: str) -> GroupConfig | None:
        return self.services.metadata.group(group)

    async def put_group_config(self, config: GroupConfig) -> None:
        await self.services.metadata.put_group(config)

    async def delete_group_config(self, group: str) -> bool:
        return await self.services.metadata.delete_group(group)

    async def request_mode(self, topic: str, group: str) -> RequestMode | None:
        return await self.services.request_modes.get(topic, group)

    async def set_request_mode(self, topic: str, group: str, mode: RequestMode) -> None:
        await self.services.request_modes.set(topic, group, mode)

    # --- light queues ---------------------------------------------------------------------------

    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int:
        return await self.store.rewrite_queue(topic, queue_id, keep, below)

    async def delete_idle_lmqs(self, idle_ms: int, in_use: Container[str], limit: int = 10_000) -> list[str]:
        return await self.store.delete_idle_lmqs(idle_ms, in_use, limit)

    async def store_bytes(self) -> int:
        return await self.store.store_bytes()


@asynccontextmanager
async def open_embedded_broker(
    store: MessageStore,
    settings: ServiceSettings | None = None,
    *,
    auto_create_topics: bool = True,
    default_queue_count: int = 4,
    now_ms: object = None,
) -> AsyncIterator[EmbeddedBroker]:
    """An :class:`EmbeddedBroker` over ``store`` with its background tasks running (stopped on exit)."""
    kwargs = {} if now_ms is None else {"now_ms": now_ms}
    services = BrokerServices(store, settings, **kwargs)  # type: ignore[arg-type]
    broker = EmbeddedBroker(
        store, services, auto_create_topics=auto_create_topics, default_queue_count=default_queue_count
    )
    async with running(broker.run):
        yield broker

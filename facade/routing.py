"""
mqproxy.facade.routing
~~~~~~~~~~~~~~~~~~~~~~

:class:`RoutingFacade`: one :class:`~mqproxy.facade.api.BrokerFacade` in front of several named backends
(RocketMQ clusters and/or embedded stores), dispatching every call by topic with a
:class:`~mqproxy.facade.routing_rules.RoutingTable`.

Contracts:

* A call naming a topic goes to the backend owning it; one for a topic no rule covers (and no default)
  raises :class:`~mqproxy.model.errors.TopicUnrouted` (a ``TopicNotFound`` naming the rules) and logs
  ``backend.unrouted``.
* Consumer groups follow their topics. Each group has a *home*: the backend of the first topic it was seen
  with (heartbeat subscriptions, pulls, pops, offsets). ``%RETRY%group`` and ``%DLQ%group`` go to the
  home; a group not seen yet goes to the first backend that has the retry topic, else the default.
  Calls keyed by group only (members, locks release, group configs) go to every backend the group was
  seen on (every backend when none) and their answers are merged.
* Route look-ups (:meth:`get_topic`) are the owning backend's; the protocols still advertise the proxy
  as the one broker.
* Look-ups by commit-log offset alone (:meth:`get_message` without a topic hint, a transaction end that
  names no topic) try the backend this process remembers sending to, then the others in order: offsets
  are not unique across backends.
* Registrations (check-back senders, group watchers, LMQ dispatch) go to every backend; gauges are summed.
* Listings merged from several backends (topics, groups, members, offsets) leave out a backend that cannot
  be reached (``StoreUnavailable``) while another answers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping, Sequence
from typing import TypeVar

import structlog

from mqproxy.facade.api import (
    BrokerFacade,
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
from mqproxy.facade.routing_rules import RoutingTable
from mqproxy.facade.types import (
    AckOutcome,
    CheckBack,
    GroupConfig,
    QueueRef,
    RequestMode,
    SendBackResult,
    TopicMessageType,
)
from mqproxy.model.errors import (
    BackendError,
    StoreUnavailable,
    TopicNotFound,
    TopicUnrouted,
    TransactionNotFound,
)
from mqproxy.model.receipts import PopResult
from mqproxy.model.topics import AUTO_CREATE_TEMPLATE_TOPIC, DLQ_PREFIX, RETRY_PREFIX
from mqproxy.model.types import (
    ConsumerInfo,
    ConsumerOffset,
    FilterExpression,
    Message,
    PullResult,
    SendResult,
    StoredMessage,
    TopicConfig,
)

__all__ = ["RoutingFacade"]

_log = structlog.get_logger("mqproxy.facade.routing")
_T = TypeVar("_T")
#: Half messages remembered for their transaction end (oldest forgotten first).
_MAX_REMEMBERED_HALVES = 100_000
#: The property a retried message keeps its original topic in.
_RETRY_TOPIC = "RETRY_TOPIC"


class RoutingFacade:
    """Dispatches each call to one of ``backends`` (by name, in order) per ``table``."""

    def __init__(
        self, backends: Mapping[str, BrokerFacade], table: RoutingTable, *, described: str = ""
    ) -> None:
        """``described``: the routing as errors and events name it (default: ``table.describe()``)."""
        if not backends:
            raise ValueError("a routing facade needs at least one backend")
        self.backends = dict(backends)
        self.table = table
        self.described = described or table.describe()
        self._homes: dict[str, list[str]] = {}
        self._halves: OrderedDict[str, str] = OrderedDict()

    # --- resolution -------------------------------------------------------------------------------
    def backend_name(self, topic: str) -> str:
        """The name of the backend owning ``topic``; raises :class:`TopicUnrouted`."""
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if topic.startswith(prefix):
                homes = self._homes.get(topic[len(prefix) :])
                if homes:
                    return homes[0]
                if self.table.default:
                    return self.table.default
                break
        name = self.table.backend_for(topic)
        if name is None and topic == AUTO_CREATE_TEMPLATE_TOPIC:
            name = self._default_name()  # the template of client-side auto-creation (TBW102)
        if name is None:
            _log.warning("backend.unrouted", topic=topic, routing=self.described)
            raise TopicUnrouted(f"topic {topic!r} is not routed to any backend ({self.described})")
        return name

    def for_topic(self, topic: str) -> BrokerFacade:
        return self.backends[self.backend_name(topic)]

    def _for_group(self, group: str, topic: str) -> BrokerFacade:
        name = self.backend_name(topic)
        if not topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            homes = self._homes.setdefault(group, [])
            if name not in homes:
                homes.append(name)
        return self.backends[name]

    def _group_backends(self, group: str) -> list[BrokerFacade]:
        names = self._homes.get(group) or list(self.backends)
        return [self.backends[name] for name in names]

    def _origin_topic(self, message: StoredMessage) -> str:
        if message.topic.startswith(RETRY_PREFIX):
            return message.properties.get(_RETRY_TOPIC, message.topic)
        return message.topic

    # --- producing --------------------------------------------------------------------------------
    async def send(self, request: SendRequest) -> SendOutcome:
        name = self.backend_name(request.message.topic)
        outcome = await self.backends[name].send(request)
        if outcome.parked == "half":
            for key in (outcome.transaction_ref, f"@{outcome.result.commitlog_offset}"):
                if key != "@-1":
                    self._halves[key] = name
            while len(self._halves) > _MAX_REMEMBERED_HALVES:
                self._halves.popitem(last=False)
        return outcome

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        if not messages:
            return []
        return await self.for_topic(messages[0].topic).send_batch(messages)

    async def end_transaction(self, end: EndTransaction) -> SendResult | None:
        if end.topic:
            return await self.for_topic(end.topic).end_transaction(end)
        remembered = self._halves.get(end.transaction_id) or self._halves.get(f"@{end.commitlog_offset}")
        order = [remembered] if remembered else []
        order += [name for name in self.backends if name != remembered]
        last: BackendError | None = None
        for name in order:
            try:
                return await self.backends[name].end_transaction(end)
            except TransactionNotFound as exc:
                last = exc
        assert last is not None
        raise last

    async def recall(self, topic: str, handle: str) -> str:
        return await self.for_topic(topic).recall(topic, handle)

    def add_check_back(self, sender: CheckBack) -> None:
        for backend in self.backends.values():
            backend.add_check_back(sender)

    def announce_producer(self, group: str, present: bool = True) -> None:
        for backend in self.backends.values():
            backend.announce_producer(group, present)

    def clamp_delay_level(self, level: int) -> int:
        return self._default_or_first().clamp_delay_level(level)

    def set_lmq_dispatch(self, dispatch: LmqDispatch) -> None:
        for backend in self.backends.values():
            backend.set_lmq_dispatch(dispatch)

    def _default_or_first(self) -> BrokerFacade:
        name = self.table.default or next(iter(self.backends))
        return self.backends[name]

    # --- consuming --------------------------------------------------------------------------------
    async def pull(self, request: PullRequest) -> PullResult:
        return await self._for_group(request.group, request.topic).pull(request)

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        return await self.for_topic(topic).wait_for_message(topic, queue_id, offset, timeout_s)

    async def get_message(self, commitlog_offset: int, *, topic: str = "") -> StoredMessage | None:
        if topic:
            return await self.for_topic(topic).get_message(commitlog_offset, topic=topic)
        for backend in self.backends.values():
            found = await backend.get_message(commitlog_offset)
            if found is not None:
                return found
        return None

    async def query_messages(self, query: MessageQuery) -> list[StoredMessage]:
        return await self.for_topic(query.topic).query_messages(query)

    async def send_back(
        self,
        group: str,
        message: StoredMessage,
        *,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        origin_msg_id: str = "",
    ) -> SendBackResult:
        backend = self._for_group(group, self._origin_topic(message))
        return await backend.send_back(
            group,
            message,
            delay_level=delay_level,
            max_reconsume_times=max_reconsume_times,
            origin_msg_id=origin_msg_id,
        )

    # --- popping ----------------------------------------------------------------------------------
    async def pop(self, request: PopRequest) -> PopResult:
        return await self._for_group(request.group, request.topic).pop(request)

    async def ack(self, group: str, topic: str, receipt: str) -> AckOutcome:
        return await self._for_group(group, topic).ack(group, topic, receipt)

    async def ack_many(
        self, group: str, topic: str, receipts: Sequence[str]
    ) -> list[AckOutcome | BackendError]:
        return await self._for_group(group, topic).ack_many(group, topic, receipts)

    async def change_invisible(self, group: str, topic: str, receipt: str, invisible_ms: int) -> str:
        return await self._for_group(group, topic).change_invisible(group, topic, receipt, invisible_ms)

    async def forward_to_dlq(self, group: str, topic: str, receipt: str) -> SendResult:
        return await self._for_group(group, topic).forward_to_dlq(group, topic, receipt)

    async def peek(
        self,
        group: str,
        topic: str,
        queue_id: int | None,
        max_count: int,
        *,
        message_filter: FilterExpression | None = None,
    ) -> list[StoredMessage]:
        backend = self._for_group(group, topic)
        return await backend.peek(group, topic, queue_id, max_count, message_filter=message_filter)

    async def has_message(self, group: str, topic: str, queue_id: int | None) -> bool:
        return await self._for_group(group, topic).has_message(group, topic, queue_id)

    # --- offsets ----------------------------------------------------------------------------------
    async def span(self, topic: str, queue_id: int) -> QueueSpan:
        return await self.for_topic(topic).span(topic, queue_id)

    async def min_offset(self, topic: str, queue_id: int) -> int:
        return await self.for_topic(topic).min_offset(topic, queue_id)

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return await self.for_topic(topic).max_offset(topic, queue_id)

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await self.for_topic(topic).search_offset(topic, queue_id, timestamp_ms)

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        return await self.for_topic(topic).earliest_store_time(topic, queue_id)

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return await self._for_group(group, topic).query_consumer_offset(group, topic, queue_id)

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        await self._for_group(group, topic).commit_consumer_offset(group, topic, queue_id, offset)

    async def consumer_offsets(self) -> list[ConsumerOffset]:
        answers = await _each(self.backends.values(), lambda backend: backend.consumer_offsets())
        return [offset for answer in answers for offset in answer]

    # --- locking ----------------------------------------------------------------------------------
    def _by_backend(self, group: str, queues: Iterable[QueueRef]) -> dict[str, list[QueueRef]]:
        split: dict[str, list[QueueRef]] = {}
        for queue in queues:
            self._for_group(group, queue.topic)
            split.setdefault(self.backend_name(queue.topic), []).append(queue)
        return split

    async def lock_batch(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> set[QueueRef]:
        held: set[QueueRef] = set()
        for name, part in self._by_backend(group, queues).items():
            held |= await self.backends[name].lock_batch(group, client_id, part)
        return held

    async def unlock(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> None:
        for name, part in self._by_backend(group, queues).items():
            await self.backends[name].unlock(group, client_id, part)

    async def release_client(self, group: str, client_id: str) -> int:
        released = 0
        for backend in self._group_backends(group):
            released += await backend.release_client(group, client_id)
        return released

    async def lock_holder(self, group: str, queue: QueueRef) -> str | None:
        return await self._for_group(group, queue.topic).lock_holder(group, queue)

    # --- membership -------------------------------------------------------------------------------
    async def register_consumer(self, info: ConsumerInfo) -> bool:
        """Registered with the backend of each subscribed topic (retry topics follow the others), so a
        group whose topics live on two clusters is a member of both."""
        names: list[str] = []
        for sub in info.subscriptions:
            if not sub.topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
                self._for_group(info.group, sub.topic)
                names.append(self.backend_name(sub.topic))
        targets = dict.fromkeys(names) or dict.fromkeys(self._homes.get(info.group) or [self._default_name()])
        changed = False
        for name in targets:
            changed = await self.backends[name].register_consumer(info) or changed
        return changed

    def _default_name(self) -> str:
        return self.table.default or next(iter(self.backends))

    async def unregister_consumer(self, group: str, client_id: str) -> bool:
        changed = False
        for backend in self._group_backends(group):
            changed = await backend.unregister_consumer(group, client_id) or changed
        return changed

    async def consumer_ids(self, group: str) -> list[str]:
        answers = await _each(self._group_backends(group), lambda backend: backend.consumer_ids(group))
        return _merged(answers)

    async def consumer_groups(self) -> list[str]:
        return _merged(await _each(self.backends.values(), lambda backend: backend.consumer_groups()))

    async def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None:
        for backend in self._group_backends(group):
            info = await backend.consumer_info(group, client_id)
            if info is not None:
                return info
        return None

    def watch_groups(self, listener: Callable[[str], None]) -> None:
        for backend in self.backends.values():
            backend.watch_groups(listener)

    async def query_assignment(
        self, topic: str, group: str, client_id: str, *, strategy: str = "", broadcasting: bool = False
    ) -> QueueAssignment | None:
        backend = self._for_group(group, topic)
        return await backend.query_assignment(
            topic, group, client_id, strategy=strategy, broadcasting=broadcasting
        )

    # --- admin ------------------------------------------------------------------------------------
    async def get_topic(self, topic: str) -> TopicConfig | None:
        if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)) and topic.split("%", 2)[2] not in self._homes:
            for backend in self.backends.values():
                found = await backend.get_topic(topic)
                if found is not None:
                    return found
        return await self.for_topic(topic).get_topic(topic)

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        return await self.for_topic(topic).create_topic(topic, queue_count)

    async def update_topic(self, config: TopicConfig) -> TopicConfig:
        return await self.for_topic(config.name).update_topic(config)

    async def topic_names(self) -> list[str]:
        return _merged(await _each(self.backends.values(), lambda backend: backend.topic_names()))

    def topic_type(self, topic: str) -> TopicMessageType | None:
        try:
            return self.for_topic(topic).topic_type(topic)
        except TopicNotFound:
            return None

    async def set_topic_type(self, topic: str, message_type: TopicMessageType | None) -> None:
        await self.for_topic(topic).set_topic_type(topic, message_type)

    def group_config(self, group: str) -> GroupConfig | None:
        for backend in self._group_backends(group):
            config = backend.group_config(group)
            if config is not None:
                return config
        return None

    async def put_group_config(self, config: GroupConfig) -> None:
        for backend in self._group_backends(config.group):
            await backend.put_group_config(config)

    async def delete_group_config(self, group: str) -> bool:
        deleted = False
        for backend in self._group_backends(group):
            deleted = await backend.delete_group_config(group) or deleted
        return deleted

    async def request_mode(self, topic: str, group: str) -> RequestMode | None:
        return await self._for_group(group, topic).request_mode(topic, group)

    async def set_request_mode(self, topic: str, group: str, mode: RequestMode) -> None:
        await self._for_group(group, topic).set_request_mode(topic, group, mode)

    # --- light queues (MQTT: the default backend) -------------------------------------------------
    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int:
        return await self.for_topic(topic).rewrite_queue(topic, queue_id, keep, below)

    async def delete_idle_lmqs(self, idle_ms: int, in_use: Container[str], limit: int = 10_000) -> list[str]:
        return await self._default_or_first().delete_idle_lmqs(idle_ms, in_use, limit)

    async def store_bytes(self) -> int:
        return sum(await _each(self.backends.values(), lambda backend: backend.store_bytes()))

    # --- gauges -----------------------------------------------------------------------------------
    @property
    def max_reconsume_times(self) -> int:
        return self._default_or_first().max_reconsume_times

    def unresolved_transactions(self) -> int:
        return sum(backend.unresolved_transactions() for backend in self.backends.values())

    def pops_in_flight(self) -> int:
        return sum(backend.pops_in_flight() for backend in self.backends.values())

    def only(self, name: str | None) -> RoutingFacade:
        """A facade over the same backends sending every topic to ``name`` (None: every topic unrouted),
        for the MQTT gateway, whose light queues live with their parent topics on the default backend."""
        described = f"MQTT uses routing.default; {self.described}"
        return RoutingFacade(self.backends, RoutingTable((), name or ""), described=described)


async def _each(backends: Iterable[BrokerFacade], call: Callable[[BrokerFacade], Awaitable[_T]]) -> list[_T]:
    """Every backend's answer to ``call``, in order. A backend that cannot answer now (``StoreUnavailable``:
    a cluster out of reach) is left out, so listings still show the others; if none answers, its error."""
    answers: list[_T] = []
    failed: StoreUnavailable | None = None
    for backend in backends:
        try:
            answers.append(await call(backend))
        except StoreUnavailable as exc:
            failed = exc
    if not answers and failed is not None:
        raise failed
    return answers


def _merged(answers: Iterable[Iterable[str]]) -> list[str]:
    """Names from several answers, each once, in first-seen order."""
    return list(dict.fromkeys(name for answer in answers for name in answer))

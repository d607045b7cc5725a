"""
mqproxy.facade.api
~~~~~~~~~~~~~~~~~~

:class:`BrokerFacade`: the one interface the protocols (remoting, MQTT, gRPC) call, modelled on Apache
RocketMQ's proxy ``MessagingProcessor``. A protocol never knows whether the broker behind it is the
embedded store (:mod:`mqproxy.backends.embedded`) or a cluster reached over the network.

It is split into role protocols, each small enough to read at once; an implementation provides them all.

Contracts shared by every method:

* Errors are :mod:`mqproxy.model.errors` subclasses and nothing else on purpose; protocols map them to
  their own codes.
* Queues are named by topic and queue id as the client sees them (the proxy is the one broker clients
  talk to); receipt handles and transaction references are opaque strings or values the facade issued,
  and they carry whatever the implementation needs to find their broker again (any node can use them).
* Nothing a client relies on may live only in one process's memory: an implementation either stores it
  (embedded) or forwards it to where it is stored (cluster).
* Long polls (``hold_s``) end early when the server drains (cancellation is honoured).

Synchronous methods never ask a broker; each is one of:

* a read of metadata the implementation caches and keeps fresh (a cluster backend refreshes it from the
  brokers or the name server, and a write through the facade updates it at once): :meth:`Admin.topic_type`,
  :meth:`Admin.group_config`, :meth:`Producing.clamp_delay_level`, :attr:`BrokerFacade.max_reconsume_times`;
* a registration of something this proxy process owns: :meth:`Producing.add_check_back`,
  :meth:`Producing.set_lmq_dispatch`, :meth:`Producing.announce_producer`,
  :meth:`Membership.watch_groups`;
* a gauge of this process's view for metrics, not a cluster-wide total:
  :meth:`BrokerFacade.unresolved_transactions`, :meth:`BrokerFacade.pops_in_flight`.

Anything whose answer lives on a broker (messages, offsets, receipts, transactions, membership, topic
and group writes) is ``async``.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mqproxy.facade.types import (
    AckOutcome,
    CheckBack,
    GroupConfig,
    InitMode,
    QueueRef,
    RequestMode,
    Resolution,
    SendBackResult,
    TopicMessageType,
)
from mqproxy.model.errors import BackendError
from mqproxy.model.receipts import PopResult
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

__all__ = [
    "Admin",
    "BrokerFacade",
    "Consuming",
    "EndTransaction",
    "LightQueues",
    "LmqDispatch",
    "Locking",
    "Membership",
    "Offsets",
    "PopRequest",
    "Popping",
    "Producing",
    "PullRequest",
    "QueueAssignment",
    "SendOutcome",
    "SendRequest",
]


# --- request and result values ------------------------------------------------------------------

#: The light queues a message belongs to, from its properties (empty: none).
LmqDispatch = Callable[[Mapping[str, str]], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class SendRequest:
    """One message to store. ``producer_group`` becomes a half message's ``PGROUP`` when it has none;
    ``max_reconsume_times`` is the retry limit a ``%RETRY%`` send is checked against (None: the default);
    ``create_queues`` asks for the topic to be auto-created with that many queues (capped by the default
    count; None: no auto-creation by this request)."""

    message: Message
    producer_group: str = ""
    max_reconsume_times: int | None = None
    create_queues: int | None = None


@dataclass(frozen=True, slots=True)
class SendOutcome:
    """Where a sent message went. ``parked`` names what holds it back: ``"half"`` (a transactional half
    message awaiting its end), ``"delay"`` (a delay level or timer) or ``""`` (visible now); ``queue_id`` is
    the queue it is (or will be) delivered to; ``topic`` the topic it went to (the dead-letter topic for
    a spent retry); ``delay_level`` the level applied after clamping (0: none); ``recall_handle`` is set
    for a message parked until a delivery time (it can be recalled until then); ``transaction_ref`` is
    what names a half message to :meth:`Producing.end_transaction` as ``transaction_id`` when the
    implementation needs more than the message id ("": the message id does)."""

    result: SendResult
    topic: str
    queue_id: int
    parked: str = ""
    delay_level: int = 0
    recall_handle: str = ""
    transaction_ref: str = ""


@dataclass(frozen=True, slots=True)
class PullRequest:
    """A pull of one queue. ``hold_s`` > 0 long-polls: a pull that finds nothing (or nothing matching)
    waits up to that long for new messages before answering. ``commit_offset`` (>= 0) is stored for
    ``group`` first. ``wire``: the caller sends the messages as a remoting pull body, so a backend may
    answer with them in that form (:meth:`~mqproxy.model.types.PullResult.of_records`)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    max_count: int
    max_bytes: int = 4 * 1024 * 1024
    message_filter: FilterExpression | None = None
    hold_s: float = 0.0
    commit_offset: int = -1
    wire: bool = False


@dataclass(frozen=True, slots=True)
class PopRequest:
    """A pop for ``group`` of up to ``max_count`` messages of ``topic`` (``queue_id`` None: any queue, and
    the group's pop retry topic unless ``order``), invisible for ``invisible_ms``; waits up to ``hold_s``."""

    group: str
    topic: str
    max_count: int
    invisible_ms: int
    queue_id: int | None = None
    message_filter: FilterExpression | None = None
    order: bool = False
    init_mode: InitMode = InitMode.MIN
    hold_s: float = 0.0


@dataclass(frozen=True, slots=True)
class EndTransaction:
    """The end of a transaction a producer (or its check-back answer) sends. The half message is named by
    ``commitlog_offset`` (with ``offset_msg_id``, which names the broker; remoting) or by
    ``transaction_id`` (gRPC). ``producer_group`` None skips the group check (gRPC has no producer group);
    ``from_check`` marks an answer to a check-back; ``tran_state_table_offset`` is the half message's queue
    offset when the client sent it (-1: unknown; a cluster broker checks it); ``topic`` the half message's
    topic when the client names it ("": it does not; a facade in front of several backends uses it to find
    the half message's backend)."""

    resolution: Resolution
    producer_group: str | None = None
    commitlog_offset: int | None = None
    offset_msg_id: str = ""
    transaction_id: str = ""
    from_check: bool = False
    tran_state_table_offset: int = -1
    topic: str = ""


@dataclass(frozen=True, slots=True)
class QueueSpan:
    """A queue's readable range: ``min_offset`` is the first readable, ``max_offset`` one past the last."""

    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class MessageQuery:
    """Messages of ``topic`` whose key or unique id is ``key``, stored in [``begin_ms``, ``end_ms``]."""

    topic: str
    key: str
    max_count: int = 32
    begin_ms: int = 0
    end_ms: int = 2**62
    unique_id: bool = field(default=False)


@dataclass(frozen=True, slots=True)
class QueueAssignment:
    """What server-side rebalancing (RIP-38) gives one client: the queue ids it consumes (``-1``: every
    queue, popped) and the mode it consumes them in."""

    mode: RequestMode
    queue_ids: tuple[int, ...]


# --- roles --------------------------------------------------------------------------------------


class Producing(Protocol):
    async def send(self, request: SendRequest) -> SendOutcome:
        """Store one message (auto-creating its topic if allowed): a transactional half message is held
        until its end, a delay level or timer property parks it, a ``%RETRY%`` send past the group's
        retry limit goes to the dead-letter topic; otherwise it is visible at once. Returns only once
        durable per the flush policy."""
        ...

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store messages of one topic and queue atomically: all or none become visible."""
        ...

    async def end_transaction(self, end: EndTransaction) -> SendResult | None:
        """Commit or roll back a half message; returns where the committed message went (None otherwise)."""
        ...

    async def recall(self, topic: str, handle: str) -> str:
        """Cancel a message parked until its delivery time; returns its message id."""
        ...

    def add_check_back(self, sender: CheckBack) -> None:
        """Register a way to reach live producers for transaction check-backs (each protocol adds its
        own; a check goes to the first sender that finds a producer of the group)."""
        ...

    def announce_producer(self, group: str, present: bool = True) -> None:
        """A producer of ``group`` is connected to this process (called on each of its heartbeats), so a
        cluster's transaction check-backs for the group may be sent here; ``present`` False: the last one
        left. Idempotent."""
        ...

    def clamp_delay_level(self, level: int) -> int:
        """``level`` limited to the configured delay levels (0 and below: no delay); from configuration."""
        ...

    def set_lmq_dispatch(self, dispatch: LmqDispatch) -> None:
        """Install what names the light queues of a message sent without ``INNER_MULTI_DISPATCH`` (the MQTT
        gateway maps ``MQTT_TOPIC`` to the LMQs of matching subscriptions)."""
        ...


class Consuming(Protocol):
    async def pull(self, request: PullRequest) -> PullResult:
        """Read up to ``max_count`` messages from ``offset`` that match the filter (long-polling per
        ``hold_s``)."""
        ...

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Block until the queue holds a message at or after ``offset`` (True) or the timeout passes."""
        ...

    async def get_message(self, commitlog_offset: int, *, topic: str = "") -> StoredMessage | None:
        """The stored message an offset message id names, or None. ``topic``, when the caller knows it, is
        a topic of the backend holding the message (its original topic for a retried one): a facade in
        front of several backends, whose offsets are not unique across them, asks that backend only."""
        ...

    async def query_messages(self, query: MessageQuery) -> list[StoredMessage]:
        """Messages by key (or unique id), newest stored first."""
        ...

    async def send_back(
        self,
        group: str,
        message: StoredMessage,
        *,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        origin_msg_id: str = "",
    ) -> SendBackResult:
        """A consumer gave up on ``message``: store it in the group's retry topic with a delay, or in its
        dead-letter topic once its retries are spent (the facade decides which)."""
        ...


class Popping(Protocol):
    async def pop(self, request: PopRequest) -> PopResult: ...

    async def ack(self, group: str, topic: str, receipt: str) -> AckOutcome: ...

    async def ack_many(
        self, group: str, topic: str, receipts: Sequence[str]
    ) -> list[AckOutcome | BackendError]:
        """Per receipt: its outcome, or the error :meth:`ack` would have raised for it."""
        ...

    async def change_invisible(self, group: str, topic: str, receipt: str, invisible_ms: int) -> str:
        """Make a popped message invisible for ``invisible_ms`` from now; returns its new receipt."""
        ...

    async def forward_to_dlq(self, group: str, topic: str, receipt: str) -> SendResult: ...

    async def peek(
        self,
        group: str,
        topic: str,
        queue_id: int | None,
        max_count: int,
        *,
        message_filter: FilterExpression | None = None,
    ) -> list[StoredMessage]: ...

    async def has_message(self, group: str, topic: str, queue_id: int | None) -> bool:
        """Whether the group has anything left to pop (NOTIFICATION)."""
        ...


class Offsets(Protocol):
    async def span(self, topic: str, queue_id: int) -> QueueSpan: ...

    async def min_offset(self, topic: str, queue_id: int) -> int: ...

    async def max_offset(self, topic: str, queue_id: int) -> int: ...

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset whose store time is >= ``timestamp_ms`` (max offset if none)."""
        ...

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """Store time (ms) of the message at the min offset; -1 when the queue is empty."""
        ...

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None: ...

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...

    async def consumer_offsets(self) -> list[ConsumerOffset]:
        """Every committed offset of a user topic (lag metrics, consume stats)."""
        ...


class Locking(Protocol):
    """Orderly consumers' queue locks: one client per (group, queue) while its lock lives (it expires
    unless renewed by locking again). Asynchronous: a cluster implementation asks the queue's broker."""

    async def lock_batch(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> set[QueueRef]:
        """Lock what is free (or already ``client_id``'s) for ``client_id``; returns what it now holds."""
        ...

    async def unlock(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> None:
        """Release the queues ``client_id`` holds; other clients' locks are untouched."""
        ...

    async def release_client(self, group: str, client_id: str) -> int:
        """Drop every lock ``client_id`` holds in ``group`` (its connection ended); returns how many."""
        ...

    async def lock_holder(self, group: str, queue: QueueRef) -> str | None:
        """The client holding a live lock on ``queue`` for ``group``, or None."""
        ...


class Membership(Protocol):
    async def register_consumer(self, info: ConsumerInfo) -> bool:
        """Add or refresh a group member; True if the group's membership or subscriptions changed."""
        ...

    async def unregister_consumer(self, group: str, client_id: str) -> bool: ...

    async def consumer_ids(self, group: str) -> list[str]: ...

    async def consumer_groups(self) -> list[str]: ...

    async def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None: ...

    def watch_groups(self, listener: Callable[[str], None]) -> None:
        """Register ``listener``, called with a group's name when the cluster behind the proxy reports that
        the group's members changed elsewhere (a client of another node joined or left). The embedded store
        never calls it: every member is on this process, and protocols notify those themselves."""
        ...

    async def query_assignment(
        self, topic: str, group: str, client_id: str, *, strategy: str = "", broadcasting: bool = False
    ) -> QueueAssignment | None:
        """The queues ``client_id`` of ``group`` consumes of ``topic`` when the broker rebalances (the
        Java allocation ``strategy``, ``AVG`` or ``AVG_BY_CIRCLE``; broadcasting: every queue), in the
        topic's request mode; None when no assignment can be made (unknown topic or strategy)."""
        ...


class Admin(Protocol):
    async def get_topic(self, topic: str) -> TopicConfig | None: ...

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        """Create the topic if missing (idempotent); ``None`` means the configured default count."""
        ...

    async def update_topic(self, config: TopicConfig) -> TopicConfig: ...

    async def topic_names(self) -> list[str]: ...

    def topic_type(self, topic: str) -> TopicMessageType | None:
        """The topic's declared message type (None: undeclared), from the metadata cache."""
        ...

    async def set_topic_type(self, topic: str, message_type: TopicMessageType | None) -> None: ...

    def group_config(self, group: str) -> GroupConfig | None:
        """The group's subscription-group config (None: defaults apply), from the metadata cache."""
        ...

    async def put_group_config(self, config: GroupConfig) -> None: ...

    async def delete_group_config(self, group: str) -> bool: ...

    async def request_mode(self, topic: str, group: str) -> RequestMode | None: ...

    async def set_request_mode(self, topic: str, group: str, mode: RequestMode) -> None: ...


class LightQueues(Protocol):
    """What the MQTT gateway needs beyond messages: queue rewrites for its keyed state logs, the sweep of
    idle light queues, and store accounting."""

    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int: ...

    async def delete_idle_lmqs(
        self, idle_ms: int, in_use: Container[str], limit: int = 10_000
    ) -> list[str]: ...

    async def store_bytes(self) -> int: ...


class BrokerFacade(Producing, Consuming, Popping, Offsets, Locking, Membership, Admin, LightQueues, Protocol):
    """Everything a protocol may ask of the broker behind the proxy."""

    @property
    def max_reconsume_times(self) -> int:
        """The retry limit of a group without its own (``retryMaxTimes``)."""
        ...

    def unresolved_transactions(self) -> int:
        """Half messages this process knows to be awaiting their end (a metrics gauge)."""
        ...

    def pops_in_flight(self) -> int:
        """Popped, un-acked messages this process tracks (a metrics gauge)."""
        ...

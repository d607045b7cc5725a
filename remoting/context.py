"""
mqproxy.remoting.context
~~~~~~~~~~~~~~~~~~~~~~~~

What a remoting session needs from the server around it: the advertised address and settings
(:class:`ServerContext`), the cross-connection group registry (:class:`GroupMembership`, implemented by
:class:`mqproxy.remoting.registry.ConnectionRegistry`), and the shape of the per-request log event
(:class:`RequestEvent`, the ``request`` event of ``config/log_event.schema.json``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from mqproxy.model.ids import MessageIdError, pack_ip

#: The broker name and cluster every route names (one logical broker: this proxy, spec §8.3).
BROKER_NAME = "broker-a"
CLUSTER_NAME = "DefaultCluster"


class GroupMembership(Protocol):
    """Which connection owns which (consumer group, client id); sends NOTIFY_CONSUMER_IDS_CHANGED.

    ``conn`` is an opaque token identifying one connection. All methods are synchronous and never
    block: notifications are queued for delivery by the I/O layer.
    """

    def join(self, group: str, client_id: str, conn: object) -> None:
        """Record that ``client_id`` of ``group`` lives on ``conn`` (re-joining moves it)."""
        ...

    def leave(self, group: str, client_id: str, conn: object) -> bool:
        """Forget the membership if ``conn`` still owns it; True if it did (the caller unregisters)."""
        ...

    def notify_changed(self, group: str, exclude: object | None) -> None:
        """Send NOTIFY_CONSUMER_IDS_CHANGED (oneway) to every connection of ``group`` but ``exclude``."""
        ...

    def owner(self, group: str, client_id: str) -> object | None:
        """The connection ``client_id`` of ``group`` lives on (for server→client calls), or None."""
        ...

    def join_producer(self, group: str, conn: object) -> None:
        """Record that a producer of ``group`` lives on ``conn`` (transaction check-backs go there)."""
        ...

    def leave_producer(self, group: str, conn: object) -> bool:
        """Forget ``conn`` as a producer of ``group`` (idempotent); True when that was the group's last
        producer connection."""
        ...


class NullGroups:
    """A :class:`GroupMembership` for a lone session: always owns, never notifies."""

    def join(self, group: str, client_id: str, conn: object) -> None:
        return None

    def leave(self, group: str, client_id: str, conn: object) -> bool:
        return True

    def notify_changed(self, group: str, exclude: object | None) -> None:
        return None

    def owner(self, group: str, client_id: str) -> object | None:
        return None

    def join_producer(self, group: str, conn: object) -> None:
        return None

    def leave_producer(self, group: str, conn: object) -> bool:
        return False


class HeldPolls:
    """Pop and notification requests currently held (long polling), per (topic, group, queue id).

    ``try_hold`` refuses beyond ``per_key`` holds of one key or ``total`` overall (the broker's
    ``popPollingSize`` 1024 and 100000, spec §6.1); every successful hold must be released.
    """

    def __init__(self, per_key: int = 1024, total: int = 100_000) -> None:
        self.per_key = per_key
        self.total = total
        self._held: dict[tuple[str, str, int], int] = {}
        self._count = 0

    def try_hold(self, key: tuple[str, str, int]) -> bool:
        current = self._held.get(key, 0)
        if current >= self.per_key or self._count >= self.total:
            return False
        self._held[key] = current + 1
        self._count += 1
        return True

    def release(self, key: tuple[str, str, int]) -> None:
        current = self._held.get(key, 0)
        if current <= 0:
            return
        self._count -= 1
        if current == 1:
            del self._held[key]
        else:
            self._held[key] = current - 1

    def count(self, key: tuple[str, str, int]) -> int:
        return self._held.get(key, 0)


class PullOffsets:
    """Where each (group, topic, queue) last pulled to (``nextBeginOffset``): what ``mqadmin
    consumerProgress`` shows as pull offset, in flight beyond the committed offset. Memory only, as the
    Java broker's ``pullOffsetTable``; one entry per queue a group pulls."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, str, int], int] = {}

    def record(self, group: str, topic: str, queue_id: int, next_offset: int) -> None:
        self._next[(group, topic, queue_id)] = next_offset

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._next.get((group, topic, queue_id))


@dataclass(frozen=True, slots=True)
class ServerContext:
    """Server-wide settings a session reads; one instance shared by every remoting connection.

    ``advertised_host``/``advertised_port`` go into every route's ``brokerAddrs`` and every offset
    message id, so they must be the address clients can reach this proxy at.
    """

    advertised_host: str
    advertised_port: int
    groups: GroupMembership = field(default_factory=NullGroups)
    #: Held POP_MESSAGE / NOTIFICATION requests (POLLING_FULL, POLLING_INFO).
    polls: HeldPolls = field(default_factory=HeldPolls)
    #: Where groups last pulled to (GET_CONSUME_STATS' pull offsets).
    pull_offsets: PullOffsets = field(default_factory=PullOffsets)
    #: Whether route lookups and sends may create unknown topics (the server passes the same store
    #: setting to the broker facade, which applies it to single sends).
    auto_create_topics: bool = True
    #: Cap on an auto-created topic's queues (a batch send's ``defaultTopicQueueNums``); TBW102's count.
    default_queue_count: int = 4
    #: Upper bound on messages per pull response (clients ask 32).
    max_pull_batch: int = 32
    #: Upper bound on a pull response body, bytes (far below the 16 MiB frame limit).
    max_pull_bytes: int = 4 * 1024 * 1024
    #: Upper bound on a long-poll hold, seconds (Java push asks 15 s, lite pull 20 s).
    long_poll_max_s: float = 30.0
    #: ``MSG_REGION`` / ``TRACE_ON`` added to every response (spec §1.7).
    region: str = "DefaultRegion"
    trace_on: bool = True
    #: ``version`` of every response (V5_3_3; clients compare it for SQL92 support).
    server_version: int = 479
    #: IP literal for offset message ids; "" means ``advertised_host`` when that is an IP literal,
    #: else 127.0.0.1 (message ids cannot carry host names).
    msg_id_host: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.advertised_port <= 0xFFFF:
            raise ValueError(f"advertised_port {self.advertised_port} out of range")
        if self.default_queue_count < 1 or self.max_pull_batch < 1 or self.max_pull_bytes < 1:
            raise ValueError("queue count, pull batch and pull bytes must be positive")
        if not self.long_poll_max_s >= 0:
            raise ValueError("long_poll_max_s must be >= 0")
        host = self.msg_id_host or self.advertised_host
        try:
            pack_ip(host)
        except MessageIdError:
            if self.msg_id_host:
                raise ValueError(f"msg_id_host {self.msg_id_host!r} is not an IP literal") from None
            host = "127.0.0.1"
        object.__setattr__(self, "msg_id_host", host)

    @property
    def advertised_address(self) -> str:
        return f"{self.advertised_host}:{self.advertised_port}"


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """One handled request: the fields of the ``request`` log event besides conn_id/protocol."""

    op: str
    code: int
    status: str | None
    outcome: str
    latency_ms: float
    req_bytes: int
    resp_bytes: int
    client_id: str | None
    client_version: str | None
    group: str | None
    topic: str | None


RequestCallback = Callable[[RequestEvent], None]


def ignore_request(event: RequestEvent) -> None:
    """The default :data:`RequestCallback`: drop the event."""
    return None

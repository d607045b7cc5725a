"""The broker services wired over one :class:`~mqproxy.backends.embedded.store.MessageStore`.

:class:`BrokerServices` owns the scheduler (delays), retry/DLQ, transactions, pop, queue locks and the
administrator-set metadata (subscription-group configs, topic message types) and the consume modes of
server-side assignment, and runs their background tasks (delivery of due messages, revive, transaction
check-back). Protocol layers hold one instance and call its parts; :meth:`BrokerServices.send` is the
produce entry point that routes a message to the half topic, the schedule topic or its own topic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from mqproxy.backends.embedded.assignment import RequestModes
from mqproxy.backends.embedded.internal_topics import Clock, wall_clock_ms
from mqproxy.backends.embedded.locks import DEFAULT_LOCK_TTL_S, QueueLocks
from mqproxy.backends.embedded.metadata import BrokerMetadata
from mqproxy.backends.embedded.pop import DEFAULT_REVIVE_QUEUES, PopService
from mqproxy.backends.embedded.retry import DEFAULT_MAX_RECONSUME_TIMES, RetryService
from mqproxy.backends.embedded.schedule import DEFAULT_DELAY_LEVELS, DEFAULT_MAX_TIMER_DELAY_MS, Scheduler
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.backends.embedded.transactions import (
    DEFAULT_CHECK_INTERVAL_S,
    DEFAULT_CHECK_MAX,
    DEFAULT_TIMEOUT_S,
    TransactionService,
)
from mqproxy.facade.types import CheckBack
from mqproxy.model.properties import (
    PROPERTY_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
)
from mqproxy.model.types import PROPERTY_DELAY_LEVEL, Message, SendResult
from mqproxy.runtime.tasks import running

#: Pause before restarting a background task that crashed.
RESTART_PAUSE_S = 1.0

_log = structlog.get_logger("mqproxy.services")


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    """Tunables with the Java broker's defaults (spec §10.1)."""

    delay_levels: str = DEFAULT_DELAY_LEVELS
    max_timer_delay_ms: int = DEFAULT_MAX_TIMER_DELAY_MS
    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES
    revive_queues: int = DEFAULT_REVIVE_QUEUES
    transaction_timeout_s: float = DEFAULT_TIMEOUT_S
    transaction_check_interval_s: float = DEFAULT_CHECK_INTERVAL_S
    transaction_check_max: int = DEFAULT_CHECK_MAX
    lock_ttl_s: float = DEFAULT_LOCK_TTL_S


def is_half(sys_flag: int, properties: Mapping[str, str], reconsume_times: int) -> bool:
    """A message to store as a half message: sysFlag PREPARED or ``TRAN_MSG=true`` (spec §7.1).

    Not when it is a consumer's re-send of a consumed message (``reconsume_times`` > 0 with a ``DELAY``
    level, the Java client's fallback when send-back fails): a committed transactional message keeps
    ``TRAN_MSG=true``, and the Java broker makes the same exception.
    """
    prepared = sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_PREPARED
    if not prepared and properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() != "true":
        return False
    delay = properties.get(PROPERTY_DELAY_LEVEL, "").strip()
    return not (reconsume_times > 0 and delay.isdigit() and int(delay) > 0)


def is_transactional(message: Message) -> bool:
    """A half message (:func:`is_half`)."""
    return is_half(message.sys_flag, message.properties, message.reconsume_times)


class BrokerServices:
    def __init__(
        self,
        backend: MessageStore,
        settings: ServiceSettings | None = None,
        *,
        check_back: CheckBack | None = None,
        now_ms: Clock = wall_clock_ms,
    ) -> None:
        settings = settings or ServiceSettings()
        self.backend = backend
        self.settings = settings
        self.scheduler = Scheduler(
            backend,
            delay_levels=settings.delay_levels,
            max_timer_delay_ms=settings.max_timer_delay_ms,
            now_ms=now_ms,
        )
        self.retry = RetryService(backend, self.scheduler, max_reconsume_times=settings.max_reconsume_times)
        self.transactions = TransactionService(
            backend,
            self.scheduler,
            check_back=check_back,
            timeout_s=settings.transaction_timeout_s,
            check_interval_s=settings.transaction_check_interval_s,
            check_max=settings.transaction_check_max,
            now_ms=now_ms,
        )
        self.pop = PopService(
            backend,
            self.retry,
            revive_queues=settings.revive_queues,
            max_reconsume_times=settings.max_reconsume_times,
            now_ms=now_ms,
        )
        self.locks = QueueLocks(settings.lock_ttl_s)
        self.metadata = BrokerMetadata(backend)
        self.request_modes = RequestModes(backend)

    async def start(self) -> None:
        """Create the internal topics and replay the services' state (run does this too)."""
        await self.metadata.start()
        await self.scheduler.start()
        await self.transactions.start()
        await self.pop.start()

    async def send(self, message: Message) -> SendResult:
        """Produce entry point: half message, delayed message, or a plain send."""
        if is_transactional(message):
            return await self.transactions.prepare(message)
        return await self.scheduler.send(message)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover, then run the scheduler, revive and transaction checker until cancelled.

        ``task_status.started()`` fires once every service has replayed its state.
        """
        await self.start()
        async with trio.open_nursery() as nursery:
            await nursery.start(_supervise, "schedule", self.scheduler.run)
            await nursery.start(_supervise, "revive", self.pop.run)
            await nursery.start(_supervise, "transaction-check", self.transactions.run)
            task_status.started()


class _Started:
    """Forwards the first ``started()`` to the real task status; later restarts report nothing."""

    def __init__(self, status: trio.TaskStatus[None]) -> None:
        self._status = status
        self.done = False

    def started(self, value: None = None) -> None:
        if not self.done:
            self.done = True
            self._status.started(value)


async def _supervise(
    name: str,
    run: Callable[..., Awaitable[Any]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a background task; if it crashes after starting, log ``internal.error`` and restart it."""
    status = _Started(task_status)
    while True:
        try:
            await run(task_status=status)
            return
        except Exception as exc:
            if not status.done:
                raise
            _log.error("internal.error", exception=f"{name} task crashed, restarting: {exc!r}")
            await trio.sleep(RESTART_PAUSE_S)


@asynccontextmanager
async def open_services(
    backend: MessageStore,
    settings: ServiceSettings | None = None,
    *,
    check_back: CheckBack | None = None,
    now_ms: Clock = wall_clock_ms,
) -> AsyncIterator[BrokerServices]:
    """Start :class:`BrokerServices` with background tasks; they stop when the block exits."""
    services = BrokerServices(backend, settings, check_back=check_back, now_ms=now_ms)
    async with running(services.run):
        yield services

"""Push delivery for caught-up subscribers: one task per busy LMQ instead of one wake-up per subscriber.

A subscription reader that has read its LMQ to the end parks here (:meth:`PushHubs.park`) instead of
long-polling the store itself. The LMQ's hub task long-polls once, reads each batch of new messages once
(through the shared read cache) and offers it to every parked reader through a synchronous
``deliver_now`` callback on its connection, which sends the batch's PUBLISH bytes with one write (or
queues them for the connection's writer) without waking the reader; a QoS 1 delivery that fits the
session's in-flight window is put in flight by the callback too (one scheduling hop and one pull fewer
between the store write and the subscriber). A reader is woken when the callback declines a message
(QoS 2, topic aliases, a full in-flight window or send queue, a detached session ...): it then pulls from
its own cursor as before, so nothing is lost, duplicated or reordered. Each parked reader's cursor is at
the hub's offset; a reader anywhere else long-polls the store on its own. A hub serves one queue of an
LMQ (a cluster has one per broker).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog
import trio

from mqproxy.model.errors import BackendError
from mqproxy.model.types import PullStatus, StoredMessage
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.read_cache import ReadCache
from mqproxy.mqtt.store import LightStore

_log = structlog.get_logger("mqproxy.mqtt")

#: ``deliver_now(topic_filter, cursor, messages, offset)``, ``messages`` starting at ``offset``: how many
#: leading messages were handled without the reader (sent, queued or skipped), the cursor moved past
#: them; fewer than all wakes the reader for the rest.
DeliverNow = Callable[[str, Cursor, Sequence[StoredMessage], int], int]


class _Parked:
    __slots__ = ("cursor", "deliver_now", "topic_filter", "woken")

    def __init__(self, topic_filter: str, cursor: Cursor, deliver_now: DeliverNow) -> None:
        self.topic_filter = topic_filter
        self.cursor = cursor
        self.deliver_now = deliver_now
        self.woken = trio.Event()


class _Hub:
    __slots__ = ("lmq", "offset", "parked", "queue_id", "scope")

    def __init__(self, lmq: str, queue_id: int, offset: int) -> None:
        self.lmq = lmq
        self.queue_id = queue_id
        self.offset = offset  # the next offset the hub will read; every parked cursor is here
        self.parked: dict[int, _Parked] = {}
        self.scope = trio.CancelScope()


class PushHubs:
    """The hubs of one gateway, by LMQ and queue. ``pushed`` counts deliveries made without waking a reader,
    ``woken`` the readers woken because their hub declined a message, ``rounds`` the pulls the hubs made."""

    def __init__(
        self, backend: LightStore, read_cache: ReadCache, pull_batch: int, poll_interval_s: float
    ) -> None:
        self._backend = backend
        self._cache = read_cache
        self._batch = pull_batch
        self._poll_s = poll_interval_s
        self._hubs: dict[tuple[str, int], _Hub] = {}
        self.pushed = 0
        self.woken = 0
        self.rounds = 0  # batches the hubs read and offered (how a publisher sees that they ran)

    def __len__(self) -> int:
        return len(self._hubs)

    async def park(
        self, topic_filter: str, cursor: Cursor, deliver_now: DeliverNow, timeout_s: float
    ) -> None:
        """Wait until the reader of ``cursor`` must pull again: the hub declined a message for it, the
        cursor is not where the hub reads, or ``timeout_s`` passed. Meanwhile the hub may move the
        cursor forward by delivering through ``deliver_now``."""
        lmq, queue_id = key = cursor.lmq, cursor.queue_id
        hub = self._hubs.get(key)
        if hub is None:
            hub = self._hubs[key] = _Hub(lmq, queue_id, cursor.next_offset)
            trio.lowlevel.spawn_system_task(self._run, hub, name=f"mqtt-push-hub {lmq}/{queue_id}")
        elif hub.offset != cursor.next_offset:
            await self._backend.wait_for_message(lmq, queue_id, cursor.next_offset, timeout_s)
            return
        parked = _Parked(topic_filter, cursor, deliver_now)
        ticket = id(parked)
        hub.parked[ticket] = parked
        try:
            with trio.move_on_after(timeout_s):
                await parked.woken.wait()
        finally:
            hub.parked.pop(ticket, None)
            if not hub.parked:
                hub.scope.cancel()  # nobody left: the hub task ends

    async def _run(self, hub: _Hub) -> None:
        try:
            with hub.scope:
                while hub.parked:
                    await self._backend.wait_for_message(hub.lmq, hub.queue_id, hub.offset, self._poll_s)
                    if not await self._push_new(hub):
                        break
        except BackendError as exc:
            _log.warning("internal.error", detail=f"push hub for {hub.lmq} stopped: {exc}")
        except Exception:  # a bug must not kill the process through a system task
            _log.exception("internal.error", detail=f"push hub for {hub.lmq} failed")
        finally:
            if self._hubs.get((hub.lmq, hub.queue_id)) is hub:
                del self._hubs[(hub.lmq, hub.queue_id)]
            for parked in hub.parked.values():
                parked.woken.set()  # their readers pull on their own now

    async def _push_new(self, hub: _Hub) -> bool:
        """Offer the messages after ``hub.offset`` to every parked reader; False if the hub must stop."""
        result = await self._cache.pull(hub.lmq, hub.queue_id, hub.offset, self._batch)
        self.rounds += 1
        if not result.messages:
            return result.status is not PullStatus.OFFSET_ILLEGAL
        if result.next_offset - hub.offset != len(result.messages):
            return False  # a filtered or holed answer: leave it to the readers
        advanced: list[Cursor] = []
        messages = result.messages
        for key, parked in list(hub.parked.items()):
            cursor = parked.cursor
            handled = 0
            if cursor.next_offset == hub.offset:
                handled = parked.deliver_now(parked.topic_filter, cursor, messages, hub.offset)
            if handled:
                self.pushed += handled
                advanced.append(cursor)
            if handled < len(messages):
                del hub.parked[key]
                parked.woken.set()
                self.woken += 1
        hub.offset = result.next_offset
        for cursor in advanced:
            if cursor.durable and cursor.committed != cursor.stored:
                await cursor.commit(self._backend)  # what the reader's round would have done
        return True

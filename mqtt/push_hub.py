"""Push delivery for caught-up subscribers: one task per busy LMQ instead of one wake-up per subscriber.

A subscription reader that has read its LMQ to the end parks here (:meth:`PushHubs.park`) instead of
long-polling the store itself. The LMQ's hub task long-polls once, reads each batch of new messages once
(through the shared read cache) and offers it to every parked reader through a synchronous
``deliver_now`` callback on its connection, which sends the batch's PUBLISH bytes with one write (or
queues them for the connection's writer) without waking the reader; a QoS 1 delivery that fits the
session's in-flight window is put in flight by the callback too (one scheduling hop and one pull fewer
between the store write and the subscriber). A reader is woken when the callback declines a message
(QoS 2, an expiring message, topic aliases, a full in-flight window or send queue, a detached session
...): it then pulls from its own cursor as before, so nothing is lost, duplicated or reordered. Each
parked reader's cursor is at the hub's offset; a reader anywhere else long-polls the store on its own. A
hub serves one queue of an LMQ (a cluster has one per broker).

A reader may also park without a task (:meth:`PushHubs.park_idle`, a new subscription placed at its
queue's end): it is then only an entry in its hub, and instead of an event set for a waiting task, its
``on_wake`` callback is called once (it starts the reader task, which pulls from its cursor). Such an
entry has no timeout of its own: the hub long-polls with the poll interval and pulls after each wait.

Hand-off: where the store calls the hub back (a watch) and can be read as a plain call (the embedded
store's ``pull_now``), the hub delivers a write from inside the store's notify of it, once it is stored:
it reads the new messages through the read cache (the store's hand-off keeps them, so nothing is read
back or decoded) and offers them to its parked readers, then watches again; no task, no wake-up and no
scheduling hop between the write and the subscriber's socket. A hub with a durable cursor parked (its
offset commit awaits the store), a segment another caller is reading, or an answer it must stop on is
left to its task as before.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Sequence

import structlog
import trio

from mqproxy.model.errors import BackendError
from mqproxy.model.types import PullResult, PullStatus, StoredMessage
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.read_cache import ReadCache
from mqproxy.mqtt.store import LightStore

_log = structlog.get_logger("mqproxy.mqtt")

#: ``deliver_now(topic_filter, cursor, messages, offset)``, ``messages`` starting at ``offset``: how many
#: leading messages were handled without the reader (sent, queued or skipped), the cursor moved past
#: them; fewer than all wakes the reader for the rest.
DeliverNow = Callable[[str, Cursor, Sequence[StoredMessage], int], int]


class _Parked:
    __slots__ = ("cursor", "deliver_now", "on_wake", "topic_filter", "woken")

    def __init__(
        self,
        topic_filter: str,
        cursor: Cursor,
        deliver_now: DeliverNow,
        on_wake: Callable[[], None] | None = None,
    ) -> None:
        self.topic_filter = topic_filter
        self.cursor = cursor
        self.deliver_now = deliver_now
        #: A task-less entry's callback (called once, then dropped); else the parked task's event.
        self.on_wake = on_wake
        self.woken: trio.Event | None = None if on_wake is not None else trio.Event()

    def wake(self) -> None:
        """Wake the parked reader: set its task's event, or call (once) the task-less entry's callback."""
        if self.woken is not None:
            self.woken.set()
        elif self.on_wake is not None:
            on_wake, self.on_wake = self.on_wake, None
            try:
                on_wake()
            except Exception:  # a bug in one connection's callback must not stop the hub
                _log.exception("internal.error", detail=f"push hub wake-up of {self.topic_filter} failed")


class _Hub:
    __slots__ = ("lmq", "offset", "parked", "queue_id", "scope", "watching")

    def __init__(self, lmq: str, queue_id: int, offset: int) -> None:
        self.lmq = lmq
        self.queue_id = queue_id
        self.offset = offset  # the next offset the hub will read; every parked cursor is here
        self.parked: dict[int, _Parked] = {}
        self.scope: trio.CancelScope | None = None  # its task's, while the hub has one
        self.watching: Callable[[], None] | None = None  # its store watch's callback, while it has one


class Parking:
    """A task-less parked reader (:meth:`PushHubs.park_idle`); :meth:`cancel` takes it out of its hub
    (the hub ends with its last entry). Cancelling after the wake-up does nothing."""

    __slots__ = ("_hub", "_hubs", "_parked")

    def __init__(self, hubs: PushHubs, hub: _Hub, parked: _Parked) -> None:
        self._hubs = hubs
        self._hub = hub
        self._parked = parked

    def cancel(self) -> None:
        parked = self._parked
        parked.on_wake = None
        hub = self._hub
        if hub.parked.pop(id(parked), None) is not None and not hub.parked:
            self._hubs._release(hub)  # nobody left: the hub ends


class PushHubs:
    """The hubs of one gateway, by LMQ and queue. ``pushed`` counts deliveries made without waking a reader,
    ``woken`` the readers woken because their hub declined a message, ``rounds`` the pulls the hubs made.

    A hub waits for its queue's next message without a task when the store can call it back
    (``watch`` / ``unwatch`` on the backend, :meth:`.FacadeStore.watch`: the embedded store); its task
    runs from that call until it has delivered what is there. Otherwise its task long-polls."""

    def __init__(
        self, backend: LightStore, read_cache: ReadCache, pull_batch: int, poll_interval_s: float
    ) -> None:
        self._backend = backend
        self._cache = read_cache
        self._batch = pull_batch
        self._poll_s = poll_interval_s
        self._hubs: dict[tuple[str, int], _Hub] = {}
        self._watch: Callable[[str, int, int, Callable[[], None]], bool | None] | None = getattr(
            backend, "watch", None
        )
        self._unwatch: Callable[[str, int, Callable[[], None]], None] | None = getattr(
            backend, "unwatch", None
        )
        self.pushed = 0
        self.woken = 0
        self.rounds = 0  # batches the hubs read and offered (how a publisher sees that they ran)
        #: The store can be read as a plain call (the hand-off inside its notify, :meth:`_hand_off`).
        self._sync_reads = getattr(read_cache.backend, "pull_now", None) is not None
        self._running = 0  # hubs with a task now

    def __len__(self) -> int:
        return len(self._hubs)

    async def let_woken_run(self) -> None:
        """Under light load (nothing but push hubs can be waiting to run), yield so that the hubs a store
        write just woke deliver it first. trio runs the tasks of one scheduler batch in either order, so
        a second yield when no hub ran in the first (at most two; shielded, so a caller that stored
        something still acknowledges it). Under load the hubs run soon anyway and the yields would only
        cost scheduler passes, so nothing is done."""
        running = self._running  # hubs the store's notify did not serve at once run in their tasks
        if not running or trio.lowlevel.current_statistics().tasks_runnable > running:
            return
        rounds = self.rounds
        await trio.lowlevel.cancel_shielded_checkpoint()
        if self.rounds == rounds:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def park(
        self, topic_filter: str, cursor: Cursor, deliver_now: DeliverNow, timeout_s: float
    ) -> None:
        """Wait until the reader of ``cursor`` must pull again: the hub declined a message for it, the
        cursor is not where the hub reads, or ``timeout_s`` passed. Meanwhile the hub may move the
        cursor forward by delivering through ``deliver_now``."""
        hub = self._hub_at(cursor)
        if hub is None:
            await self._backend.wait_for_message(cursor.lmq, cursor.queue_id, cursor.next_offset, timeout_s)
            return
        parked = _Parked(topic_filter, cursor, deliver_now)
        assert parked.woken is not None
        ticket = id(parked)
        hub.parked[ticket] = parked
        try:
            with trio.move_on_after(timeout_s):
                await parked.woken.wait()
        finally:
            hub.parked.pop(ticket, None)
            if not hub.parked:
                self._release(hub)  # nobody left: the hub ends

    def park_idle(
        self, topic_filter: str, cursor: Cursor, deliver_now: DeliverNow, on_wake: Callable[[], None]
    ) -> Parking | None:
        """Park the reader of ``cursor`` without a task: the hub delivers through ``deliver_now`` and,
        where it must not (it declined a message, or it stopped), calls ``on_wake`` once, from its own
        task, for the reader to pull on its own. None (nothing parked) if the cursor is not where its
        queue's hub reads: the caller runs its reader as usual then."""
        hub = self._hub_at(cursor)
        if hub is None:
            return None
        parked = _Parked(topic_filter, cursor, deliver_now, on_wake)
        hub.parked[id(parked)] = parked
        return Parking(self, hub, parked)

    def _hub_at(self, cursor: Cursor) -> _Hub | None:
        """The hub of ``cursor``'s queue (started if there is none), or None if it reads elsewhere."""
        lmq, queue_id = key = cursor.lmq, cursor.queue_id
        hub = self._hubs.get(key)
        if hub is None:
            hub = self._hubs[key] = _Hub(lmq, queue_id, cursor.next_offset)
            if not self._watch_store(hub):
                self._start(hub)
        elif hub.offset != cursor.next_offset:
            return None
        return hub

    def _watch_store(self, hub: _Hub) -> bool:
        """Have the store call the hub when its queue may hold a message at ``hub.offset``; False if it
        cannot, or one is there already (the hub's task reads, and reports the store's errors)."""
        if self._watch is None:
            return False
        callback = functools.partial(self._woke, hub)
        try:
            watching = self._watch(hub.lmq, hub.queue_id, hub.offset, callback)
        except BackendError:
            return False
        if watching:
            hub.watching = callback
        return bool(watching)

    def _woke(self, hub: _Hub) -> None:
        """The store's call: the hub's queue may hold a new message (run from the writer's task, once the
        write is stored). The hub delivers what was written at once (:meth:`_hand_off`) or starts its task."""
        if hub.watching is None:
            return
        hub.watching = None
        if hub.parked and self._hubs.get((hub.lmq, hub.queue_id)) is hub:
            if not contextvars.Context().run(self._hand_off, hub):  # a context of its own, as a task's
                self._start(hub)
        else:
            self._release(hub)

    def _hand_off(self, hub: _Hub) -> bool:
        """Deliver what the store just wrote to the hub's queue from inside its notify, synchronously (no
        task, no wake-up; the read is the read cache's, the messages the store's hand-off): True when done
        and the hub watches again (or ended with its last reader). False, with the hub as it was or further
        on, to leave it to its task: the store has no plain-call read, another caller is reading the
        segment, a parked cursor is durable (its commit awaits), the answer needs the task's handling, or
        the read failed (the task reports it)."""
        if not self._sync_reads or any(parked.cursor.durable for parked in hub.parked.values()):
            return False
        try:
            while True:
                result = self._cache.pull_now(hub.lmq, hub.queue_id, hub.offset, self._batch)
                if result is None:
                    return False
                self.rounds += 1
                if not result.messages or self._offer(hub, result) is None:
                    return False  # nothing (or an answer to stop on): the task's rules decide
                if not hub.parked:
                    self._release(hub)
                    return True
                if len(result.messages) < self._batch and self._watch_store(hub):
                    return True
        except BackendError:
            return False
        except Exception:  # a bug must not fail the store's write that called us
            _log.exception("internal.error", detail=f"push hub hand-off for {hub.lmq} failed")
            return False

    def _start(self, hub: _Hub) -> None:
        hub.scope = trio.CancelScope()
        self._running += 1
        trio.lowlevel.spawn_system_task(self._run, hub, name=f"mqtt-push-hub {hub.lmq}/{hub.queue_id}")

    def _release(self, hub: _Hub) -> None:
        """The hub's last reader left: end its task, or its store watch."""
        if hub.scope is not None:
            hub.scope.cancel()  # the task's end forgets the hub
            return
        callback, hub.watching = hub.watching, None
        if callback is not None and self._unwatch is not None:
            self._unwatch(hub.lmq, hub.queue_id, callback)
        if self._hubs.get((hub.lmq, hub.queue_id)) is hub:
            del self._hubs[(hub.lmq, hub.queue_id)]

    async def _run(self, hub: _Hub) -> None:
        scope = hub.scope
        assert scope is not None
        watching = False  # the task ends with a store watch in its place: the hub stays
        try:
            with scope:
                while hub.parked:
                    await self._backend.wait_for_message(hub.lmq, hub.queue_id, hub.offset, self._poll_s)
                    if not await self._push_new(hub):
                        break
                    if hub.parked and self._watch_store(hub):
                        watching = True
                        break
        except BackendError as exc:
            _log.warning("internal.error", detail=f"push hub for {hub.lmq} stopped: {exc}")
        except Exception:  # a bug must not kill the process through a system task
            _log.exception("internal.error", detail=f"push hub for {hub.lmq} failed")
        finally:
            hub.scope = None
            self._running -= 1
            if not watching:
                if self._hubs.get((hub.lmq, hub.queue_id)) is hub:
                    del self._hubs[(hub.lmq, hub.queue_id)]
                for parked in list(hub.parked.values()):
                    parked.wake()  # their readers pull on their own now

    async def _push_new(self, hub: _Hub) -> bool:
        """Offer the messages after ``hub.offset`` to every parked reader; False if the hub must stop."""
        result = await self._cache.pull(hub.lmq, hub.queue_id, hub.offset, self._batch)
        self.rounds += 1
        if not result.messages:
            return result.status is not PullStatus.OFFSET_ILLEGAL
        advanced = self._offer(hub, result)
        if advanced is None:
            return False
        for cursor in advanced:
            if cursor.durable and cursor.committed != cursor.stored:
                await cursor.commit(self._backend)  # what the reader's round would have done
        return True

    def _offer(self, hub: _Hub, result: PullResult) -> list[Cursor] | None:
        """Offer ``result`` (messages from ``hub.offset``) to every parked reader and move the hub past
        it: the cursors it advanced, or None (nothing done) for a filtered or holed answer."""
        if result.next_offset - hub.offset != len(result.messages):
            return None  # a filtered or holed answer: leave it to the readers
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
                parked.wake()
                self.woken += 1
        hub.offset = result.next_offset
        return advanced

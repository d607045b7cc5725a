"""
mqproxy.connector.copier
~~~~~~~~~~~~~~~~~~~~~~~~

Copying one source queue into its target queue, exactly once (the protocol is in :mod:`.progress`).

Contracts:

* :meth:`QueueCopier.run` recovers the next source offset from the target (tail of the target queue and of
  the dead-letter queue, and the committed hint), then pulls, filters, translates and sends until
  :attr:`Runtime.stopping` is set, the queue is released, or its lock is no longer known to be held.
* A send happens under the target queue's lock (one batch in flight per target queue, across rules). After
  the acknowledgement, and still under that lock, the hint (the source consumer offset under the
  connector's name) is committed, so the next batch in the target queue follows a committed hint.
* A send whose outcome is unknown: wait ``request_timeout_s`` (an accepted request is stored by then),
  recover from the tail under the same lock and send only what is missing.
* A message refused for good (MESSAGE_ILLEGAL, NO_PERMISSION) goes to the dead-letter topic of the target
  cluster with :data:`.origin.DLQ_REASON` (body left out if that is refused too) and the hint moves past it.
* Every other failure is retried with back-off and reported as ``connector.error``; a stop request ends a
  retry loop (the next start recovers from the target's tail).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import trio

from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.connector.client import ClusterClient, SendUnknown
from mqproxy.connector.origin import (
    DLQ_BODY_DROPPED,
    DLQ_REASON,
    SourceQueue,
    message_id,
    translate,
)
from mqproxy.connector.progress import copies, resume_offset
from mqproxy.connector.rules import ConnectorConfig, Rule, Start
from mqproxy.connector.tail import newest_copy_of
from mqproxy.connector.telemetry import BatchReport, ConnectorMetrics
from mqproxy.model.errors import BrokerRefused, ClusterUnavailable
from mqproxy.model.types import Message, StoredMessage

__all__ = ["QueueCopier", "RuleClusters", "Runtime", "Stopped"]

#: Answers after which a message will never be stored by the target: it becomes a dead letter.
PERMANENT: Final = frozenset({ResponseCode.MESSAGE_ILLEGAL, ResponseCode.NO_PERMISSION})
_HOLD_S: Final = 1.0
_BACKOFF: Final = (0.2, 10.0)


class Stopped(Exception):
    """The copier must end now (stop requested or queue no longer held)."""


@dataclass
class Runtime:
    """What every copier of one process shares."""

    config: ConnectorConfig
    metrics: ConnectorMetrics
    client_id: str
    clusters: dict[str, ClusterClient]
    stopping: trio.Event = field(default_factory=trio.Event)
    target_locks: dict[tuple[str, str, str, int], trio.Lock] = field(default_factory=dict)
    #: source queue -> trio time until which its lock is known to be held
    deadlines: dict[SourceQueue, float] = field(default_factory=dict)

    def target_lock(self, cluster: str, topic: str, broker: str, queue_id: int) -> trio.Lock:
        return self.target_locks.setdefault((cluster, topic, broker, queue_id), trio.Lock())


class RuleClusters:
    """``src`` and ``dst``: the clients of a rule's source and target clusters (needs ``rt`` and ``rule``)."""

    rt: Runtime
    rule: Rule

    @property
    def src(self) -> ClusterClient:
        return self.rt.clusters[self.rule.source]

    @property
    def dst(self) -> ClusterClient:
        return self.rt.clusters[self.rule.target]


@dataclass
class QueueCopier(RuleClusters):
    rt: Runtime
    rule: Rule
    source: SourceQueue
    target_topic: str
    target_broker: str
    target_queue: int
    start: Start
    released: trio.Event = field(default_factory=trio.Event)
    next_offset: int = -1
    max_offset: int = 0
    last_copied_ms: int | None = None
    _failures: int = 0

    @property
    def group(self) -> str:
        return self.rt.config.name

    def _check(self) -> None:
        if self.rt.stopping.is_set() or self.released.is_set():
            raise Stopped("stop requested")
        if trio.current_time() >= self.rt.deadlines.get(self.source, 0.0):
            raise Stopped("queue lock not renewed in time")

    async def _failed(self, cluster: str, op: str, exc: Exception) -> None:
        self._failures += 1
        delay = min(_BACKOFF[1], _BACKOFF[0] * 2 ** (self._failures - 1))
        self.rt.metrics.error(self.rule.label, cluster, op, str(exc), delay)
        with trio.move_on_after(delay):
            await self.rt.stopping.wait()
        self._check()

    # --- progress -------------------------------------------------------------------------------

    async def _scan(self, topic: str, broker: str, queue_id: int) -> int | None:
        """The newest origin offset of this source queue in a target queue (bounded by recovery_scan)."""
        limit = self.rt.config.recovery_scan
        return await newest_copy_of(self.dst, self.group, topic, broker, queue_id, self.source, limit)

    async def _dlq_queue(self) -> tuple[str, int] | None:
        route = await self.dst.route(self.rt.config.dlq_topic)
        if route is None:
            return None
        share = min(route.brokers.values(), key=lambda s: s.broker)
        return share.broker, 0

    async def recover(self) -> int:
        """The next source offset to copy (see the module contracts); commits it when newly chosen."""
        s = self.source
        found = await self._scan(self.target_topic, self.target_broker, self.target_queue)
        dlq = await self._dlq_queue()
        if dlq is not None:
            dead = await self._scan(self.rt.config.dlq_topic, *dlq)
            found = dead if found is None or (dead is not None and dead > found) else found
        hint = await self.src.query_offset(self.group, s.topic, s.broker, s.queue_id)
        resume = resume_offset(found, hint)
        if resume is None:
            if self.start.kind == "earliest":
                resume = await self.src.min_offset(s.topic, s.broker, s.queue_id)
            elif self.start.kind == "timestamp":
                resume = await self.src.search_offset(s.topic, s.broker, s.queue_id, self.start.timestamp_ms)
            else:
                resume = await self.src.max_offset(s.topic, s.broker, s.queue_id)
            await self.src.commit_offset(self.group, s.topic, s.broker, s.queue_id, resume)
        return resume

    async def _commit(self, offset: int) -> None:
        s = self.source
        while True:
            try:
                await self.src.commit_offset(self.group, s.topic, s.broker, s.queue_id, offset)
                return
            except (ClusterUnavailable, BrokerRefused) as exc:
                await self._failed(self.rule.source, "commit", exc)

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while self.next_offset < 0:
                self._check()
                try:
                    self.next_offset = await self.recover()
                except (ClusterUnavailable, BrokerRefused) as exc:
                    await self._failed(self.rule.target, "recover", exc)
            while True:
                self._check()
                await self._step()
        except Stopped:
            return

    async def _step(self) -> None:
        s = self.source
        try:
            pulled = await self.src.pull(
                self.group,
                s.topic,
                s.broker,
                s.queue_id,
                self.next_offset,
                self.rt.config.batch_messages,
                _HOLD_S,
            )
        except (ClusterUnavailable, BrokerRefused) as exc:
            await self._failed(self.rule.source, "pull", exc)
            return
        self._failures = 0
        self.max_offset = pulled.max_offset
        if pulled.moved:
            self.next_offset = pulled.next_offset
            await self._commit(self.next_offset)
            return
        if not pulled.messages:
            return
        chosen = [m for m in pulled.messages if copies(self.rule, m, self.dst.spec.id)]
        for chunk in self._chunks(chosen):
            await self._deliver(chunk)
        if pulled.next_offset > self.next_offset:
            self.next_offset = pulled.next_offset
            if not chosen or chosen[-1].queue_offset + 1 < self.next_offset:
                await self._commit(self.next_offset)  # a filtered run: move the hint past it

    def _chunks(self, messages: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
        """Batches by size; a compressed body goes alone (a batch has one sysFlag)."""
        limit, count = self.rt.config.batch_bytes, self.rt.config.batch_messages
        chunks: list[list[StoredMessage]] = []
        size = 0
        for m in messages:
            alone = bool(m.sys_flag & 0x1)
            if (
                not chunks
                or alone
                or size + len(m.body) > limit
                or len(chunks[-1]) >= count
                or chunks[-1][0].sys_flag & 0x1
            ):
                chunks.append([])
                size = 0
            chunks[-1].append(m)
            size += len(m.body)
        return chunks

    # --- sending --------------------------------------------------------------------------------

    async def _deliver(self, chunk: list[StoredMessage]) -> None:
        lock = self.rt.target_lock(self.dst.spec.id, self.target_topic, self.target_broker, self.target_queue)
        async with lock:
            pending = chunk
            while pending:
                self._check()
                copies_ = [translate(m, self.source, self.target_topic, self.target_queue) for m in pending]
                try:
                    await self.dst.send(self.target_broker, self.target_queue, copies_, self.group)
                except SendUnknown as exc:
                    self.rt.metrics.error(
                        self.rule.label, self.rule.target, "send", str(exc), self.rt.config.request_timeout_s
                    )
                    pending = await self._after_unknown(pending)
                    continue
                except ClusterUnavailable as exc:
                    await self._failed(self.rule.target, "send", exc)
                    continue
                except BrokerRefused as exc:
                    if exc.code in PERMANENT:
                        if len(pending) > 1:
                            for one in pending:
                                await self._deliver_one(one)
                            return
                        await self._dead_letter(pending[0], copies_[0], exc)
                        await self._commit(pending[0].queue_offset + 1)
                        return
                    if exc.code == ResponseCode.TOPIC_NOT_EXIST:
                        self._failures += 1
                    await self._failed(self.rule.target, "send", exc)
                    continue
                self._failures = 0
                self._acked(pending, copies_)
                await self._commit(pending[-1].queue_offset + 1)
                return

    async def _deliver_one(self, message: StoredMessage) -> None:
        """One message of a refused batch, under the target lock already held."""
        while True:
            self._check()
            copy = translate(message, self.source, self.target_topic, self.target_queue)
            try:
                await self.dst.send(self.target_broker, self.target_queue, [copy], self.group)
            except SendUnknown as exc:
                self.rt.metrics.error(
                    self.rule.label, self.rule.target, "send", str(exc), self.rt.config.request_timeout_s
                )
                if not await self._after_unknown([message]):
                    return
                continue
            except ClusterUnavailable as exc:
                await self._failed(self.rule.target, "send", exc)
                continue
            except BrokerRefused as exc:
                if exc.code not in PERMANENT:
                    await self._failed(self.rule.target, "send", exc)
                    continue
                await self._dead_letter(message, copy, exc)
                await self._commit(message.queue_offset + 1)
                return
            self._acked([message], [copy])
            await self._commit(message.queue_offset + 1)
            return

    async def _after_unknown(self, pending: list[StoredMessage]) -> list[StoredMessage]:
        """What of ``pending`` is not in the target yet, found from the tail after the fence wait."""
        await trio.sleep(self.rt.config.request_timeout_s)
        while True:
            self._check()
            try:
                resume = await self.recover()
                break
            except (ClusterUnavailable, BrokerRefused) as exc:
                await self._failed(self.rule.target, "recover", exc)
        done = [m for m in pending if m.queue_offset < resume]
        if done:
            self._acked(done, [translate(m, self.source, self.target_topic, self.target_queue) for m in done])
        return [m for m in pending if m.queue_offset >= resume]

    def _acked(self, sent: list[StoredMessage], copies_: list[Message]) -> None:
        self.last_copied_ms = int(time.time() * 1000)
        self.rt.metrics.batch(
            BatchReport(
                rule=self.rule.label,
                source=self.rule.source,
                target=self.rule.target,
                topic=self.source.topic,
                target_topic=self.target_topic,
                source_queue=self.source.key,
                target_queue=f"{self.target_broker}:{self.target_queue}",
                messages=len(sent),
                bytes=sum(len(m.body) for m in sent),
                first_offset=sent[0].queue_offset,
                last_offset=sent[-1].queue_offset,
                store_ms=tuple(m.store_timestamp_ms for m in sent),
            )
        )

    async def _dead_letter(self, message: StoredMessage, copy: Message, refusal: BrokerRefused) -> None:
        reason = f"{refusal.code}: {refusal.remark}"[:1000]
        dlq_topic = self.rt.config.dlq_topic
        dead = Message(
            dlq_topic,
            copy.body,
            0,
            flag=copy.flag,
            properties={**copy.properties, DLQ_REASON: reason},
            sys_flag=copy.sys_flag,
            born_timestamp_ms=copy.born_timestamp_ms,
        )
        while True:
            self._check()
            try:
                queue = await self._dlq_queue()
                if queue is None:
                    await self.dst.create_topic(dlq_topic, 1)
                    continue
                await self.dst.send(queue[0], queue[1], [dead], self.group)
                break
            except BrokerRefused as exc:
                if exc.code == ResponseCode.MESSAGE_ILLEGAL and dead.body:
                    dead.properties[DLQ_BODY_DROPPED] = str(len(dead.body))
                    dead.body = b""
                    continue
                await self._failed(self.rule.target, "dead_letter", exc)
            except (ClusterUnavailable, SendUnknown) as exc:
                await self._failed(self.rule.target, "dead_letter", exc)
        self.rt.metrics.dead_letter(
            self.rule.label,
            self.source.topic,
            self.source.key,
            message.queue_offset,
            message_id(message),
            reason,
            dlq_topic,
        )

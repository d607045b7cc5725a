"""
mqproxy.connector.runner
~~~~~~~~~~~~~~~~~~~~~~~~

The trio side of ``mqproxy connect``: one :class:`RuleRunner` per rule, one :class:`~.copier.QueueCopier`
per source queue this process owns.

Contracts:

* Every ``min(refresh_s, lock_ttl_s / 3)`` seconds (and when a source broker says the group changed) a
  rule runner lists its source topics (a regex rule: from the name servers' topic list), creates missing
  target topics with the source's queue count, heartbeats the connector's consumer group on the source,
  splits the source queues between the group's live members (:func:`.progress.allocate`), and locks its
  share (LOCK_BATCH_MQ, client id per process). A queue is copied only while its lock is known to be held
  (renewed before ``lock_ttl_s``); a queue no longer held or no longer assigned is released after its
  batch in flight, then unlocked.
* A rule with ``groups`` also runs a :class:`~.checkpointer.Checkpointer` (consumer-offset translation)
  over the same layout and the queues this process owns.
* A topic a regex rule finds after its first listing starts at ``earliest`` (it is new: all of it is to be
  copied); topics present at the first listing start at the rule's ``start``.
* :func:`run_connector` runs until SIGTERM/SIGINT (or ``stop`` set): copiers finish their batch in flight
  and record progress, locks are released, ``connector.stopped`` is logged.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import uuid
from contextlib import AsyncExitStack
from typing import Final

import structlog
import trio

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode
from mqproxy.connector.checkpointer import Checkpointer
from mqproxy.connector.client import ClusterClient
from mqproxy.connector.copier import QueueCopier, RuleClusters, Runtime
from mqproxy.connector.origin import SourceQueue
from mqproxy.connector.progress import allocate, target_queue_for
from mqproxy.connector.rules import ConnectorConfig, Rule, Start
from mqproxy.connector.telemetry import ConnectorMetrics, serve_metrics
from mqproxy.model.errors import BrokerRefused, ClusterUnavailable
from mqproxy.remoting_client import ClientConfig, open_pool

__all__ = ["RuleRunner", "run_connector"]

log = structlog.get_logger("mqproxy.connector")
_EARLIEST: Final = Start("earliest")
#: Share of the lock time-to-live after which a lock not renewed is no longer trusted.
_LOCK_TRUST: Final = 0.8


class RuleRunner(RuleClusters):
    def __init__(self, rt: Runtime, rule: Rule, changed: trio.Event) -> None:
        self.rt = rt
        self.rule = rule
        self.changed = changed
        self.copiers: dict[SourceQueue, QueueCopier] = {}
        self._initial: set[str] | None = None
        self._failures = 0
        self._known_targets: set[str] | None = None
        self.layout: dict[SourceQueue, tuple[str, str, int]] = {}

    async def _topics(self) -> list[str]:
        if self.rule.pattern is None:
            return [self.rule.topic]
        return [t for t in await self.src.topics() if self.rule.matches_topic(t)]

    async def _target_topics(self) -> set[str]:
        if self._known_targets is None:
            self._known_targets = set(await self.dst.topics())
        return self._known_targets

    async def _layout(self) -> dict[SourceQueue, tuple[str, str, int]]:
        """Source queue → (target topic, target broker, target queue id)."""
        layout: dict[SourceQueue, tuple[str, str, int]] = {}
        self._known_targets = None
        for topic in await self._topics():
            route = await self.src.route(topic)
            if route is None:
                continue
            sources = sorted(
                (share.broker, q)
                for share in route.brokers.values()
                for q in range(share.read_queues)
                if share.readable(q)
            )
            if not sources:
                continue
            target_topic = self.rule.target_of(topic)
            # the topic list, not the route: an mqproxy node creates a topic a route is asked for
            troute = (
                await self.dst.route(target_topic) if target_topic in await self._target_topics() else None
            )
            if troute is None:
                masters = await self.dst.masters()
                per_broker = max(1, math.ceil(len(sources) / max(1, len(masters))))
                await self.dst.create_topic(target_topic, per_broker)
                log.info(
                    "connector.topic_created",
                    connector=self.rt.config.name,
                    rule=self.rule.label,
                    topic=target_topic,
                    queues=per_broker * len(masters),
                )
                troute = await self.dst.route(target_topic)
                if troute is None:
                    raise ClusterUnavailable(f"{self.dst.name}: {target_topic} has no route after creation")
            targets = sorted(
                (share.broker, q)
                for share in troute.brokers.values()
                for q in range(share.write_queues)
                if share.writable(q)
            )
            for index, (broker, queue_id) in enumerate(sources):
                tb, tq = target_queue_for(index, targets)
                layout[SourceQueue(self.src.spec.id, topic, broker, queue_id)] = (target_topic, tb, tq)
        return layout

    async def _balance(self, nursery: trio.Nursery) -> None:
        layout = self.layout = await self._layout()
        topics = sorted({q.topic for q in layout})
        if self._initial is None:
            self._initial = set(topics)
        group, me = self.rt.config.name, self.rt.client_id
        await self.src.heartbeat(me, group, topics)
        members = await self.src.members(group)
        mine = allocate(sorted(layout), members, me)
        asked_at = trio.current_time()
        held = await self.src.lock(group, me, [(q.topic, q.broker, q.queue_id) for q in mine])
        owned = {q for q in mine if (q.topic, q.broker, q.queue_id) in held}
        for q in owned:
            self.rt.deadlines[q] = asked_at + self.rt.config.lock_ttl_s * _LOCK_TRUST
        acquired, released = [], []
        for q in sorted(owned - set(self.copiers)):
            start = self.rule.start if q.topic in self._initial else _EARLIEST
            target_topic, tb, tq = layout[q]
            copier = QueueCopier(self.rt, self.rule, q, target_topic, tb, tq, start)
            self.copiers[q] = copier
            nursery.start_soon(self._run_copier, copier)
            acquired.append(f"{q.topic}@{q.key}")
        for q in sorted(set(self.copiers) - owned):
            self.copiers[q].released.set()
            released.append(f"{q.topic}@{q.key}")
        if acquired or released:
            self.rt.metrics.queues(self.rule.label, len(owned), acquired, released)

    async def _run_copier(self, copier: QueueCopier) -> None:
        q = copier.source
        try:
            await copier.run()
        finally:
            if self.copiers.get(q) is copier:
                del self.copiers[q]
            self.rt.deadlines.pop(q, None)
            self.rt.metrics.drop_lag(self.rule.label, q.topic, q.key)
            with trio.move_on_after(self.rt.config.request_timeout_s) as scope:
                scope.shield = True
                try:
                    await self.src.unlock(
                        self.rt.config.name, self.rt.client_id, [(q.topic, q.broker, q.queue_id)]
                    )
                except (ClusterUnavailable, BrokerRefused):
                    pass  # the lock expires on its own

    async def _report_lag(self) -> None:
        while True:
            await trio.sleep(self.rt.config.lag_interval_s)
            for q, c in list(self.copiers.items()):
                if c.next_offset >= 0:
                    lag = max(0, c.max_offset - c.next_offset)
                    self.rt.metrics.set_lag(self.rule.label, q.topic, q.key, lag, c.last_copied_ms)

    async def run(self) -> None:
        period = min(self.rt.config.refresh_s, self.rt.config.lock_ttl_s / 3)
        async with trio.open_nursery() as copiers:
            async with trio.open_nursery() as side:
                side.start_soon(self._report_lag)
                if self.rule.groups:
                    checkpointer = Checkpointer(
                        self.rt, self.rule, lambda: self.layout, lambda: set(self.copiers)
                    )
                    side.start_soon(checkpointer.run)
                while not self.rt.stopping.is_set():
                    wait = period
                    try:
                        await self._balance(copiers)
                        self._failures = 0
                    except (ClusterUnavailable, BrokerRefused) as exc:
                        self._failures += 1
                        wait = min(period, 0.2 * 2 ** (self._failures - 1), 10.0)
                        cluster = (
                            self.rule.target
                            if str(exc).startswith(f"{self.rule.target}:")
                            else self.rule.source
                        )
                        self.rt.metrics.error(self.rule.label, cluster, "rebalance", str(exc), wait)
                    with trio.move_on_after(wait):
                        async with trio.open_nursery() as waiter:

                            async def until(event: trio.Event) -> None:
                                await event.wait()
                                waiter.cancel_scope.cancel()

                            waiter.start_soon(until, self.rt.stopping)
                            waiter.start_soon(until, self.changed)
                    if self.changed.is_set():
                        self.changed = trio.Event()
                side.cancel_scope.cancel()
            for copier in self.copiers.values():
                copier.released.set()


def _client_id() -> str:
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


async def run_connector(
    config: ConnectorConfig,
    metrics_at: tuple[str, int] | None = None,
    *,
    stop: trio.Event | None = None,
    task_status: trio.TaskStatus[str | None] = trio.TASK_STATUS_IGNORED,
) -> str:
    """Run until stopped; returns the reason. ``task_status.started`` gets the bound metrics address."""
    metrics = ConnectorMetrics(config.name)
    runners: dict[str, list[RuleRunner]] = {}

    def notified(cluster: str):  # type: ignore[no-untyped-def]
        async def handle(request: RemotingCommand) -> RemotingCommand | None:
            if request.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
                for runner in runners.get(cluster, []):
                    runner.changed.set()
            return None

        return handle

    reason = "signal"
    async with AsyncExitStack() as stack:
        clients = {}
        for name, spec in config.clusters.items():
            client_config = ClientConfig(
                request_timeout_s=config.request_timeout_s,
                access_key=spec.access_key,
                secret_key=spec.secret_key,
            )
            pool = await stack.enter_async_context(open_pool(client_config, notified(name)))
            clients[name] = ClusterClient(spec, pool, config.request_timeout_s)
        rt = Runtime(config, metrics, _client_id(), clients)
        async with trio.open_nursery() as nursery:
            bound = None
            if metrics_at is not None:
                bound = await nursery.start(serve_metrics, metrics, *metrics_at)
            fields = {"listen": bound} if bound else {}
            log.info("connector.started", connector=config.name, rules=len(config.rules), **fields)
            task_status.started(bound)

            async def watch_signals() -> None:
                nonlocal reason
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        reason = signal.Signals(signum).name
                        rt.stopping.set()
                        return

            async def watch_stop() -> None:
                nonlocal reason
                if stop is not None:
                    await stop.wait()
                    reason = "stop"
                    rt.stopping.set()

            nursery.start_soon(watch_signals)
            nursery.start_soon(watch_stop)
            async with trio.open_nursery() as rules:
                for rule in config.rules:
                    runner = RuleRunner(rt, rule, trio.Event())
                    runners.setdefault(rule.source, []).append(runner)
                    rules.start_soon(runner.run)
            nursery.cancel_scope.cancel()
    log.info("connector.stopped", connector=config.name, rules=len(config.rules), reason=reason)
    return reason

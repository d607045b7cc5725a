"""
mqproxy.connector.checkpointer
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The trio side of consumer-offset translation (:mod:`.checkpoint` holds the rules): every
``checkpoint_interval_s`` a rule with ``groups`` translates each selected group's committed source offsets
and writes them on the target (UPDATE_CONSUMER_OFFSET on the target queue's broker; the client creates
the subscription group where a stock broker wants it first).

Contracts:

* Groups: the rule's exact names, plus the groups the source brokers list for the topic
  (QUERY_TOPIC_CONSUME_BY_WHO) that match a ``re:`` entry; never the connector's own group.
* A target queue is handled by the process that owns the first (sorted) source queue mapped to it, so
  processes sharing the work do not write the same offsets. All source queues feeding it are translated
  from one backwards scan of at most ``checkpoint_scan`` messages; the smallest translation is written,
  and only when it is ahead of the target group's offset there.
* "Copied through" is the connector's own committed offset on the source (recorded after every
  acknowledged batch and past filtered runs): a group is not moved past copies still to come.
* Nothing is rescanned while a group's source offsets for a target queue stay the same as at its last
  decided translation. Failures are reported as ``connector.error`` (op ``checkpoint``) and retried next
  round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import trio

from mqproxy.connector.checkpoint import TailScan, advances, merge_target, translate_offset
from mqproxy.connector.copier import RuleClusters, Runtime
from mqproxy.connector.origin import SourceQueue
from mqproxy.connector.rules import Rule
from mqproxy.connector.tail import windows_newest_first
from mqproxy.connector.telemetry import Checkpoint
from mqproxy.model.errors import BrokerRefused, ClusterUnavailable

__all__ = ["Checkpointer"]

TargetQueue = tuple[str, str, int]


class Checkpointer(RuleClusters):
    """Offset translation for one rule; ``layout`` and ``owned`` read the rule runner's current view."""

    def __init__(
        self,
        rt: Runtime,
        rule: Rule,
        layout: Callable[[], Mapping[SourceQueue, TargetQueue]],
        owned: Callable[[], set[SourceQueue]],
    ) -> None:
        self.rt = rt
        self.rule = rule
        self.layout = layout
        self.owned = owned
        #: (group, target queue) -> source offsets at the last decided translation
        self._done: dict[tuple[str, TargetQueue], tuple[int, ...]] = {}

    async def run(self) -> None:
        while not self.rt.stopping.is_set():
            with trio.move_on_after(self.rt.config.checkpoint_interval_s):
                await self.rt.stopping.wait()
            if self.rt.stopping.is_set():
                return
            try:
                await self.round()
            except (ClusterUnavailable, BrokerRefused) as exc:
                cluster = (
                    self.rule.target if str(exc).startswith(f"{self.rule.target}:") else self.rule.source
                )
                self.rt.metrics.error(
                    self.rule.label, cluster, "checkpoint", str(exc), self.rt.config.checkpoint_interval_s
                )

    def _mine(self) -> dict[TargetQueue, list[SourceQueue]]:
        feeds: dict[TargetQueue, list[SourceQueue]] = {}
        for source, target in self.layout().items():
            feeds.setdefault(target, []).append(source)
        owned = self.owned()
        return {t: sorted(s) for t, s in feeds.items() if min(s) in owned}

    async def _groups(self, topic: str) -> list[str]:
        exact = [g for g in self.rule.groups if not g.startswith("re:")]
        listed = await self.src.groups_of(topic) if len(exact) < len(self.rule.groups) else []
        chosen = set(exact) | {g for g in listed if self.rule.matches_group(g)}
        chosen.discard(self.rt.config.name)
        return sorted(chosen)

    async def round(self) -> None:
        """One translation of every selected group on every target queue this process handles."""
        mine = self._mine()
        groups = {topic: await self._groups(topic) for topic in sorted({s[0].topic for s in mine.values()})}
        for target, sources in sorted(mine.items()):
            for group in groups[sources[0].topic]:
                await self._translate(group, target, sources)

    async def _translate(self, group: str, target: TargetQueue, sources: list[SourceQueue]) -> None:
        committed: list[int] = []
        for s in sources:
            offset = await self.src.query_offset(group, s.topic, s.broker, s.queue_id)
            if offset is None:
                return  # the group has not consumed this queue: nothing to carry over
            committed.append(offset)
        key = (group, target)
        if self._done.get(key) == tuple(committed):
            return
        name = self.rt.config.name
        copied = [await self.src.query_offset(name, s.topic, s.broker, s.queue_id) for s in sources]
        topic, broker, queue_id = target
        high = await self.dst.max_offset(topic, broker, queue_id)
        low = await self.dst.min_offset(topic, broker, queue_id)
        limit = self.rt.config.checkpoint_scan
        scans = [TailScan(s, c) for s, c in zip(sources, committed, strict=True)]
        async for window in windows_newest_first(self.dst, name, topic, broker, queue_id, limit):
            if all([scan.feed(window) for scan in scans if not scan.decided]):
                break
        whole = high - low <= limit
        offsets = [
            translate_offset(scan, whole_queue=whole, copied_through=c, high=high)
            for scan, c in zip(scans, copied, strict=True)
        ]
        found = merge_target(offsets)
        if found is None:
            return
        current = await self.dst.query_offset(group, topic, broker, queue_id)
        if advances(found, current):
            await self.dst.commit_offset(group, topic, broker, queue_id, found)
        self._done[key] = tuple(committed)
        if not advances(found, current):
            return
        for s, c in zip(sources, committed, strict=True):
            self.rt.metrics.checkpoint(
                Checkpoint(self.rule.label, group, s.topic, s.key, c, topic, f"{broker}:{queue_id}", found)
            )

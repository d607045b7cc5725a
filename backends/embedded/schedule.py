"""Delayed delivery: delay levels (``DELAY``) and deliver-at timestamps (``TIMER_*``), spec §7.3.

A delayed message is parked in :data:`SCHEDULE_TOPIC` queue ``level - 1`` with ``REAL_TOPIC`` /
``REAL_QID`` and the time its hop is due (``SCHEDULE_DUE_MS``). Every level queue is FIFO in due time
(same delay, parked in clock order), so one task per level only ever looks at the queue head. When the
head is due it is re-sent to its real topic and queue (``DELAY`` and the internal keys removed) and the
level's progress is committed as the consumer offset of :data:`SCHEDULE_GROUP` on that queue: a restart
resumes there, so each message is delivered once (a crash between the re-send and the commit can
repeat that one message, as in RocketMQ).

Deliver-at messages (``TIMER_DELIVER_MS`` absolute ms, or ``TIMER_DELAY_SEC`` / ``TIMER_DELAY_MS``
relative, at most ``max_timer_delay_ms``) cascade through the levels: each hop uses the longest level not
past the deadline (the shortest level's hop is cut to the deadline), so delivery is never early and at
most one hop of the shortest level late. ``DELAY`` wins when both are set. Level 0 or below means no
delay; levels above the highest are clamped to it (as the Java broker does).

Recall (RocketMQ 5 ``RecallMessage``): a deliver-at message gets a recall handle (:func:`recall_handle`:
RocketMQ's v1 layout of topic, broker name, deliver-at and ``UNIQ_KEY``). :meth:`Scheduler.recall` before
the deliver-at time appends a record to :data:`RECALL_TOPIC` and marks (topic, ``UNIQ_KEY``) recalled in
memory; the level tasks drop a recalled parked message at its next hop instead of re-sending it.
:meth:`Scheduler.start` replays the whole recall topic, so a recall survives a restart. Recalled keys stay
in memory (one small entry per recall).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
import trio

from mqproxy.backends.embedded import internal_topics
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.model.errors import (
    BackendError,
    InvalidArgument,
    InvalidDelay,
    MessageNotFound,
    QueueNotFound,
    StoreUnavailable,
)
from mqproxy.model.properties import (
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SCHEDULE_DUE_MS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    SCHEDULE_GROUP,
    SCHEDULE_TOPIC,
)
from mqproxy.model.topics import validate_send_topic
from mqproxy.model.types import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_UNIQ_KEY,
    Message,
    PullStatus,
    SendResult,
    StoredMessage,
)

#: RocketMQ ``messageDelayLevel`` default: levels 1..18.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: Longest deliver-at delay accepted (RocketMQ ``timerMaxDelaySec``: 3 days).
DEFAULT_MAX_TIMER_DELAY_MS = 3 * 24 * 3600 * 1000
#: Messages read from a level queue per pull.
_BATCH = 32
#: Pause before retrying after the store refused a write.
_RETRY_PAUSE_S = 1.0
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"(\d+)(ms|s|m|h|d)")

_log = structlog.get_logger("mqproxy.schedule")

#: Recall records: one message per recalled parked message (``REAL_TOPIC``, :data:`PROPERTY_RECALLED_KEY`,
#: ``TIMER_DELIVER_MS``), replayed at start.
RECALL_TOPIC = "rmq_sys_SCHEDULE_RECALL"
#: The ``UNIQ_KEY`` of the recalled message, on a recall record.
PROPERTY_RECALLED_KEY = "RECALLED_UNIQ_KEY"
_RECALL_VERSION = "v1"
_MAX_HANDLE_CHARS = 1024


@dataclass(frozen=True, slots=True)
class RecallHandle:
    """What a recall handle names: the real topic, the message's ``UNIQ_KEY`` and its deliver-at time
    (and the broker it was parked on; empty for handles of the older four-field layout)."""

    topic: str
    message_id: str
    deliver_at_ms: int
    broker_name: str = ""


def recall_handle(topic: str, message_id: str, deliver_at_ms: int, *, broker_name: str) -> str:
    """The opaque handle a producer gets for a deliver-at message: RocketMQ's v1 layout
    (``RecallMessageHandle.HandleV1``), ``"v1 <topic> <brokerName> <deliver-at ms> <UNIQ_KEY>"`` in URL-safe
    base64 with padding, so a handle reads the same whichever server issued it."""
    raw = f"{_RECALL_VERSION} {topic} {broker_name} {deliver_at_ms} {message_id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def parse_recall_handle(handle: str) -> RecallHandle:
    """Inverse of :func:`recall_handle` (padding optional); also reads the four-field layout earlier
    versions issued (``"v1 <topic> <deliver-at ms> <UNIQ_KEY>"``). :class:`InvalidArgument` otherwise."""
    if not handle or len(handle) > _MAX_HANDLE_CHARS:
        raise InvalidArgument("recall handle is empty or too long")
    try:
        bare = handle.rstrip("=")
        padded = (bare + "=" * (-len(bare) % 4)).encode("ascii")
        raw = base64.b64decode(padded, altchars=b"-_", validate=True).decode("utf-8")
    except (binascii.Error, ValueError):  # UnicodeError is a ValueError
        raise InvalidArgument("recall handle does not decode") from None
    parts = raw.split(" ")
    if len(parts) == 4:  # the earlier layout, without the broker name
        parts.insert(2, "")
    version, topic, broker_name, deliver_at, message_id = parts if len(parts) == 5 else ("",) * 5
    if version != _RECALL_VERSION or not deliver_at.isdigit() or not topic or not message_id:
        raise InvalidArgument("malformed recall handle")
    return RecallHandle(topic, message_id, int(deliver_at), broker_name)


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """Delays in ms of ``"1s 5s 10s ..."`` (units ms/s/m/h/d); ValueError unless strictly increasing."""
    levels: list[int] = []
    for word in text.split():
        match = _LEVEL.fullmatch(word)
        if match is None:
            raise ValueError(f"bad delay level {word!r}: expected <number><ms|s|m|h|d>")
        levels.append(int(match[1]) * _UNITS[match[2]])
    if not levels or any(d <= 0 for d in levels) or any(a >= b for a, b in itertools.pairwise(levels)):
        raise ValueError("delay levels must be positive and strictly increasing")
    return tuple(levels)


def _int_property(properties: dict[str, str], key: str) -> int | None:
    raw = properties.get(key)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise InvalidDelay(f"{key}={raw[:32]!r} is not an integer") from None


class Scheduler:
    """Parks delayed messages and re-sends them when due. Call :meth:`start` before :meth:`send`."""

    def __init__(
        self,
        backend: MessageStore,
        *,
        delay_levels: str | Sequence[int] = DEFAULT_DELAY_LEVELS,
        max_timer_delay_ms: int = DEFAULT_MAX_TIMER_DELAY_MS,
        now_ms: internal_topics.Clock = internal_topics.wall_clock_ms,
    ) -> None:
        self._backend = backend
        self.levels_ms: tuple[int, ...] = (
            parse_delay_levels(delay_levels) if isinstance(delay_levels, str) else tuple(delay_levels)
        )
        self.max_timer_delay_ms = max_timer_delay_ms
        self._now_ms = now_ms
        self.delivered = 0  # messages re-sent to their real topic since start (for metrics)
        self.dropped_recalled = 0  # recalled parked messages dropped since start
        self._recalled: set[tuple[str, str]] = set()  # (real topic, UNIQ_KEY)

    @property
    def max_level(self) -> int:
        return len(self.levels_ms)

    def clamp_level(self, level: int) -> int:
        """0 for no delay (level <= 0), else ``level`` capped at :attr:`max_level`."""
        return 0 if level <= 0 else min(level, self.max_level)

    def delay_ms(self, level: int) -> int:
        """The delay of ``level`` after clamping (0 for no delay)."""
        clamped = self.clamp_level(level)
        return 0 if clamped == 0 else self.levels_ms[clamped - 1]

    async def start(self) -> None:
        """Create the schedule topic (one queue per level) and the recall topic; replay the recalls."""
        await internal_topics.ensure_topic(self._backend, SCHEDULE_TOPIC, self.max_level)
        await internal_topics.ensure_topic(self._backend, RECALL_TOPIC, 1)
        offset = await self._backend.min_offset(RECALL_TOPIC, 0)

        def remember(records: Sequence[StoredMessage], _end: int) -> None:
            for record in records:
                topic = record.properties.get(PROPERTY_REAL_TOPIC, "")
                key = record.properties.get(PROPERTY_RECALLED_KEY, "")
                if topic and key:
                    self._recalled.add((topic, key))

        await internal_topics.read_to_end(self._backend, RECALL_TOPIC, 0, offset, _BATCH, remember)

    # --- recall --------------------------------------------------------------------------------
    async def recall(self, topic: str, handle: str) -> str:
        """Cancel the deliver-at message ``handle`` names (of ``topic``); returns its ``UNIQ_KEY``.

        Durable once it returns. Raises :class:`InvalidArgument` for a malformed handle or one of another
        topic, :class:`MessageNotFound` once the deliver-at time has passed (delivered or about to be).
        Recalling twice is not an error.
        """
        target = parse_recall_handle(handle)
        if target.topic != topic:
            raise InvalidArgument(f"recall handle is for topic {target.topic[:64]!r}, not {topic[:64]!r}")
        if target.deliver_at_ms <= self._now_ms():
            raise MessageNotFound("message already delivered, recall is too late")
        key = (topic, target.message_id)
        if key in self._recalled:
            return target.message_id
        # Marked before the record is written: a level task that fires meanwhile already honours it.
        self._recalled.add(key)
        record = Message(
            topic=RECALL_TOPIC,
            body=b"",
            queue_id=0,
            properties={
                PROPERTY_REAL_TOPIC: topic,
                PROPERTY_RECALLED_KEY: target.message_id,
                PROPERTY_TIMER_DELIVER_MS: str(target.deliver_at_ms),
            },
        )
        try:
            await self._backend.send(record)
        except BaseException:
            self._recalled.discard(key)
            raise
        return target.message_id

    def is_recalled(self, topic: str, message_id: str) -> bool:
        return (topic, message_id) in self._recalled

    # --- produce -------------------------------------------------------------------------------
    async def send(self, message: Message) -> SendResult:
        """Store ``message``: parked if it carries a delay, else straight to its topic.

        Raises :class:`InvalidDelay` for a non-numeric ``DELAY``/``TIMER_*`` or a deliver-at too far out.
        """
        parked = self.park(message)
        return await self._backend.send(parked if parked is not None else message)

    def park(self, message: Message) -> Message | None:
        """The parked form of ``message`` (not stored), or None when it is not delayed."""
        props = message.properties
        now = self._now_ms()
        level = _int_property(props, PROPERTY_DELAY_LEVEL)
        if level is not None and level > 0:
            return self._parked(message, self.clamp_level(level), now + self.delay_ms(level), None)
        deliver_at = self._deliver_at(props, now)
        if deliver_at is None or deliver_at <= now:
            return None
        if deliver_at - now > self.max_timer_delay_ms:
            raise InvalidDelay(f"deliver-at is {deliver_at - now} ms away, limit {self.max_timer_delay_ms}")
        level, due = self._hop(deliver_at, now)
        return self._parked(message, level, due, deliver_at)

    def _deliver_at(self, props: dict[str, str], now: int) -> int | None:
        at = _int_property(props, PROPERTY_TIMER_DELIVER_MS)
        if at is not None:
            return at
        sec = _int_property(props, PROPERTY_TIMER_DELAY_SEC)
        if sec is not None:
            return now + sec * 1000
        ms = _int_property(props, PROPERTY_TIMER_DELAY_MS)
        return None if ms is None else now + ms

    def _hop(self, deliver_at: int, now: int) -> tuple[int, int]:
        """(level, due) of the next hop towards ``deliver_at``: the longest level not past it."""
        remaining = deliver_at - now
        level = 1
        for index, delay in enumerate(self.levels_ms, start=1):
            if delay <= remaining:
                level = index
        return level, min(now + self.levels_ms[level - 1], deliver_at)

    def _parked(self, message: Message, level: int, due: int, deliver_at: int | None) -> Message:
        validate_send_topic(message.topic)
        props = dict(message.properties)
        props.setdefault(PROPERTY_REAL_TOPIC, message.topic)
        props.setdefault(PROPERTY_REAL_QID, str(message.queue_id))
        props[PROPERTY_SCHEDULE_DUE_MS] = str(due)
        if deliver_at is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_at)
            props.pop(PROPERTY_TIMER_DELAY_SEC, None)
            props.pop(PROPERTY_TIMER_DELAY_MS, None)
        return Message(
            topic=SCHEDULE_TOPIC,
            body=message.body,
            queue_id=level - 1,
            flag=message.flag,
            properties=props,
            sys_flag=message.sys_flag,
            born_timestamp_ms=message.born_timestamp_ms,
            born_host=message.born_host,
            reconsume_times=message.reconsume_times,
        )

    # --- deliver -------------------------------------------------------------------------------
    async def pending(self) -> int:
        """Parked messages not yet due-and-delivered (all levels)."""
        total = 0
        for qid in range(self.max_level):
            done = await self._committed(qid)
            total += await self._backend.max_offset(SCHEDULE_TOPIC, qid) - done
        return total

    async def _committed(self, qid: int) -> int:
        offset = await self._backend.query_consumer_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid)
        if offset is None:
            return await self._backend.min_offset(SCHEDULE_TOPIC, qid)
        return offset

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver due messages until cancelled (one task per level queue)."""
        await self.start()
        async with trio.open_nursery() as nursery:
            for qid in range(self.max_level):
                nursery.start_soon(self._run_level, qid)
            task_status.started()

    async def _run_level(self, qid: int) -> None:
        backend = self._backend
        offset = await self._committed(qid)
        while True:
            result = await backend.pull(SCHEDULE_TOPIC, qid, offset, _BATCH)
            if result.status is PullStatus.OFFSET_ILLEGAL:
                offset = result.next_offset
                continue
            if not result.messages:
                offset = max(offset, result.next_offset)
                await backend.wait_for_message(SCHEDULE_TOPIC, qid, offset, math.inf)
                continue
            for parked in result.messages:
                due = _due(parked)
                # Re-read the service clock after each sleep: it is wall time, trio's is monotonic.
                while (wait := due - self._now_ms()) > 0:  # noqa: ASYNC110
                    await trio.sleep(min(wait / 1000, internal_topics.MAX_TIMER_SLEEP_S))
                await self._fire(parked)
                offset = parked.queue_offset + 1
                await backend.commit_consumer_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, offset)

    async def _fire(self, parked: StoredMessage) -> None:
        """Re-send ``parked``: to its real queue when due, or to its next hop (nothing if recalled).
        Retries store outages."""
        props = dict(parked.properties)
        real_topic = props.get(PROPERTY_REAL_TOPIC, "")
        if (real_topic, props.get(PROPERTY_UNIQ_KEY, "")) in self._recalled:
            self.dropped_recalled += 1
            return
        deliver_at = None if PROPERTY_DELAY_LEVEL in props else props.get(PROPERTY_TIMER_DELIVER_MS)
        now = self._now_ms()
        if deliver_at is not None and deliver_at.isdigit() and int(deliver_at) > now:
            level, due = self._hop(int(deliver_at), now)
            props[PROPERTY_SCHEDULE_DUE_MS] = str(due)
            message = internal_topics.copy_message(
                parked, topic=SCHEDULE_TOPIC, queue_id=level - 1, properties=props
            )
        else:
            topic = props.get(PROPERTY_REAL_TOPIC, "")
            try:
                queue_id = int(props.get(PROPERTY_REAL_QID, "-1"))
            except ValueError:
                queue_id = -1
            for key in (PROPERTY_DELAY_LEVEL, PROPERTY_SCHEDULE_DUE_MS):
                props.pop(key, None)
            message = internal_topics.copy_message(parked, topic=topic, queue_id=queue_id, properties=props)
        while True:
            try:
                await self._backend.send(message)
            except StoreUnavailable as exc:
                _log.warning("internal.error", exception=f"schedule delivery: {exc}")
                await trio.sleep(_RETRY_PAUSE_S)
                continue
            except BackendError as exc:
                if isinstance(exc, QueueNotFound) and message.queue_id != -1:
                    message.queue_id = -1  # the topic lost queues while the message waited
                    continue
                # Undeliverable for good (topic gone or illegal): drop it rather than block the level.
                _log.error(
                    "internal.error", exception=f"schedule dropped offset {parked.queue_offset}: {exc}"
                )
                return
            if message.topic != SCHEDULE_TOPIC:
                self.delivered += 1
            return


def _due(parked: StoredMessage) -> int:
    raw = parked.properties.get(PROPERTY_SCHEDULE_DUE_MS, "")
    return int(raw) if raw.isdigit() else 0

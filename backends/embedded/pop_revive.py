"""Revive of expired pop checkpoints (normal pop).

A CK whose invisible time passed with offsets un-acked is revived: those messages are re-written to the
pop retry topic ``%RETRY%<group>_<topic>`` (queue 0, ``reconsume_times + 1``, ``1ST_POP_TIME`` kept), or
to ``%DLQ%<group>`` after ``max_reconsume_times``, and a done record closes the CK.
"""

from __future__ import annotations

import heapq
import math

import structlog
import trio

from mqproxy.backends.embedded.internal_topics import MAX_TIMER_SLEEP_S, copy_message, ensure_topic
from mqproxy.backends.embedded.pop_checkpoints import TAG_DONE, Checkpoint, PopCheckpoints
from mqproxy.model.errors import BackendError, StoreUnavailable
from mqproxy.model.properties import PROPERTY_FIRST_POP_TIME
from mqproxy.model.receipts import RETRY_NORMAL, pop_retry_topic

#: Pause after a store failure before the revive loop tries again.
_RETRY_PAUSE_S = 1.0

_log = structlog.get_logger("mqproxy.pop")


class PopRevive(PopCheckpoints):
    """Revives checkpoints whose invisible time passed: un-acked messages go to the pop retry topic
    (or the DLQ after ``max_reconsume_times``)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Revive expired checkpoints until cancelled."""
        await self.start()
        task_status.started()
        while True:
            await self.revive_due()
            await self._commit_progress(force=False)
            self._wake = trio.Event()
            delay = (self._heap[0][0] - self._now_ms()) / 1000 if self._heap else math.inf
            with trio.move_on_after(min(max(delay, 0), MAX_TIMER_SLEEP_S)):
                await self._wake.wait()

    async def revive_due(self) -> int:
        """Revive every open checkpoint whose invisible time has passed; returns messages revived."""
        count = 0
        while self._heap and self._heap[0][0] <= self._now_ms():
            _, key = heapq.heappop(self._heap)
            ck = self._cks.get(key)
            if ck is None or ck.deadline_ms > self._now_ms():
                continue
            try:
                count += await self._revive(ck)
            except StoreUnavailable as exc:
                _log.warning("internal.error", exception=f"pop revive: {exc}")
                heapq.heappush(self._heap, (self._now_ms() + int(_RETRY_PAUSE_S * 1000), key))
                await trio.sleep(_RETRY_PAUSE_S)
        return count

    async def _revive(self, ck: Checkpoint) -> int:
        group, topic, qid, start, pop_time = ck.key
        original = topic
        if ck.retry_flag != RETRY_NORMAL:
            # The stored topic is already the pop retry topic: revive back into it.
            retry = topic
        else:
            retry = pop_retry_topic(group, original)
        revived = 0
        for offset in sorted(ck.offsets - ck.acked):
            try:
                result = await self._backend.pull(topic, qid, offset, 1)
            except StoreUnavailable:
                raise
            except BackendError:
                continue
            if not result.messages or result.messages[0].queue_offset != offset:
                continue
            message = result.messages[0]
            if message.reconsume_times >= self.max_reconsume_times:
                await self._retry.dead_letter(group, message)
            else:
                props = dict(message.properties)
                props.setdefault(PROPERTY_FIRST_POP_TIME, str(pop_time))
                await ensure_topic(self._backend, retry, 1)
                await self._backend.send(
                    copy_message(
                        message,
                        topic=retry,
                        queue_id=0,
                        properties=props,
                        reconsume_times=message.reconsume_times + 1,
                    )
                )
            revived += 1
        await self._record(
            ck.revive_qid, TAG_DONE, {"g": group, "t": topic, "q": qid, "so": start, "pt": pop_time}
        )
        if ck.key in self._cks:
            self._close(ck, "revived")
        self.revived += revived
        return revived

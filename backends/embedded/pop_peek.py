"""Looking at what a pop would return without popping: peek (PEEK_MESSAGE), notification
(NOTIFICATION), and the long-poll wait for a source queue to grow.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from mqproxy.backends.embedded.pop_acks import PopAcks
from mqproxy.backends.embedded.pop_checkpoints import MAX_POP_BATCH
from mqproxy.facade.types import InitMode
from mqproxy.model.errors import InvalidArgument, TopicNotFound
from mqproxy.model.receipts import pop_retry_topic
from mqproxy.model.types import StoredMessage, TagFilter

#: Longest a long poll sleeps before looking again for a source queue created meanwhile.
SOURCE_RECHECK_S = 1.0


class PopPeek(PopAcks):
    """``peek``, ``has_message`` and the long-poll wait of ``pop``."""

    async def peek(
        self,
        group: str,
        topic: str,
        queue_id: int | None,
        max_count: int,
        *,
        tag_filter: TagFilter | None = None,
    ) -> list[StoredMessage]:
        """Messages from the group's consume offset(s), without popping them (PEEK_MESSAGE)."""
        if not 1 <= max_count <= MAX_POP_BATCH:
            raise InvalidArgument(f"max message count {max_count} outside 1..{MAX_POP_BATCH}")
        config = await self._backend.get_topic(topic)
        if config is None:
            raise TopicNotFound(topic)
        qids = range(max(config.read_queues, config.write_queues)) if queue_id is None else [queue_id]
        out: list[StoredMessage] = []
        for qid in qids:
            if len(out) >= max_count:
                break
            committed = await self._backend.query_consumer_offset(group, topic, qid)
            offset = await self._backend.min_offset(topic, qid) if committed is None else committed
            messages, _, _ = await self._read(group, topic, qid, offset, max_count - len(out), tag_filter)
            out.extend(messages)
        return out

    async def has_message(self, group: str, topic: str, queue_id: int | None) -> bool:
        """True if a queue (or the pop retry topic) has messages past the group's offset (NOTIFICATION)."""
        config = await self._backend.get_topic(topic)
        if config is None:
            raise TopicNotFound(topic)
        qids = range(max(config.read_queues, config.write_queues)) if queue_id is None else [queue_id]
        targets = [(topic, qid) for qid in qids]
        retry = pop_retry_topic(group, topic)
        if await self._backend.get_topic(retry) is not None:
            targets.append((retry, 0))
        for name, qid in targets:
            if await self._rest(group, name, qid) > 0:
                return True
        return False

    async def _wait_any(
        self,
        group: str,
        sources: Sequence[tuple[str, int, int]],
        deadline: float,
        order: bool,
        init_mode: InitMode,
        *,
        recheck: bool = False,
    ) -> None:
        """Sleep until one source queue grows past the group's offset, or ``deadline``.

        ``recheck`` caps the sleep at :data:`SOURCE_RECHECK_S` so the caller can look again for a
        source that does not exist yet (the pop retry topic)."""
        targets = []
        for topic, qid, _ in sources:
            committed = await self._backend.query_consumer_offset(group, topic, qid)
            offset = committed if committed is not None else await self._backend.max_offset(topic, qid)
            targets.append((topic, qid, offset))
        timeout = deadline - trio.current_time()
        if order:  # an order queue also unblocks when its in-flight messages expire
            timeout = min(timeout, 1.0)
        if recheck:
            timeout = min(timeout, SOURCE_RECHECK_S)
        if timeout <= 0:
            return
        async with trio.open_nursery() as nursery:

            async def watch(topic: str, qid: int, offset: int) -> None:
                if await self._backend.wait_for_message(topic, qid, offset, timeout):
                    nursery.cancel_scope.cancel()

            for target in targets:
                nursery.start_soon(watch, *target)

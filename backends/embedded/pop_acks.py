"""Acking popped messages and changing their invisible time, by receipt handle.

An ack writes an ack record to the CK's revive queue (a CK whose offsets are all acked closes); a
repeated ack is a no-op. Change-invisible writes a one-message CK starting at the message's offset (pop
time now) and acks the old handle, marking it superseded. Order receipts act on the in-memory order
flight instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from mqproxy.backends.embedded.pop_checkpoints import TAG_ACK, Checkpoint, CkKey
from mqproxy.backends.embedded.pop_order import PopOrder
from mqproxy.facade.types import AckOutcome
from mqproxy.model.errors import (
    BackendError,
    InvalidArgument,
    MessageAlreadyAcked,
    OffsetOutOfRange,
    StoreUnavailable,
)
from mqproxy.model.properties import REVIVE_TOPIC
from mqproxy.model.receipts import Receipt
from mqproxy.model.types import PROPERTY_TAGS, Message, SendResult, StoredMessage


class PopAcks(PopOrder):
    """``ack``, ``ack_many``, ``change_invisible`` and ``forward_to_dlq`` on receipt handles."""

    async def _resolve(self, group: str, topic: str, receipt: Receipt | str) -> tuple[Receipt, str]:
        """Start the service, decode ``receipt`` and check its offset lies in its queue; returns the
        receipt and the topic its message is stored in."""
        await self.start()
        if isinstance(receipt, str):
            receipt = Receipt.decode(receipt)
        real = receipt.real_topic(group, topic)
        await self._check_range(real, receipt.queue_id, receipt.offset)
        return receipt, real

    def _unacked_ck(self, group: str, topic: str, receipt: Receipt) -> Checkpoint:
        """The open checkpoint of an un-acked normal receipt; MessageAlreadyAcked if it was acked."""
        ck = self._find(group, topic, receipt)
        if ck is None or receipt.offset in ck.acked:
            raise MessageAlreadyAcked(f"offset {receipt.offset} was already acked")
        return ck

    async def _message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage:
        stored = await self._backend.pull(topic, queue_id, offset, 1)
        if not stored.messages or stored.messages[0].queue_offset != offset:
            raise OffsetOutOfRange(f"no message at offset {offset}")
        return stored.messages[0]

    async def ack(self, group: str, topic: str, receipt: Receipt | str) -> AckOutcome:
        """Ack one popped message. ``topic`` is the consumer's topic (the retry flag picks the real one).

        Raises MalformedReceipt, ReceiptExpired (revived or superseded), OffsetOutOfRange,
        TopicNotFound / QueueNotFound; a repeated ack is a no-op (:attr:`AckOutcome.ALREADY_ACKED`).
        """
        receipt, real = await self._resolve(group, topic, receipt)
        if receipt.is_order:
            return await self._ack_order(group, real, receipt)
        ck = self._find(group, real, receipt)
        if ck is None or receipt.offset in ck.acked:
            return AckOutcome.ALREADY_ACKED
        await self._ack_record(ck, receipt.offset, changed=False)
        return AckOutcome.ACKED

    async def ack_many(
        self, group: str, topic: str, receipts: Sequence[Receipt | str]
    ) -> list[AckOutcome | BackendError]:
        """Ack several messages with one revive-topic write per revive queue (gRPC AckMessage entries,
        BATCH_ACK_MESSAGE). Per entry: its outcome, or the error :meth:`ack` would have raised for it.
        Store failures (StoreUnavailable) still raise for the whole call."""
        await self.start()
        outcomes: list[AckOutcome | BackendError] = [AckOutcome.ALREADY_ACKED] * len(receipts)
        planned: dict[CkKey, tuple[Checkpoint, dict[int, int]]] = {}  # offset -> entry index
        ranges: dict[tuple[str, int], tuple[int, int]] = {}
        for index, item in enumerate(receipts):
            try:
                receipt = Receipt.decode(item) if isinstance(item, str) else item
                real = receipt.real_topic(group, topic)
                bounds = ranges.get((real, receipt.queue_id))
                if bounds is None:
                    low = await self._backend.min_offset(real, receipt.queue_id)
                    bounds = ranges[(real, receipt.queue_id)] = (
                        low,
                        await self._backend.max_offset(real, receipt.queue_id),
                    )
                if not bounds[0] <= receipt.offset < bounds[1]:
                    raise OffsetOutOfRange(f"offset {receipt.offset} outside [{bounds[0]}, {bounds[1]})")
                if receipt.is_order:
                    outcomes[index] = await self._ack_order(group, real, receipt)
                    continue
                ck = self._find(group, real, receipt)
            except StoreUnavailable:
                raise
            except BackendError as exc:
                outcomes[index] = exc
                continue
            if ck is None or receipt.offset in ck.acked:
                continue
            planned.setdefault(ck.key, (ck, {}))[1].setdefault(receipt.offset, index)
        by_rq: dict[int, list[tuple[Checkpoint, dict[int, int]]]] = {}
        for ck, offsets in planned.values():
            by_rq.setdefault(ck.revive_qid, []).append((ck, offsets))
        for rq, items in by_rq.items():
            records = []
            for ck, offsets in items:  # one ack record per checkpoint, listing its offsets
                group_, topic_, qid, start, pop_time = ck.key
                body = {"g": group_, "t": topic_, "q": qid, "so": start, "pt": pop_time, "o": sorted(offsets)}
                tags = {PROPERTY_TAGS: TAG_ACK}
                records.append(Message(REVIVE_TOPIC, orjson.dumps(body), queue_id=rq, properties=tags))
            results = await self._backend.send_batch(records)
            self._revive_end[rq] = max(self._revive_end[rq], results[-1].queue_offset + 1)
            for ck, offsets in items:
                ck.acked |= offsets.keys()
                if ck.acked >= ck.offsets and ck.key in self._cks:
                    self._close(ck, "acked")
                for index in offsets.values():
                    outcomes[index] = AckOutcome.ACKED
        return outcomes

    async def _ack_record(self, ck: Checkpoint, offset: int, *, changed: bool) -> None:
        group, topic, qid, start, pop_time = ck.key
        body: dict[str, object] = {"g": group, "t": topic, "q": qid, "so": start, "pt": pop_time, "o": offset}
        if changed:
            body["x"] = 1
            ck.changed.add(offset)
        await self._record(ck.revive_qid, TAG_ACK, body)
        ck.acked.add(offset)
        if ck.acked >= ck.offsets:
            self._close(ck, "acked")

    async def change_invisible(
        self, group: str, topic: str, receipt: Receipt | str, invisible_ms: int
    ) -> Receipt:
        """Make the message invisible for ``invisible_ms`` from now; returns its new receipt.

        Raises MessageAlreadyAcked, ReceiptExpired, MalformedReceipt, OffsetOutOfRange, InvalidArgument.
        """
        if not 0 <= invisible_ms < 2**40:
            raise InvalidArgument(f"invisible time {invisible_ms} ms out of range")
        receipt, real = await self._resolve(group, topic, receipt)
        now = self._now_ms()
        if receipt.is_order:
            return self._change_invisible_order(group, real, receipt, now + invisible_ms)
        ck = self._unacked_ck(group, real, receipt)
        message = await self._message_at(real, receipt.queue_id, receipt.offset)
        pop_time = now
        while self._key_used((group, real, receipt.queue_id, receipt.offset, pop_time)):
            pop_time += 1
        rq = self._next_rq()
        await self._write_ck(
            group,
            real,
            receipt.queue_id,
            receipt.offset,
            pop_time,
            invisible_ms,
            rq,
            ck.retry_flag,
            [message],
        )
        await self._ack_record(ck, receipt.offset, changed=True)
        return Receipt(
            receipt.offset,
            pop_time,
            invisible_ms,
            rq,
            receipt.retry_flag,
            receipt.broker_name,
            receipt.queue_id,
            receipt.offset,
        )

    async def forward_to_dlq(self, group: str, topic: str, receipt: Receipt | str) -> SendResult:
        """Move a popped, un-acked message to ``%DLQ%<group>`` and ack it (gRPC
        ForwardMessageToDeadLetterQueue). Raises like :meth:`ack`; MessageAlreadyAcked if acked."""
        receipt, real = await self._resolve(group, topic, receipt)
        if not receipt.is_order:
            self._unacked_ck(group, real, receipt)
        result = await self._retry.dead_letter(
            group, await self._message_at(real, receipt.queue_id, receipt.offset)
        )
        await self.ack(group, topic, receipt)
        return result

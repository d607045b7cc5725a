"""Order pop (``order=True``, revive queue 999).

A queue is blocked for the group while it has in-flight un-acked messages; acks commit the consume
offset in order; when the invisible time passes the same messages are delivered again (attempt count +
1). Order in-flight state is in memory only: after a restart the un-acked messages are simply delivered
again from the committed offset.
"""

from __future__ import annotations

from mqproxy.backends.embedded.pop_checkpoints import OrderFlight
from mqproxy.backends.embedded.pop_revive import PopRevive
from mqproxy.facade.types import AckOutcome, InitMode
from mqproxy.model.errors import MessageAlreadyAcked, ReceiptExpired
from mqproxy.model.receipts import Receipt
from mqproxy.model.types import StoredMessage, TagFilter


class PopOrder(PopRevive):
    """Order pop: one in-flight batch per (group, queue), acked and committed in order."""

    async def _pop_order(
        self,
        group: str,
        topic: str,
        qid: int,
        count: int,
        invisible_ms: int,
        tag_filter: TagFilter | None,
        init_mode: InitMode,
        now: int,
    ) -> tuple[list[StoredMessage], int, list[int], int]:
        key = (group, topic, qid)
        flight = self._orders.get(key)
        if flight is not None:
            if set(flight.offsets) - flight.acked and now < flight.deadline_ms:
                return [], 0, [], 0  # blocked: in-flight messages not acked yet
            del self._orders[key]
        offset = await self._offset(group, topic, qid, init_mode)
        messages, next_offset, max_offset = await self._read(group, topic, qid, offset, count, tag_filter)
        if not messages:
            if next_offset != offset:
                await self._backend.commit_consumer_offset(group, topic, qid, next_offset)
            return [], offset, [], 0
        flight = OrderFlight(now, now + invisible_ms, [m.queue_offset for m in messages])
        attempts = []
        for m in messages:
            n = self._attempts.get((group, topic, qid, m.queue_offset), -1) + 1
            self._attempts[(group, topic, qid, m.queue_offset)] = n
            flight.attempts[m.queue_offset] = n
            attempts.append(n)
        self._orders[key] = flight
        return messages, messages[0].queue_offset, attempts, max(0, max_offset - next_offset)

    def _order_flight(self, group: str, topic: str, receipt: Receipt) -> OrderFlight:
        """The in-flight batch ``receipt`` belongs to; ReceiptExpired if it is gone or newer."""
        flight = self._orders.get((group, topic, receipt.queue_id))
        if (
            flight is None
            or flight.pop_time_ms != receipt.pop_time_ms
            or receipt.offset not in flight.offsets
        ):
            raise ReceiptExpired("order receipt does not match the queue's in-flight messages")
        return flight

    def _change_invisible_order(self, group: str, topic: str, receipt: Receipt, deadline_ms: int) -> Receipt:
        """Keep an order receipt's batch in flight until ``deadline_ms``; returns the new receipt."""
        flight = self._order_flight(group, topic, receipt)
        if receipt.offset in flight.acked:
            raise MessageAlreadyAcked(f"offset {receipt.offset} was already acked")
        flight.deadline_ms = deadline_ms
        return Receipt(
            receipt.ck_offset,
            flight.pop_time_ms,
            flight.deadline_ms - flight.pop_time_ms,
            receipt.revive_qid,
            receipt.retry_flag,
            receipt.broker_name,
            receipt.queue_id,
            receipt.offset,
        )

    async def _ack_order(self, group: str, topic: str, receipt: Receipt) -> AckOutcome:
        key = (group, topic, receipt.queue_id)
        flight = self._order_flight(group, topic, receipt)
        if receipt.offset in flight.acked:
            return AckOutcome.ALREADY_ACKED
        flight.acked.add(receipt.offset)
        # Commit in order: up to the first un-acked in-flight offset.
        commit = None
        for offset in flight.offsets:
            if offset not in flight.acked:
                break
            commit = offset + 1
            self._attempts.pop((group, topic, receipt.queue_id, offset), None)
        if commit is not None:
            current = await self._backend.query_consumer_offset(group, topic, receipt.queue_id) or 0
            if commit > current:
                await self._backend.commit_consumer_offset(group, topic, receipt.queue_id, commit)
        if flight.acked >= set(flight.offsets):
            del self._orders[key]
        return AckOutcome.ACKED

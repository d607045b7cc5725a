"""Pop receipt handles and pop results: the ``POP_CK`` / ``extraInfo`` string (spec §6.2) and the
POP_MESSAGE response-header strings (spec §6.3). Pure data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from mqproxy.model.errors import MalformedReceipt
from mqproxy.model.topics import RETRY_PREFIX
from mqproxy.model.types import StoredMessage

#: Revive queue id that marks an order-pop receipt (``POP_ORDER_REVIVE_QUEUE``).
POP_ORDER_REVIVE_QID = 999
#: Receipt retry flags: the message is in the topic itself, or in its V1 / V2 pop retry topic.
RETRY_NORMAL = 0
RETRY_V1 = 1
RETRY_V2 = 2


def pop_retry_topic(group: str, topic: str, flag: int = RETRY_V1) -> str:
    """``%RETRY%<group>_<topic>`` (V1, default) or ``%RETRY%<group>+<topic>`` (V2)."""
    return f"{RETRY_PREFIX}{group}{'+' if flag == RETRY_V2 else '_'}{topic}"


@dataclass(slots=True, frozen=True)
class Receipt:
    """A popped message's handle: the ``POP_CK`` / ``extraInfo`` string of spec §6.2.

    ``ckOffset popTime invisibleTime reviveQid retryFlag brokerName queueId offset``; the topic and
    group are not in it (requests carry them) — :meth:`real_topic` rebuilds the topic acks go to.
    """

    ck_offset: int
    pop_time_ms: int
    invisible_ms: int
    revive_qid: int
    retry_flag: int
    broker_name: str
    queue_id: int
    offset: int

    @property
    def deadline_ms(self) -> int:
        return self.pop_time_ms + self.invisible_ms

    @property
    def is_order(self) -> bool:
        return self.revive_qid == POP_ORDER_REVIVE_QID

    def real_topic(self, group: str, topic: str) -> str:
        """The topic the message is stored in: ``topic`` or its pop retry topic (per the retry flag)."""
        if self.retry_flag == RETRY_NORMAL or topic.startswith(RETRY_PREFIX):
            return topic
        return pop_retry_topic(group, topic, self.retry_flag)

    def encode(self) -> str:
        return (
            f"{self.ck_offset} {self.pop_time_ms} {self.invisible_ms} {self.revive_qid} "
            f"{self.retry_flag} {self.broker_name} {self.queue_id} {self.offset}"
        )

    @classmethod
    def decode(cls, text: str) -> Receipt:
        """Parse an 8-field handle (extra trailing fields, as the Java proxy adds, are ignored)."""
        if not isinstance(text, str) or len(text) > 1024:
            raise MalformedReceipt("receipt handle is not a string of at most 1024 characters")
        fields = text.split(" ")
        if len(fields) < 8:
            raise MalformedReceipt(f"receipt handle has {len(fields)} fields, expected 8")
        numbers = [*fields[0:5], *fields[6:8]]
        if not all(n.lstrip("-").isdigit() and n.isascii() for n in numbers):
            raise MalformedReceipt("receipt handle has a non-numeric field")
        ck, pop_time, invisible, rq, flag, queue_id, offset = map(int, numbers)
        values = (ck, pop_time, invisible, rq, queue_id, offset)
        if min(values) < 0 or max(values) >= 2**63 or flag not in (0, 1, 2):
            raise MalformedReceipt("receipt handle has a field out of range")
        return cls(ck, pop_time, invisible, rq, flag, fields[5], queue_id, offset)


@dataclass(slots=True, frozen=True)
class PoppedMessage:
    """One popped message. ``message`` is as stored (its topic may be the pop retry topic); ``topic``
    is the topic the consumer asked for (what protocol layers should present)."""

    message: StoredMessage
    receipt: Receipt
    topic: str

    @property
    def delivery_attempt(self) -> int:
        return self.message.reconsume_times + 1


@dataclass(slots=True, frozen=True)
class PopResult:
    """What a pop returns, with the POP_MESSAGE response-header strings (spec §6.3)."""

    messages: tuple[PoppedMessage, ...]
    pop_time_ms: int
    invisible_ms: int
    revive_qid: int
    rest: int
    start_offsets: dict[tuple[int, int], int] = field(default_factory=dict)
    msg_offsets: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    order_counts: dict[tuple[int, int], list[int]] = field(default_factory=dict)

    def start_offset_info(self) -> str:
        return ";".join(f"{flag} {qid} {start}" for (flag, qid), start in self.start_offsets.items())

    def msg_offset_info(self) -> str:
        return ";".join(
            f"{flag} {qid} {','.join(map(str, offs))}" for (flag, qid), offs in self.msg_offsets.items()
        )

    def order_count_info(self) -> str:
        """Per message ``<flag> qo<queueId>%<offset> <count>`` (the per-message form of spec §6.3)."""
        parts = []
        for (flag, qid), counts in self.order_counts.items():
            offsets = self.msg_offsets.get((flag, qid), [])
            parts += [f"{flag} qo{qid}%{o} {c}" for o, c in zip(offsets, counts, strict=False)]
        return ";".join(parts)

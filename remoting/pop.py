"""
mqproxy.remoting.pop
~~~~~~~~~~~~~~~~~~~~

Pop consumption over remoting (spec §3.16-§3.20, §6), on the broker facade's
:class:`~mqproxy.facade.api.Popping`.

* POP_MESSAGE (200050): ``queueId`` -1 pops every queue (random start, plus the pop retry topic);
  ``maxMsgNums`` outside 1..32 or ``invisibleTime`` <= 0 -> INVALID_PARAMETER; only TAG expressions
  (else SUBSCRIPTION_PARSE_FAILED); ``initMode`` 0 (MIN) / 1 (MAX). A request that arrives more than
  500 ms after ``bornTime + pollTime`` is answered POLLING_TIMEOUT at once; otherwise, with nothing to
  pop, it is held up to ``pollTime`` (capped by ``ServerContext.long_poll_max_s``), POLLING_FULL when
  too many are held, POLLING_TIMEOUT (pollTime > 0) or PULL_NOT_FOUND (pollTime 0) when nothing came.
  SUCCESS carries ``popTime``, ``invisibleTime``, ``reviveQid``, ``restNum``, ``startOffsetInfo``,
  ``msgOffsetInfo`` (and ``orderCountInfo`` for order pop) and the records, each with its receipt as
  property ``POP_CK``. Messages from the pop retry topic keep their stored topic
  (``%RETRY%<group>_<topic>``): clients derive the ``1@<queueId>`` key of the header strings from it.
* ACK_MESSAGE (200051) / CHANGE_MESSAGE_INVISIBLETIME (200053): the receipt is ``extraInfo``; its
  queue id and offset must equal the header's ``queueId``/``offset`` (else MESSAGE_ILLEGAL). Malformed
  extraInfo -> MESSAGE_ILLEGAL; unknown topic -> TOPIC_NOT_EXIST; queue out of range ->
  MESSAGE_ILLEGAL; offset outside the queue, a stale (revived or superseded) receipt, or a change on an
  acked message -> NO_MESSAGE. A repeated ack is SUCCESS with remark ``already acked``.
  CHANGE answers ``popTime``, ``invisibleTime``, ``reviveQid`` of the new receipt.
* BATCH_ACK_MESSAGE (200151): body ``{"acks":[{"c","t","r","so","q","rq","pt","it","b"}]}`` (long
  names accepted); ``b`` is base64 of Java ``BitSet.toByteArray()``, bit i = offset ``so + i``.
  SUCCESS; entries that fail are counted in the remark.
* PEEK_MESSAGE (200052): records from the group's offset without popping; PULL_NOT_FOUND if none.
* NOTIFICATION (200054): ``hasMsg``/``pollingFull``; held up to ``pollTime`` when nothing is there.
* POLLING_INFO (200055): ``pollingNum``, the pops and notifications held for topic/group/queue.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

import orjson
import trio

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.api import PopRequest
from mqproxy.facade.types import AckOutcome, InitMode
from mqproxy.model.errors import MalformedReceipt, QueueNotFound
from mqproxy.model.properties import PROPERTY_POP_CK
from mqproxy.model.receipts import PopResult, Receipt, pop_retry_topic
from mqproxy.model.types import FilterExpression
from mqproxy.remoting.context import BROKER_NAME
from mqproxy.remoting.errors import HeaderError, RequestError
from mqproxy.remoting.headers import (
    AckHeader,
    ChangeInvisibleHeader,
    NotificationHeader,
    PeekHeader,
    PopHeader,
    QueueGroupHeader,
    parse_header,
)
from mqproxy.remoting.records import records_body
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

#: How late (ms past ``bornTime + pollTime``) a pop may arrive before it is refused (spec rule 17).
LATE_POP_MS: Final = 500
#: Offsets one BATCH_ACK entry may name (its bitmap's set bits).
MAX_BATCH_ACK_BITS: Final = 4096
#: Messages one POP_MESSAGE may ask for (the broker's limit).
MAX_POP_BATCH: Final = 32


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@contextmanager
def _queue_errors() -> Iterator[None]:
    """Ack and change-invisible answer MESSAGE_ILLEGAL for a queue id out of range (spec §3.17)."""
    try:
        yield
    except QueueNotFound as exc:
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"QueueNotFound: {exc}") from None


def _tag_filter(exp_type: str, exp: str | None) -> FilterExpression:
    if exp_type.strip().upper() not in ("TAG", ""):
        raise RequestError(
            ResponseCode.SUBSCRIPTION_PARSE_FAILED,
            f"expression type {exp_type[:32]!r} is not supported, only TAG",
        )
    return FilterExpression(exp or "*", "TAG")


# --- POP_MESSAGE ------------------------------------------------------------------------------------


async def pop_message(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(PopHeader, request.ext_fields)
    note.group, note.topic = header.consumer_group, header.topic
    if not 1 <= header.max_msg_nums <= MAX_POP_BATCH:
        raise RequestError(
            ResponseCode.INVALID_PARAMETER,
            f"the broker option max message number {header.max_msg_nums} is not in 1..{MAX_POP_BATCH}",
        )
    if header.invisible_time_ms <= 0:
        raise RequestError(
            ResponseCode.INVALID_PARAMETER, f"invisibleTime {header.invisible_time_ms} is not positive"
        )
    if header.init_mode not in (InitMode.MIN, InitMode.MAX):
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"initMode {header.init_mode} is not 0 or 1")
    message_filter = _tag_filter(header.exp_type, header.exp)
    poll_ms = max(header.poll_time_ms, 0)
    if poll_ms > 0 and header.born_time_ms > 0:
        late = _now_ms() - header.born_time_ms - poll_ms
        if late > LATE_POP_MS:
            raise RequestError(
                ResponseCode.POLLING_TIMEOUT, f"the pop request arrived {late} ms after its poll time ended"
            )
    ctx = session.ctx
    queue_id = None if header.queue_id < 0 else header.queue_id

    async def pop(poll_s: float) -> PopResult:
        return await session.broker.pop(
            PopRequest(
                header.consumer_group,
                header.topic,
                header.max_msg_nums,
                header.invisible_time_ms,
                queue_id=queue_id,
                message_filter=message_filter,
                order=header.order,
                init_mode=InitMode(header.init_mode),
                hold_s=poll_s,
            )
        )

    result = await pop(0.0)
    hold_s = min(poll_ms / 1000.0, ctx.long_poll_max_s)
    if not result.messages and hold_s > 0:
        key = (header.topic, header.consumer_group, header.queue_id)
        if not ctx.polls.try_hold(key):
            raise RequestError(ResponseCode.POLLING_FULL, "too many pop requests are held for this queue")
        try:
            with session.holds.until_drain():  # a drain leaves the empty result: answered at once
                result = await pop(hold_s)
        finally:
            ctx.polls.release(key)
    ext = {
        "popTime": str(result.pop_time_ms),
        "invisibleTime": str(result.invisible_ms),
        "reviveQid": str(result.revive_qid),
        "restNum": str(result.rest),
    }
    if not result.messages:
        if poll_ms > 0:
            return Reply(ResponseCode.POLLING_TIMEOUT, ext, remark="no new message within the poll time")
        return Reply(ResponseCode.PULL_NOT_FOUND, ext, remark="no new message")
    ext["startOffsetInfo"] = result.start_offset_info()
    ext["msgOffsetInfo"] = result.msg_offset_info()
    if header.order:
        ext["orderCountInfo"] = _order_count_info(result)
    records = [
        dataclasses.replace(
            p.message, properties={**p.message.properties, PROPERTY_POP_CK: p.receipt.encode()}
        )
        for p in result.messages
    ]
    return Reply(ResponseCode.SUCCESS, ext, records_body(session, records, "POP_MESSAGE"))


def _order_count_info(result: PopResult) -> str:
    """Per-message ``<flag> qo<qid>%<offset> <count>`` entries plus one ``<flag> <qid> <count>`` per
    queue (the highest count) for clients that only read the queue form (spec §6.3)."""
    per_message = result.order_count_info()
    per_queue = [
        f"{flag} {qid} {max(counts)}" for (flag, qid), counts in result.order_counts.items() if counts
    ]
    return ";".join(part for part in (per_message, *per_queue) if part)


# --- ACK / CHANGE_INVISIBLE -------------------------------------------------------------------------


def _receipt(header: AckHeader) -> Receipt:
    receipt = Receipt.decode(header.extra_info)
    if receipt.queue_id != header.queue_id or receipt.offset != header.offset:
        raise MalformedReceipt(
            f"extraInfo names queue {receipt.queue_id} offset {receipt.offset}, "
            f"the header queue {header.queue_id} offset {header.offset}"
        )
    return receipt


async def ack_message(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(AckHeader, request.ext_fields)
    note.group, note.topic = header.consumer_group, header.topic
    receipt = _receipt(header)
    with _queue_errors():
        outcome = await session.broker.ack(header.consumer_group, header.topic, receipt.encode())
    if outcome is AckOutcome.ALREADY_ACKED:
        return Reply(ResponseCode.SUCCESS, remark="already acked")
    return Reply(ResponseCode.SUCCESS)


async def change_invisible_time(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(ChangeInvisibleHeader, request.ext_fields)
    note.group, note.topic = header.consumer_group, header.topic
    receipt = _receipt(header)
    invisible_ms = header.invisible_time_ms
    if invisible_ms < 0:
        raise HeaderError("invisibleTime", "must be a non-negative number of ms")
    with _queue_errors():
        handle = await session.broker.change_invisible(
            header.consumer_group, header.topic, receipt.encode(), invisible_ms
        )
    new = Receipt.decode(handle)
    ext = {
        "popTime": str(new.pop_time_ms),
        "invisibleTime": str(new.invisible_ms),
        "reviveQid": str(new.revive_qid),
    }
    return Reply(ResponseCode.SUCCESS, ext)


def _bad_batch(problem: str) -> RequestError:
    return RequestError(ResponseCode.INVALID_PARAMETER, f"batch ack body {problem}")


def _field(entry: dict[str, Any], short: str, long: str) -> Any:
    return entry[short] if short in entry else entry.get(long)


def _int_field(entry: dict[str, Any], short: str, long: str) -> int:
    value = _field(entry, short, long)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise _bad_batch(f"has a bad {short!r}")
    return value


def _bits(text: Any) -> list[int]:
    """Set bit indexes of a Java ``BitSet.toByteArray()`` (little-endian bytes) in base64."""
    if not isinstance(text, str):
        raise _bad_batch("has a bad 'b'")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad_batch("has a 'b' that is not base64") from None
    bits = [8 * i + b for i, byte in enumerate(raw) for b in range(8) if byte >> b & 1]
    if len(bits) > MAX_BATCH_ACK_BITS:
        raise _bad_batch(f"acks more than {MAX_BATCH_ACK_BITS} offsets in one entry")
    return bits


def parse_batch_ack(body: bytes) -> list[tuple[str, str, list[Receipt]]]:
    """(group, topic, receipts) per entry of a BATCH_ACK_MESSAGE body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _bad_batch("is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("acks"), list):
        raise _bad_batch("lacks an 'acks' list")
    named = data.get("brokerName")
    broker = named if isinstance(named, str) and named and " " not in named else BROKER_NAME
    out = []
    for entry in data["acks"]:
        if not isinstance(entry, dict):
            raise _bad_batch("has an entry that is not an object")
        group, topic = _field(entry, "c", "consumerGroup"), _field(entry, "t", "topic")
        if not isinstance(group, str) or not group or not isinstance(topic, str) or not topic:
            raise _bad_batch("has an entry without consumer group or topic")
        flag = _int_field(entry, "r", "retry")
        if flag not in (0, 1, 2):
            raise _bad_batch(f"has retry flag {flag}")
        start, queue_id = _int_field(entry, "so", "startOffset"), _int_field(entry, "q", "queueId")
        rq, pop_time = _int_field(entry, "rq", "reviveQueueId"), _int_field(entry, "pt", "popTime")
        invisible = _int_field(entry, "it", "invisibleTime")
        receipts = [
            Receipt(start, pop_time, invisible, rq, flag, broker, queue_id, start + bit)
            for bit in _bits(_field(entry, "b", "bitSet"))
        ]
        out.append((group, topic, receipts))
    return out


async def batch_ack_message(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    entries = parse_batch_ack(request.body)
    if entries:
        note.group, note.topic = entries[0][0], entries[0][1]
    failed, total, first_error = 0, 0, ""
    for group, topic, receipts in entries:
        outcomes = await session.broker.ack_many(group, topic, [r.encode() for r in receipts])
        total += len(outcomes)
        for outcome in outcomes:
            if not isinstance(outcome, AckOutcome):
                failed += 1
                first_error = first_error or f"{type(outcome).__name__}: {outcome}"
    if failed:
        return Reply(
            ResponseCode.SUCCESS, remark=f"{failed} of {total} acks failed, first: {first_error}"[:512]
        )
    return Reply(ResponseCode.SUCCESS)


# --- PEEK / NOTIFICATION / POLLING_INFO -------------------------------------------------------------


async def peek_message(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(PeekHeader, request.ext_fields)
    note.group, note.topic = header.consumer_group, header.topic
    queue_id = None if header.queue_id < 0 else header.queue_id
    messages = await session.broker.peek(header.consumer_group, header.topic, queue_id, header.max_msg_nums)
    rest = await _rest(session, header.consumer_group, header.topic, queue_id) - len(messages)
    ext = {"popTime": str(_now_ms()), "invisibleTime": "0", "reviveQid": "0", "restNum": str(max(rest, 0))}
    if not messages:
        return Reply(ResponseCode.PULL_NOT_FOUND, ext, remark="no message to peek")
    return Reply(ResponseCode.SUCCESS, ext, records_body(session, messages, "PEEK_MESSAGE"))


async def _targets(
    session: RemotingSession, group: str, topic: str, queue_id: int | None
) -> list[tuple[str, int]]:
    broker = session.broker
    config = await broker.get_topic(topic)
    if config is None:
        raise RequestError(
            ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic[:255]}] not exist, apply first please!"
        )
    queues = max(config.read_queues, config.write_queues)
    if queue_id is not None and not 0 <= queue_id < queues:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"queueId[{queue_id}] is illegal, topic:[{topic}]")
    out = [(topic, q) for q in (range(queues) if queue_id is None else [queue_id])]
    retry = pop_retry_topic(group, topic)
    if await broker.get_topic(retry) is not None:
        out.append((retry, 0))
    return out


async def _rest(session: RemotingSession, group: str, topic: str, queue_id: int | None) -> int:
    broker, total = session.broker, 0
    for name, qid in await _targets(session, group, topic, queue_id):
        committed = await broker.query_consumer_offset(group, name, qid)
        low = await broker.min_offset(name, qid) if committed is None else committed
        total += max(0, await broker.max_offset(name, qid) - low)
    return total


async def _wait_any(
    session: RemotingSession, group: str, targets: list[tuple[str, int]], timeout_s: float
) -> None:
    """Return when one target queue grows past the group's offset, or after ``timeout_s``."""
    broker = session.broker
    marks = []
    for name, qid in targets:
        committed = await broker.query_consumer_offset(group, name, qid)
        marks.append((name, qid, await broker.max_offset(name, qid) if committed is None else committed))
    async with trio.open_nursery() as nursery:

        async def watch(name: str, qid: int, offset: int) -> None:
            if await broker.wait_for_message(name, qid, offset, timeout_s):
                nursery.cancel_scope.cancel()

        for mark in marks:
            nursery.start_soon(watch, *mark)


async def notification(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(NotificationHeader, request.ext_fields)
    note.group, note.topic = header.consumer_group, header.topic
    queue_id = None if header.queue_id < 0 else header.queue_id
    targets = await _targets(session, header.consumer_group, header.topic, queue_id)
    has = await session.broker.has_message(header.consumer_group, header.topic, queue_id)
    ctx = session.ctx
    hold_s = min(max(header.poll_time_ms, 0) / 1000.0, ctx.long_poll_max_s)
    full = False
    if not has and hold_s > 0:
        key = (header.topic, header.consumer_group, header.queue_id)
        if ctx.polls.try_hold(key):
            try:
                with session.holds.until_drain():
                    await _wait_any(session, header.consumer_group, targets, hold_s)
            finally:
                ctx.polls.release(key)
            has = await session.broker.has_message(header.consumer_group, header.topic, queue_id)
        else:
            full = True
    ext = {"hasMsg": "true" if has else "false", "pollingFull": "true" if full else "false"}
    return Reply(ResponseCode.SUCCESS, ext)


async def polling_info(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(QueueGroupHeader, request.ext_fields)
    note.group, note.topic = header.consumer_group, header.topic
    queue_id = None if header.queue_id < 0 else header.queue_id
    await _targets(session, header.consumer_group, header.topic, queue_id)
    count = session.ctx.polls.count((header.topic, header.consumer_group, header.queue_id))
    return Reply(ResponseCode.SUCCESS, {"pollingNum": str(count)})

"""
mqproxy.remoting.produce
~~~~~~~~~~~~~~~~~~~~~~~~

SEND_MESSAGE (10, long header keys), SEND_MESSAGE_V2 (310, keys ``a``..``n``) and SEND_BATCH_MESSAGE
(320), spec §3.2 and §4.6.

Checks, in the broker's order and with its codes: topic longer than 127 bytes or properties longer than
32767 bytes -> MESSAGE_ILLEGAL (13); illegal topic characters -> INVALID_PARAMETER (29); system topics
-> NO_PERMISSION (16); unknown topic without auto-creation -> TOPIC_NOT_EXIST (17); queue out of range
-> INVALID_PARAMETER; a malformed batch body -> MESSAGE_ILLEGAL. Nothing is stored unless every check
passed (a batch is stored all-or-nothing by the broker).

Bodies and sysFlag bits (compression) are stored as received. A single message goes through
:meth:`~mqproxy.facade.api.Producing.send`, which decides what happens to it: transactional half
messages (sysFlag PREPARED or ``TRAN_MSG=true``; ``PGROUP`` defaults to the producer group) are parked
until END_TRANSACTION, ``DELAY`` levels (clamped to the highest, remark says so; 0 or below: no delay;
not a number: MESSAGE_ILLEGAL) or ``TIMER_*`` deliver-at properties hold the message back, a
``%RETRY%`` send whose ``reconsumeTimes`` exceeds the max goes to ``%DLQ%<group>`` (undelayed), and a
message naming no light queue gets the MQTT gateway's (``MQTT_TOPIC``).
A message without ``UNIQ_KEY`` (ali-ons) gets one, stored with it and returned as ``transactionId``.
Like a Java broker, every stored message gets ``CLUSTER``, ``MSG_REGION`` and ``TRACE_ON``.
``INNER_MULTI_DISPATCH`` names the ``%LMQ%`` queues that also index the message (spec §9.3).

Response header: ``msgId`` (offset message id from the advertised host and the commit-log offset;
comma-joined for a batch), ``queueId``, ``queueOffset`` (first message), ``transactionId``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from mqproxy.codecs.message_record import (
    MAX_PROPERTIES_BYTES,
    RecordError,
    decode_batch_body,
    decode_properties,
)
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.api import SendRequest
from mqproxy.model.errors import IllegalTopic
from mqproxy.model.ids import MessageIdError, new_uniq_key, offset_msg_id
from mqproxy.model.topics import (
    MAX_TOPIC_BYTES,
    RETRY_PREFIX,
    is_lmq,
    is_send_forbidden,
    validate_topic,
)
from mqproxy.model.types import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_UNIQ_KEY,
    Message,
    SendResult,
)
from mqproxy.remoting.context import CLUSTER_NAME
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import SendHeader, parse_header
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

PROPERTY_CLUSTER: Final = "CLUSTER"
PROPERTY_MSG_REGION: Final = "MSG_REGION"
PROPERTY_TRACE_ON: Final = "TRACE_ON"
_uniq_counter = itertools.count()


async def send_message(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    return await _send_single(session, request, note, short_keys=False)


async def send_message_v2(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    return await _send_single(session, request, note, short_keys=True)


async def send_batch_message(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(SendHeader, request.ext_fields, short_keys=True)
    note.group, note.topic = header.producer_group, header.topic
    _check_topic(header.topic)
    if header.topic.startswith(RETRY_PREFIX):
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "batch request does not support retry group")
    envelope = _properties(header.properties)
    try:
        entries = decode_batch_body(request.body)
    except RecordError as exc:
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
    if not entries:
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "bad batch body: no messages")
    messages = []
    for entry in entries:
        properties = entry.properties
        _check_properties_size(properties)
        _ensure_uniq_key(session, properties)
        messages.append(_message(session, header, entry.body, properties, entry.flag))
    envelope_key = envelope.get(PROPERTY_UNIQ_KEY) or _new_uniq_key(session)
    await _auto_create(session, header)
    results = await session.broker.send_batch(messages)
    return _reply(session, results, envelope_key)


async def _send_single(
    session: RemotingSession, request: RemotingCommand, note: Note, *, short_keys: bool
) -> Reply:
    header = parse_header(SendHeader, request.ext_fields, short_keys=short_keys)
    note.group, note.topic = header.producer_group, header.topic
    _check_topic(header.topic)
    properties = _properties(header.properties)
    uniq_key = _ensure_uniq_key(session, properties)
    message = _message(session, header, request.body, properties, header.flag)
    create = header.default_topic_queue_nums if session.ctx.auto_create_topics else None
    outcome = await session.broker.send(
        SendRequest(
            message,
            producer_group=header.producer_group,
            max_reconsume_times=header.max_reconsume_times,
            create_queues=create,
        )
    )
    reply = _reply(session, [outcome.result], uniq_key)
    if outcome.parked:  # half or delayed: answer the queue it will be delivered to
        reply.ext["queueId"] = str(outcome.queue_id)
    if outcome.parked != "half":
        reply.remark = _delay_remark(session, properties)
    return reply


def _check_topic(topic: str) -> None:
    if len(topic.encode("utf-8", "surrogatepass")) > MAX_TOPIC_BYTES:
        raise RequestError(
            ResponseCode.MESSAGE_ILLEGAL, f"message topic length too long {len(topic)}, max {MAX_TOPIC_BYTES}"
        )
    try:
        validate_topic(topic)
    except IllegalTopic as exc:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"illegal topic: {exc}") from None
    if is_send_forbidden(topic):
        raise RequestError(ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")


def _delay_remark(session: RemotingSession, properties: dict[str, str]) -> str | None:
    """A note on the ``DELAY`` level actually applied (clamped or none), or None."""
    raw = properties.get(PROPERTY_DELAY_LEVEL)
    if raw is None:
        return None
    level = int(raw.strip())  # the facade already refused a non-number
    applied = session.broker.clamp_delay_level(level)
    if applied == 0:
        return f"delay level {level}: not delayed"
    if applied != level:
        return f"delay level {level} clamped to {applied}"
    return None


def _check_properties_size(properties: dict[str, str]) -> None:
    try:
        size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in properties.items())
    except UnicodeEncodeError:
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "message properties are not valid UTF-8") from None
    if size > MAX_PROPERTIES_BYTES:
        raise RequestError(
            ResponseCode.MESSAGE_ILLEGAL,
            f"message properties length too long {size}, max {MAX_PROPERTIES_BYTES}",
        )


def _properties(text: str) -> dict[str, str]:
    properties = decode_properties(text)
    _check_properties_size(properties)
    return properties


def _new_uniq_key(session: RemotingSession) -> str:
    now_ms = time.time_ns() // 1_000_000
    return new_uniq_key(session.ctx.msg_id_host, os.getpid(), next(_uniq_counter), now_ms)


def _ensure_uniq_key(session: RemotingSession, properties: dict[str, str]) -> str:
    key = properties.get(PROPERTY_UNIQ_KEY)
    if not key:
        key = properties[PROPERTY_UNIQ_KEY] = _new_uniq_key(session)
    return key


def _message(
    session: RemotingSession, header: SendHeader, body: bytes, properties: dict[str, str], flag: int
) -> Message:
    """The message to store for ``header``'s topic and queue (a negative queue id: any queue)."""
    ctx = session.ctx
    # what a Java broker stamps on every message it stores (AbstractSendMessageProcessor)
    properties[PROPERTY_CLUSTER] = CLUSTER_NAME
    properties[PROPERTY_MSG_REGION] = ctx.region
    properties[PROPERTY_TRACE_ON] = "true" if ctx.trace_on else "false"
    dispatch = properties.get(PROPERTY_INNER_MULTI_DISPATCH)
    lmqs = tuple(name for name in dispatch.split(",") if is_lmq(name)) if dispatch else ()
    return Message(
        topic=header.topic,
        body=body,
        queue_id=max(header.queue_id, -1),
        flag=flag,
        properties=properties,
        sys_flag=header.sys_flag,
        born_timestamp_ms=header.born_timestamp_ms,
        born_host=session.peer,
        reconsume_times=header.reconsume_times,
        dispatch=lmqs,
    )


async def _auto_create(session: RemotingSession, header: SendHeader) -> None:
    """Create an unknown topic with the producer's ``defaultTopicQueueNums`` (capped by the default)."""
    ctx, broker = session.ctx, session.broker
    if not ctx.auto_create_topics or header.default_topic_queue_nums is None:
        return
    if await broker.get_topic(header.topic) is None:
        count = min(max(header.default_topic_queue_nums, 1), ctx.default_queue_count)
        await broker.create_topic(header.topic, count)


def _reply(session: RemotingSession, results: Sequence[SendResult], transaction_id: str) -> Reply:
    host = (session.ctx.msg_id_host, session.ctx.advertised_port)
    try:
        msg_ids = ",".join(offset_msg_id(host, r.commitlog_offset) for r in results)
    except MessageIdError as exc:  # pragma: no cover - msg_id_host is validated by ServerContext
        raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
    first = results[0]
    return Reply(
        ResponseCode.SUCCESS,
        {
            "msgId": msg_ids,
            "queueId": str(first.queue_id),
            "queueOffset": str(first.queue_offset),
            "transactionId": transaction_id,
        },
    )

"""
mqproxy.remoting.retry
~~~~~~~~~~~~~~~~~~~~~~

CONSUMER_SEND_MSG_BACK (36), spec §3.10 and §7.2, on :meth:`~mqproxy.facade.api.Consuming.send_back`
(the facade decides between the retry and the dead-letter topic).

The consumed message is found by its commit-log offset (``offset``, the record's PHYSICALOFFSET); a
miss, or an offset that points into an internal topic, answers SYSTEM_ERROR "look message by offset
failed". The copy goes to ``%RETRY%<group>`` with ``DELAY`` = ``delayLevel`` (0: ``3 +
reconsumeTimes``; above the highest level: clamped) and ``reconsumeTimes + 1``, or to ``%DLQ%<group>``
once ``reconsumeTimes >= maxReconsumeTimes`` (header, default 16) or ``delayLevel < 0``. The remark
says which (``retry at delay level N`` / ``sent to %DLQ%<group>``). ``ORIGIN_MESSAGE_ID`` is the
first message's offset message id, as a Java broker sets it (the header's ``originMsgId`` is ignored).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.model.ids import offset_msg_id
from mqproxy.model.topics import SYSTEM_TOPIC_PREFIX, is_send_forbidden
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import SendBackHeader, parse_header
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession


async def consumer_send_msg_back(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(SendBackHeader, request.ext_fields)
    note.group, note.topic = header.group, header.origin_topic
    if not header.group:
        raise RequestError(ResponseCode.INVALID_PARAMETER, "header field 'group' is empty")
    message = None
    if header.offset >= 0:
        message = await session.broker.get_message(header.offset, topic=header.origin_topic)
    if message is None or _internal(message.topic):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {header.offset}")
    note.topic = note.topic or message.topic
    ctx = session.ctx
    # as a Java broker: the stored message's offset id (the header's originMsgId is the client's UNIQ_KEY)
    origin = offset_msg_id((ctx.msg_id_host, ctx.advertised_port), header.offset)
    outcome = await session.broker.send_back(
        header.group,
        message,
        delay_level=header.delay_level,
        max_reconsume_times=header.max_reconsume_times,
        origin_msg_id=origin,
    )
    if outcome.dead:
        remark = f"sent to %DLQ%{header.group} after {message.reconsume_times} reconsumes"
    elif outcome.delay_level != header.delay_level and header.delay_level > 0:
        remark = f"delay level {header.delay_level} clamped to {outcome.delay_level}"
    else:
        remark = f"retry at delay level {outcome.delay_level}"
    return Reply(ResponseCode.SUCCESS, remark=remark)


def _internal(topic: str) -> bool:
    """Records of the broker's own topics are never sent back."""
    return topic.startswith(SYSTEM_TOPIC_PREFIX) or is_send_forbidden(topic)

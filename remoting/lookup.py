"""
mqproxy.remoting.lookup
~~~~~~~~~~~~~~~~~~~~~~~

Finding stored messages again, as ``queryMessage``/``viewMessage`` and ``mqadmin queryMsgBy*`` do.

* QUERY_MESSAGE (12): header ``topic``, ``key``, ``maxNum``, ``beginTimestamp``, ``endTimestamp``; the
  ext ``_UNIQUE_KEY_QUERY=true`` (a unique-id query) uses the broker's default count, 32. Answers the
  records of the topic's messages stored in that window whose ``KEYS`` or ``UNIQ_KEY`` is the key (at
  most :data:`MAX_QUERY_MESSAGES`, the newest, in commit-log order, as a Java broker sends them), with
  ``indexLastUpdateTimestamp``/``indexLastUpdatePhyoffset``; none: QUERY_NOT_FOUND (22) "can not find
  message, maybe time range not correct" (clients turn it into "no message").
* VIEW_MESSAGE_BY_ID (33): header ``offset`` (the commit-log offset an offset message id encodes) ->
  that record; none: SYSTEM_ERROR "can not find message by the offset, <offset>", as a Java broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.api import MessageQuery
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import Fields
from mqproxy.remoting.records import records_body
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

#: Most messages one QUERY_MESSAGE returns (the broker's ``maxMsgsNumBatch``) ...
MAX_QUERY_MESSAGES: Final = 64
#: ... and how many a unique-id query asks for (``defaultQueryMaxNum``).
UNIQUE_QUERY_MESSAGES: Final = 32
UNIQUE_QUERY_FLAG: Final = "_UNIQUE_KEY_QUERY"


async def query_message(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    fields = Fields(request.ext_fields)
    topic, key = fields.text("topic"), fields.text("key")
    note.topic = topic
    wanted = fields.integer("maxNum")
    if fields.boolean(UNIQUE_QUERY_FLAG, False):
        wanted = UNIQUE_QUERY_MESSAGES
    begin, end = fields.integer("beginTimestamp", wide=True), fields.integer("endTimestamp", wide=True)
    found = await session.broker.query_messages(
        MessageQuery(topic, key, min(max(wanted, 0), MAX_QUERY_MESSAGES), begin, end)
    )
    if not found:
        raise RequestError(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
    found.sort(key=lambda m: m.commitlog_offset)
    newest = max(found, key=lambda m: (m.store_timestamp_ms, m.commitlog_offset))
    ext = {
        "indexLastUpdateTimestamp": str(newest.store_timestamp_ms),
        "indexLastUpdatePhyoffset": str(newest.commitlog_offset),
    }
    return Reply(ResponseCode.SUCCESS, ext, records_body(session, found, "QUERY_MESSAGE"))


async def view_message_by_id(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    fields = Fields(request.ext_fields)
    offset = fields.integer("offset", wide=True)
    note.topic = fields.optional_text("topic")
    message = await session.broker.get_message(offset, topic=note.topic or "") if offset >= 0 else None
    if message is None:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
    note.topic = message.topic
    return Reply(ResponseCode.SUCCESS, body=records_body(session, [message], "VIEW_MESSAGE_BY_ID"))

"""
mqproxy.remoting.offsets
~~~~~~~~~~~~~~~~~~~~~~~~

Consumer offsets and queue offsets (spec §3.4-§3.7).

* QUERY_CONSUMER_OFFSET (14): the committed offset; for a group that never committed, ``0`` while the
  queue still holds offset 0 (the broker rule of spec §3.4: a new group reads a queue from its start
  while nothing was deleted), else QUERY_NOT_FOUND (22) so the client applies its ConsumeFromWhere
  policy; always 22 when the request says ``setZeroIfNotFound=false``.
* UPDATE_CONSUMER_OFFSET (15): stores ``commitOffset``; negative values (ali-ons sends -1 for queues
  it never consumed) are acknowledged and ignored. Usually oneway.
* GET_MAX_OFFSET (30), GET_MIN_OFFSET (31): ``offset``; GET_EARLIEST_MSG_STORETIME (32): ``timestamp``.
* SEARCH_OFFSET_BY_TIMESTAMP (29): ``offset`` of the first message stored at or after ``timestamp``
  (``boundaryType=UPPER``: the last one stored at or before it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.remoting.headers import (
    QueryOffsetHeader,
    QueueHeader,
    SearchOffsetHeader,
    UpdateOffsetHeader,
    parse_header,
)
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

#: The Java broker's remark for QUERY_NOT_FOUND.
_NOT_FOUND_REMARK = "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"


async def query_consumer_offset(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(QueryOffsetHeader, request.ext_fields)
    note.group, note.topic = header.consumer_group, header.topic
    broker = session.broker
    offset = await broker.query_consumer_offset(header.consumer_group, header.topic, header.queue_id)
    if offset is not None and offset >= 0:
        return Reply(ResponseCode.SUCCESS, {"offset": str(offset)})
    if header.set_zero_if_not_found and await broker.min_offset(header.topic, header.queue_id) <= 0:
        return Reply(ResponseCode.SUCCESS, {"offset": "0"})
    return Reply(ResponseCode.QUERY_NOT_FOUND, remark=_NOT_FOUND_REMARK)


async def update_consumer_offset(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(UpdateOffsetHeader, request.ext_fields)
    note.group, note.topic = header.consumer_group, header.topic
    if header.commit_offset >= 0:
        await session.broker.commit_consumer_offset(
            header.consumer_group, header.topic, header.queue_id, header.commit_offset
        )
    return Reply(ResponseCode.SUCCESS)


async def get_max_offset(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    return await _queue_figure(session, request, note, "offset", session.broker.max_offset)


async def get_min_offset(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    return await _queue_figure(session, request, note, "offset", session.broker.min_offset)


async def get_earliest_store_time(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    return await _queue_figure(session, request, note, "timestamp", session.broker.earliest_store_time)


async def _queue_figure(
    session: RemotingSession,
    request: RemotingCommand,
    note: Note,
    name: str,
    read: Callable[[str, int], Awaitable[int]],
) -> Reply:
    """The answer ``{name: read(topic, queueId)}`` for a request with a :class:`QueueHeader`."""
    header = parse_header(QueueHeader, request.ext_fields)
    note.topic = header.topic
    return Reply(ResponseCode.SUCCESS, {name: str(await read(header.topic, header.queue_id))})


async def search_offset_by_timestamp(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(SearchOffsetHeader, request.ext_fields)
    note.topic = header.topic
    broker = session.broker
    if header.upper_bound:
        # last message stored at or before the timestamp = first one after it, minus one
        after = await broker.search_offset(header.topic, header.queue_id, header.timestamp_ms + 1)
        offset = max(after - 1, await broker.min_offset(header.topic, header.queue_id))
    else:
        offset = await broker.search_offset(header.topic, header.queue_id, header.timestamp_ms)
    return Reply(ResponseCode.SUCCESS, {"offset": str(offset)})

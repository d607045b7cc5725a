"""
mqproxy.remoting.consume
~~~~~~~~~~~~~~~~~~~~~~~~

PULL_MESSAGE (11) and LITE_PULL_MESSAGE (361), spec §3.3.

* Filter: the request's ``subscription`` when sysFlag has the subscription bit (0x4), else the
  subscription the group's heartbeat registered for the topic (SUBSCRIPTION_NOT_EXIST (24) if none);
  its type is the request's ``expressionType``, else the registered one; the broker facade applies it
  (a batch whose every message fails the expression moves the cursor on). An expression that does not
  compile, or another type, is SUBSCRIPTION_PARSE_FAILED (23).
* Commit: with the commit bit (0x1) a non-negative ``commitOffset`` is stored for the group first.
* Long polling: with the suspend bit (0x2) a pull that finds nothing is held by the facade for up to
  ``suspendTimeoutMillis`` (capped by ``ServerContext.long_poll_max_s``). Expiry answers PULL_NOT_FOUND (19);
  so does a server drain, at once (the hold is cancelled and the queue read again without one).
* Served inline by the read loop (``ConnectionLimits.batch_codes``, ``Note.answer_at_once``), a pull
  that finds nothing and may be held raises :class:`~mqproxy.remoting.errors.WouldWait` instead, and runs
  again, held, in its own task.
* Every status carries ``suggestWhichBrokerId``, ``nextBeginOffset``, ``minOffset``, ``maxOffset``.
  SUCCESS bodies are concatenated V1 records (IPv4 hosts) as every legacy client decodes them; the pull
  asks the backend for them in that form (``PullRequest.wire``), which the embedded store gives by
  transcoding its stored records without decoding them into messages.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Final

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.api import BrokerFacade, PullRequest
from mqproxy.model.sql92 import Sql92Error, compile_sql92
from mqproxy.model.types import FilterExpression, PullResult, PullStatus, Subscription
from mqproxy.remoting.errors import RequestError, WouldWait
from mqproxy.remoting.headers import PullHeader, parse_header
from mqproxy.remoting.records import records_body
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

_STATUS_REMARK: Final = {
    PullStatus.FOUND: "FOUND",
    PullStatus.NO_NEW_MSG: "NO_NEW_MESSAGE",
    PullStatus.NO_MATCHED_MSG: "NO_MATCHED_MESSAGE",
    PullStatus.OFFSET_ILLEGAL: "OFFSET_ILLEGAL",
}


async def pull_message(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(PullHeader, request.ext_fields)
    note.group, note.topic = header.consumer_group, header.topic
    broker, ctx = session.broker, session.ctx
    config = await broker.get_topic(header.topic)
    if config is None:
        raise RequestError(
            ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic[:255]}] not exist, apply first please!"
        )
    queues = max(config.read_queues, config.write_queues)
    if not 0 <= header.queue_id < queues:
        raise RequestError(
            ResponseCode.INVALID_PARAMETER,
            f"queueId[{header.queue_id}] is illegal, topic:[{config.name}] readQueueNums:[{queues}]",
        )
    message_filter = await _filter(session, header)
    max_count = min(max(header.max_msg_nums, 1), ctx.max_pull_batch)
    max_bytes = ctx.max_pull_bytes
    if header.max_msg_bytes is not None and header.max_msg_bytes > 0:
        max_bytes = min(max_bytes, header.max_msg_bytes)
    hold_s = 0.0
    if header.suspend and header.suspend_timeout_ms > 0:
        hold_s = min(header.suspend_timeout_ms / 1000.0, ctx.long_poll_max_s)
    request = PullRequest(
        header.consumer_group,
        header.topic,
        header.queue_id,
        header.queue_offset,
        max_count,
        max_bytes=max_bytes,
        message_filter=message_filter,
        hold_s=hold_s,
        commit_offset=header.commit_offset if header.has_commit_offset else -1,
        wire=True,
    )
    result: PullResult | None = None
    if note.answer_at_once and hold_s > 0:  # served inline: answer now, or hand over to a task
        result = await broker.pull(dataclasses.replace(request, hold_s=0.0))
        if result.status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
            raise WouldWait
    else:
        with session.holds.until_drain():
            result = await broker.pull(request)
    if result is None:  # the server drains: answer at once with what is there, unheld
        result = await broker.pull(dataclasses.replace(request, hold_s=0.0, commit_offset=-1))
    ctx.pull_offsets.record(header.consumer_group, header.topic, header.queue_id, result.next_offset)
    return _reply(session, result, held=hold_s > 0)


def _reply(session: RemotingSession, result: PullResult, *, held: bool) -> Reply:
    ext = {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": str(result.next_offset),
        "minOffset": str(result.min_offset),
        "maxOffset": str(result.max_offset),
    }
    remark = _STATUS_REMARK[result.status]
    if result.status is PullStatus.FOUND:
        if result.records is not None:  # already in the form every client decodes (see PullResult)
            return Reply(ResponseCode.SUCCESS, ext, result.records.data, remark)
        return Reply(
            ResponseCode.SUCCESS, ext, records_body(session, result.messages, "PULL_MESSAGE"), remark
        )
    if result.status is PullStatus.OFFSET_ILLEGAL:
        return Reply(ResponseCode.PULL_OFFSET_MOVED, ext, remark=remark)
    if result.status is PullStatus.NO_MATCHED_MSG and not (held and result.next_offset >= result.max_offset):
        return Reply(ResponseCode.PULL_RETRY_IMMEDIATELY, ext, remark=remark)
    return Reply(ResponseCode.PULL_NOT_FOUND, ext, remark=remark)


async def _filter(session: RemotingSession, header: PullHeader) -> FilterExpression:
    """The filter of this pull (TAG or SQL92), checked here so that a bad one is SUBSCRIPTION_PARSE_FAILED."""
    if header.has_subscription:
        expression, kind = header.subscription or "", header.expression_type or "TAG"
    else:
        registered = await _registered_subscription(session, header.consumer_group, header.topic)
        expression = registered.expression
        kind = header.expression_type or registered.expression_type
    kind = kind.strip().upper() or "TAG"
    if kind not in ("TAG", "SQL92"):
        raise RequestError(
            ResponseCode.SUBSCRIPTION_PARSE_FAILED,
            f"expression type {kind[:32]!r} is not supported, only TAG and SQL92",
        )
    if kind == "SQL92":
        try:
            compile_sql92(expression)
        except Sql92Error as exc:
            raise RequestError(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"parse the consumer's subscription[{expression[:255]}] failed, group: "
                f"{header.consumer_group[:255]}: {exc}",
            ) from None
    return FilterExpression(expression, kind)


async def _registered_subscription(session: RemotingSession, group: str, topic: str) -> Subscription:
    """The subscription to ``topic`` from the group's heartbeats (this connection first)."""
    own = [cid for g, cid in sorted(session.memberships) if g == group]
    broker = session.broker
    for client_id in own:
        found = await _subscription_of(broker, group, client_id, topic)
        if found is not None:
            return found
    for client_id in await broker.consumer_ids(group):  # only when this connection's own have none
        found = None if client_id in own else await _subscription_of(broker, group, client_id, topic)
        if found is not None:
            return found
    raise RequestError(
        ResponseCode.SUBSCRIPTION_NOT_EXIST,
        f"the consumer's subscription not exist, group: {group[:255]} topic: {topic[:255]}",
    )


async def _subscription_of(
    broker: BrokerFacade, group: str, client_id: str, topic: str
) -> Subscription | None:
    info = await broker.consumer_info(group, client_id)
    if info is not None:
        for subscription in info.subscriptions:
            if subscription.topic == topic:
                return subscription
    return None

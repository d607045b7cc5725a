"""
mqproxy.remoting.admin
~~~~~~~~~~~~~~~~~~~~~~

Admin requests the broker relays to one consumer client (spec §3.22-3.23), as a Java broker's
``AdminBrokerProcessor.callConsumer`` does:

* GET_CONSUMER_RUNNING_INFO (307): header ``consumerGroup``, ``clientId``, ``jstackEnable``.
* CONSUME_MESSAGE_DIRECTLY (309): header ``consumerGroup``, ``clientId``, ``msgId`` (offset message id),
  optional ``brokerName``/``topic``; the stored record is looked up by its commit-log offset and sent as
  the body, ``brokerName`` is set to ours.

The request (same code, same header fields) goes to the connection that owns (group, client id) in
the server's registry as a server->client call with a new opaque, and the client's code, remark,
header and body are the admin's answer. Contract:

* client not joined to the group -> SYSTEM_ERROR ``The Consumer <group> <clientId> not online``;
* no answer within :data:`CALL_TIMEOUT_S` -> CONSUME_MSG_TIMEOUT (207)
  ``consumer <group> <clientId> Timeout: ...`` (the Java broker's code for a call timeout);
* the client's connection ends mid-call -> SYSTEM_ERROR at once;
* unknown or malformed ``msgId`` -> SYSTEM_ERROR naming it (the Java broker fails the same way).

Only the admin's own request task waits: nothing else on either connection is blocked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

from mqproxy.codecs.message_record import encode_record
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.ids import MessageIdError, parse_offset_msg_id
from mqproxy.remoting.context import BROKER_NAME
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import Fields
from mqproxy.remoting.records import dropped_logger
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

__all__ = [
    "CALL_TIMEOUT_S",
    "ClientCaller",
    "consume_message_directly",
    "get_consumer_running_info",
]

#: How long the relayed call waits for the client (Java admin tools wait 3 s + network).
CALL_TIMEOUT_S: Final = 3.0

#: Header fields the Java client copies into its own answer context; everything else is relayed too.
_SERVER_FIELDS: Final = frozenset({"MSG_REGION", "TRACE_ON"})


class ClientCaller(Protocol):
    """A client connection the server can call (:class:`~mqproxy.remoting.connection.RemotingConnection`)."""

    closed: bool

    async def call(self, command: RemotingCommand, timeout_s: float) -> RemotingCommand | None: ...


async def get_consumer_running_info(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    fields = Fields(request.ext_fields)
    group, client_id = fields.text("consumerGroup"), fields.text("clientId")
    note.group = group
    return await _relay(session, request, group, client_id, dict(request.ext_fields), request.body)


async def consume_message_directly(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    fields = Fields(request.ext_fields)
    group, client_id, msg_id = fields.text("consumerGroup"), fields.text("clientId"), fields.text("msgId")
    note.group, note.topic = group, fields.optional_text("topic")
    try:
        _, offset = parse_offset_msg_id(msg_id)
    except MessageIdError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad msgId {msg_id[:64]!r}: {exc}"[:256]) from None
    message = await session.broker.get_message(offset, topic=note.topic or "")
    if message is None:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"no message for msgId {msg_id} (commit-log offset {offset})"
        )
    ext = dict(request.ext_fields)
    ext["brokerName"] = BROKER_NAME
    note.topic = message.topic
    return await _relay(
        session,
        request,
        group,
        client_id,
        ext,
        encode_record(message, on_dropped=dropped_logger("CONSUME_MESSAGE_DIRECTLY", client_id)),
    )


async def _relay(
    session: RemotingSession,
    request: RemotingCommand,
    group: str,
    client_id: str,
    ext: dict[str, str],
    body: bytes,
) -> Reply:
    peer = session.ctx.groups.owner(group, client_id)
    if peer is None or not hasattr(peer, "call"):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online")
    caller: ClientCaller = peer  # type: ignore[assignment]
    code = RequestCode(request.code)
    answer = await caller.call(RemotingCommand(code, ext_fields=ext, body=body), CALL_TIMEOUT_S)
    if answer is None:
        if caller.closed:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"invoke consumer <{group}> <{client_id}> Exception: connection closed during {code.name}",
            )
        raise RequestError(
            ResponseCode.CONSUME_MSG_TIMEOUT,
            f"consumer <{group}> <{client_id}> Timeout: no answer to {code.name} in {CALL_TIMEOUT_S:g} s",
        )
    try:
        status = ResponseCode(answer.code)
    except ValueError:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"consumer <{group}> <{client_id}> answered unknown code {answer.code}"
        ) from None
    relayed = {k: v for k, v in answer.ext_fields.items() if k not in _SERVER_FIELDS}
    return Reply(status, ext=relayed, body=answer.body, remark=answer.remark)

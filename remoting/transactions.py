"""
mqproxy.remoting.transactions
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Transactional messages over remoting (spec §3.11, §3.13, §7.1), on the broker facade
(:meth:`~mqproxy.facade.api.Producing.end_transaction`, check-backs through
:meth:`~mqproxy.facade.api.Producing.add_check_back`).

* A SEND with sysFlag PREPARED or ``TRAN_MSG=true`` stores a half message (see :mod:`.produce`); the
  send response's ``msgId`` encodes the half record's commit-log offset and ``queueOffset`` is its
  offset in the half topic, exactly what END_TRANSACTION sends back.
* END_TRANSACTION (37, usually oneway): ``commitOrRollback`` 8 commits (the message becomes visible
  in its real topic, delay rules apply), 12 rolls back, 0 does nothing. The half message is found by
  ``commitLogOffset`` and must belong to ``producerGroup``. Errors: no unresolved half message at that
  offset, or already resolved -> SYSTEM_ERROR; wrong group -> SYSTEM_ERROR "the producer group wrong";
  a producer's late end after ``CHECK_IMMUNITY_TIME_IN_SECONDS`` -> ILLEGAL_OPERATION (604); any other
  ``commitOrRollback`` -> INVALID_PARAMETER.
* CHECK_TRANSACTION_STATE (39) is built by :func:`check_command` and sent oneway by
  :meth:`mqproxy.remoting.registry.ConnectionRegistry.check_transaction` to a live connection that
  announced the producer group in its heartbeat; the client answers with END_TRANSACTION
  (``fromTransactionCheck=true``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from mqproxy.codecs.message_record import encode_record
from mqproxy.codecs.remoting import FLAG_ONEWAY, RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.api import EndTransaction
from mqproxy.facade.types import Resolution, TransactionCheck
from mqproxy.model.ids import offset_msg_id
from mqproxy.model.types import PROPERTY_UNIQ_KEY
from mqproxy.remoting.context import BROKER_NAME, ServerContext
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.headers import EndTransactionHeader, parse_header
from mqproxy.remoting.records import dropped_logger
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

_RESOLUTIONS: Final = {r.value: r for r in Resolution}


async def end_transaction(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    header = parse_header(EndTransactionHeader, request.ext_fields)
    note.group = header.producer_group
    resolution = _RESOLUTIONS.get(header.commit_or_rollback)
    if resolution is None:
        raise RequestError(
            ResponseCode.INVALID_PARAMETER,
            f"commitOrRollback {header.commit_or_rollback} is not 0 (unknown), 8 (commit) or 12 (rollback)",
        )
    if resolution is Resolution.UNKNOWN:
        return Reply(ResponseCode.SUCCESS, remark="transaction state unknown: left for check-back")
    result = await session.broker.end_transaction(
        EndTransaction(
            resolution,
            producer_group=header.producer_group,
            commitlog_offset=header.commit_log_offset,
            from_check=header.from_transaction_check,
            tran_state_table_offset=header.tran_state_table_offset,
            topic=header.topic or "",
        )
    )
    if result is not None:
        note.topic = result.topic
    return Reply(ResponseCode.SUCCESS, remark=resolution.name.lower())


def check_command(check: TransactionCheck, ctx: ServerContext, *, legacy: bool) -> RemotingCommand:
    """The oneway CHECK_TRANSACTION_STATE request for ``check`` (spec §3.13); opaque left 0."""
    half, message = check.half, check.message
    uniq = message.properties.get(PROPERTY_UNIQ_KEY) or check.transaction_id
    ext = {
        "topic": message.topic,
        "tranStateTableOffset": str(half.queue_offset),
        "commitLogOffset": str(half.commitlog_offset),
        "msgId": uniq,
        "transactionId": check.transaction_id or uniq,
        "offsetMsgId": offset_msg_id((ctx.msg_id_host, ctx.advertised_port), half.commitlog_offset),
        "bname": BROKER_NAME,
    }
    return RemotingCommand(
        code=RequestCode.CHECK_TRANSACTION_STATE,
        flag=FLAG_ONEWAY,
        ext_fields=ext,
        body=encode_record(message, legacy=legacy, on_dropped=dropped_logger("CHECK_TRANSACTION_STATE")),
        version=ctx.server_version,
    )

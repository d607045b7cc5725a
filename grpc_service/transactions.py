"""
mqproxy.grpc_service.transactions
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

``EndTransaction`` and the transaction check-back of gRPC producers.

v2 has no producer group, so half messages sent over gRPC carry ``PGROUP`` = ``%GRPC%<topic>``
(:data:`GRPC_TRANSACTION_GROUP_PREFIX`): the end of a transaction names that group, and
:meth:`TransactionRpcs.check_back` (registered with the facade) answers only checks of such half messages,
by sending ``RecoverOrphanedTransactionCommand`` to a live producer of the topic over its Telemetry stream.
"""

from __future__ import annotations

from typing import Any

import trio

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.facade.api import EndTransaction
from mqproxy.facade.types import Resolution, TransactionCheck
from mqproxy.grpc_service.call import Call, ok
from mqproxy.grpc_service.convert import to_rmq_message
from mqproxy.grpc_service.errors import ApiError
from mqproxy.grpc_service.resources import Resources

__all__ = ["GRPC_TRANSACTION_GROUP_PREFIX", "TransactionRpcs", "transaction_group"]

#: ``PGROUP`` of transactional messages sent over gRPC (v2 has no producer group): prefix + topic.
GRPC_TRANSACTION_GROUP_PREFIX = "%GRPC%"


def transaction_group(topic: str) -> str:
    """The producer group of transactional messages sent over gRPC to ``topic``."""
    return GRPC_TRANSACTION_GROUP_PREFIX + topic


_RESOLUTIONS = {
    pb.TransactionResolution.COMMIT: Resolution.COMMIT,
    pb.TransactionResolution.ROLLBACK: Resolution.ROLLBACK,
}


class TransactionRpcs:
    def __init__(self, resources: Resources) -> None:
        self._resources = resources

    async def end_transaction(self, call: Call, request: Any) -> Any:
        topic = self._resources.topic_name(call, request.topic)
        transaction_id = request.transaction_id or request.message_id
        if not transaction_id:
            raise ApiError(pb.Code.INVALID_TRANSACTION_ID, "transaction id is empty")
        await self._resources.broker.end_transaction(
            EndTransaction(
                _RESOLUTIONS.get(request.resolution, Resolution.UNKNOWN),
                producer_group=transaction_group(topic),
                transaction_id=transaction_id,
                from_check=request.source == pb.TransactionSource.SOURCE_SERVER_CHECK,
                topic=topic,
            )
        )
        return pb.EndTransactionResponse(status=ok())

    async def check_back(self, check: TransactionCheck) -> bool:
        """Send the check of a half message sent over gRPC to a live producer of its topic; False if none
        is online or the half message was not sent over gRPC."""
        if not check.producer_group.startswith(GRPC_TRANSACTION_GROUP_PREFIX):
            return False
        max_body = self._resources.server_settings.max_body_bytes
        command = pb.TelemetryCommand(
            recover_orphaned_transaction_command=pb.RecoverOrphanedTransactionCommand(
                message=to_rmq_message(check.message, max_body_bytes=max_body),
                transaction_id=check.transaction_id,
            )
        )
        for record in self._resources.clients.producers_of(check.message.topic):
            sender = record.telemetry
            if sender is None:
                continue
            try:
                await sender(command)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                continue
            return True
        return False

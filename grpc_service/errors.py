"""
mqproxy.grpc_service.errors
~~~~~~~~~~~~~~~~~~~~~~~~~~~

The one exception root of the gRPC service layer, and the mapping of broker errors to v2 codes.

* :class:`ApiError` — an application error: answered with a v2 ``Status`` in the response body (the call
  itself ends with ``grpc-status 0``, as the Apache proxy does).
* :class:`RpcError` — a call-level error: answered with ``grpc-status``/``grpc-message`` trailers.
"""

from __future__ import annotations

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.grpc_framing import GrpcStatus
from mqproxy.model import errors as se
from mqproxy.model.errors import (
    BackendError,
    IllegalTopic,
    MessageTooLarge,
    QueueNotFound,
    StoreFull,
    StoreUnavailable,
    TopicNotFound,
)

__all__ = ["ApiError", "GrpcServiceError", "RpcError", "code_for"]


class GrpcServiceError(Exception):
    """Base of the errors a handler raises on purpose; carries what to answer."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ApiError(GrpcServiceError):
    """Answer with ``Status{code, message}`` in the response body."""

    def __init__(self, code: pb.Code, message: str) -> None:
        super().__init__(message)
        self.code = code


class RpcError(GrpcServiceError):
    """End the call with ``grpc-status`` ``status``."""

    def __init__(self, status: GrpcStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


_CODES: tuple[tuple[type[BackendError], pb.Code], ...] = (
    (TopicNotFound, pb.Code.TOPIC_NOT_FOUND),
    (IllegalTopic, pb.Code.ILLEGAL_TOPIC),
    (QueueNotFound, pb.Code.BAD_REQUEST),
    (MessageTooLarge, pb.Code.MESSAGE_BODY_TOO_LARGE),
    # A full disk: the Apache proxy maps the broker's SERVICE_NOT_AVAILABLE (like every remoting code but
    # a few) to INTERNAL_SERVER_ERROR with the broker's remark as the message (ResponseBuilder.buildCode).
    (StoreFull, pb.Code.INTERNAL_SERVER_ERROR),
    (StoreUnavailable, pb.Code.INTERNAL_SERVER_ERROR),
    (se.MalformedReceipt, pb.Code.INVALID_RECEIPT_HANDLE),
    (se.ReceiptExpired, pb.Code.INVALID_RECEIPT_HANDLE),
    (se.MessageAlreadyAcked, pb.Code.INVALID_RECEIPT_HANDLE),
    (se.OffsetOutOfRange, pb.Code.MESSAGE_NOT_FOUND),
    (se.MessageNotFound, pb.Code.MESSAGE_NOT_FOUND),
    (se.InvalidDelay, pb.Code.ILLEGAL_DELIVERY_TIME),
    (se.InvalidArgument, pb.Code.BAD_REQUEST),
    (se.TransactionNotFound, pb.Code.INVALID_TRANSACTION_ID),
    (se.TransactionAlreadyResolved, pb.Code.INVALID_TRANSACTION_ID),
    (se.TransactionGroupMismatch, pb.Code.INVALID_TRANSACTION_ID),
    (se.TransactionCheckWindowClosed, pb.Code.BAD_REQUEST),
)


def code_for(exc: BackendError) -> pb.Code:
    """The v2 code answering a broker error (:mod:`mqproxy.model.errors`)."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return pb.Code.INTERNAL_SERVER_ERROR

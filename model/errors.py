"""
mqproxy.model.errors
~~~~~~~~~~~~~~~~~~~~

The one exception tree below the protocols: stores, broker services and every
:class:`~mqproxy.facade.BrokerFacade` implementation raise these and nothing else on purpose. Each error
names the condition, not the wire code; the protocols map them to their own codes (remoting response
code, MQTT reason code, gRPC v2 ``Code``). Service errors and their usual mapping:

=============================  ==============================  =====================================
error                          remoting (spec §2)              gRPC v2 ``Code``
=============================  ==============================  =====================================
MalformedReceipt               MESSAGE_ILLEGAL (13)            INVALID_RECEIPT_HANDLE (40013)
ReceiptExpired                 SUCCESS (broker ignores) or     INVALID_RECEIPT_HANDLE (40013)
                               NO_MESSAGE (208)
MessageAlreadyAcked            NO_MESSAGE (208)                INVALID_RECEIPT_HANDLE (40013)
OffsetOutOfRange               NO_MESSAGE (208)                MESSAGE_NOT_FOUND (40401)
InvalidDelay                   MESSAGE_ILLEGAL (13)            ILLEGAL_DELIVERY_TIME (40012)
InvalidArgument                INVALID_PARAMETER (29)          BAD_REQUEST (40000)
MessageNotFound                SYSTEM_ERROR (1)                MESSAGE_NOT_FOUND (40401)
TransactionNotFound            SYSTEM_ERROR (1)                INVALID_TRANSACTION_ID (40008)
TransactionAlreadyResolved     SYSTEM_ERROR (1)                INVALID_TRANSACTION_ID (40008)
TransactionGroupMismatch       SYSTEM_ERROR (1)                INVALID_TRANSACTION_ID (40008)
TransactionCheckWindowClosed   ILLEGAL_OPERATION (604)         BAD_REQUEST (40000)
=============================  ==============================  =====================================
"""

from __future__ import annotations


class BackendError(Exception):
    """Base of every error a backend raises on purpose."""


class TopicNotFound(BackendError):
    """The topic does not exist and auto-creation is off or not allowed for it."""


class TopicUnrouted(TopicNotFound):
    """With several backends: no routing rule covers the topic and there is no default backend (the
    message names the rules)."""


class IllegalTopic(BackendError):
    """The topic name breaks the naming rules (characters, length, reserved names)."""


class QueueNotFound(BackendError):
    """The queue id is outside the topic's queues."""


class MessageTooLarge(BackendError):
    """Body or properties exceed the configured maximum."""


class StoreUnavailable(BackendError):
    """The store cannot accept writes right now (closed, disk full, shutting down)."""


class StoreFull(StoreUnavailable):
    """The store refuses new messages: its disk is full (or above the warning ratio) or a write failed.

    ``cause`` is ``disk_full`` or ``write_error``; the message is the remark clients see (remoting
    SERVICE_NOT_AVAILABLE as the stock broker words it, gRPC status message, MQTT reason string). Reads
    keep working; writes resume by themselves once space is freed."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(
            "service not available now. It may be caused by one of the following reasons: "
            f"the broker's disk is full [{detail}], messages are put to the slave, message store has "
            "been shut down, etc."
            if cause == "disk_full"
            else f"service not available now: the message store cannot write ({detail})"
        )
        self.cause = cause
        self.detail = detail


class ClusterUnavailable(StoreUnavailable):
    """The cluster behind the proxy cannot be reached (no name server or no broker answers)."""


class BrokerRefused(BackendError):
    """A cluster broker or name server answered a forwarded request with an error: its remoting response
    ``code`` and ``remark`` are passed through to the client unchanged where the protocol allows."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(f"code {code}: {remark}")
        self.code = code
        self.remark = remark


class ServiceError(BackendError):
    """Base of every error a broker service raises on purpose."""


class InvalidArgument(ServiceError):
    """A parameter is outside its allowed range (batch size, invisible time, empty group, ...)."""


class InvalidDelay(ServiceError):
    """A ``DELAY`` / ``TIMER_*`` property is not a number."""


class MalformedReceipt(ServiceError):
    """A receipt handle (``extraInfo``) that does not parse."""


class ReceiptExpired(ServiceError):
    """The receipt's checkpoint is gone: the message was revived (redelivered) or its handle changed."""


class MessageAlreadyAcked(ServiceError):
    """Change-invisible on a message whose receipt was already acked."""


class OffsetOutOfRange(ServiceError):
    """The receipt names a queue offset outside the queue (spec §3.17: NO_MESSAGE)."""


class MessageNotFound(ServiceError):
    """No stored message at the given commit-log offset."""


class TransactionNotFound(ServiceError):
    """END_TRANSACTION for an offset that holds no half message."""


class TransactionAlreadyResolved(ServiceError):
    """The half message was already committed, rolled back or discarded."""


class TransactionGroupMismatch(ServiceError):
    """The half message's ``PGROUP`` differs from the producer group that ends it."""


class TransactionCheckWindowClosed(ServiceError):
    """A producer-initiated end arrived after ``CHECK_IMMUNITY_TIME_IN_SECONDS`` (spec §7.1)."""


class BadFilter(ServiceError):
    """A subscription filter expression that does not parse, or of an unsupported type."""

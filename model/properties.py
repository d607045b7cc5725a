"""
mqproxy.model.properties
~~~~~~~~~~~~~~~~~~~~~~~~

Names with a fixed meaning across mqproxy: the internal topics and consumer groups the broker services
keep their state in (as Apache RocketMQ does), message property keys (RocketMQ ``MessageConst``) and the
transaction bits of ``sysFlag``.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from typing import Final

#: Delayed messages, one queue per delay level (queue ``level - 1``), plus the timer queue.
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
#: Pop checkpoints, acks and revive marks (RocketMQ ``rmq_sys_REVIVE_LOG_<cluster>``).
REVIVE_TOPIC: Final = "rmq_sys_REVIVE_LOG"
HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
#: Where half messages go after ``check_max`` unanswered checks.
CHECK_MAX_TOPIC: Final = "TRANS_CHECK_MAX_TIME_TOPIC"

#: Internal consumer groups whose committed offsets record the services' progress.
SCHEDULE_GROUP: Final = "rmq_sys_SCHEDULE_GROUP"
REVIVE_GROUP: Final = "CID_RMQ_SYS_REVIVE_GROUP"
TRANSACTION_GROUP: Final = "CID_RMQ_SYS_TRANS"

# Property keys (spec §4.4).
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QID: Final = "REAL_QID"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME: Final = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
PROPERTY_DLQ_ORIGIN_TOPIC: Final = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID: Final = "DLQ_ORIGIN_MESSAGE_ID"
PROPERTY_TRANSACTION_PREPARED: Final = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
PROPERTY_TRANSACTION_ID: Final = "__transactionId__"
PROPERTY_TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
#: When a half message was prepared (transaction service clock, ms); internal, stripped on commit/check.
PROPERTY_HALF_TIME_MS: Final = "TRAN_HALF_TIME_MS"
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"
PROPERTY_FIRST_POP_TIME: Final = "1ST_POP_TIME"
PROPERTY_POP_CK: Final = "POP_CK"
#: When a parked message's current hop is due (ms); stripped on delivery. Internal to the scheduler.
PROPERTY_SCHEDULE_DUE_MS: Final = "SCHEDULE_DUE_MS"

#: Encoded properties limit (the remoting record stores their length as i16).
MAX_PROPERTIES_BYTES: Final = 32767


def properties_size(properties: Mapping[str, str]) -> int:
    """Bytes of the remoting properties string ``k\\x01v\\x02...`` for these properties."""
    return len("".join(chain.from_iterable(properties.items())).encode()) + 2 * len(properties)


#: sysFlag transaction bits (spec §4.2).
SYSFLAG_TRANSACTION_MASK: Final = 0xC
SYSFLAG_TRANSACTION_PREPARED: Final = 0x4
SYSFLAG_TRANSACTION_COMMIT: Final = 0x8

#: The one broker and cluster the proxy presents to clients (routes, receipt handles, recall handles).
PROXY_BROKER_NAME: Final = "broker-a"
PROXY_CLUSTER_NAME: Final = "DefaultCluster"

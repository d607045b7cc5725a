"""Fuzzing: whatever a peer sends, a session answers without a handler bug. Two profiles: every request
code with header-shaped keys, and the broker-service codes with their own keys and receipts."""

from __future__ import annotations

import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.types import Message
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.session import HANDLERS, RemotingSession

HEADER_KEYS = [
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "topic", "queueId", "queueOffset",
    "consumerGroup", "maxMsgNums", "sysFlag", "commitOffset", "suspendTimeoutMillis", "subscription",
    "expressionType", "clientID", "producerGroup", "timestamp", "boundaryType", "setZeroIfNotFound",
    "properties", "flag", "bornTimestamp", "maxMsgBytes",
]  # fmt: skip


def values(*samples: str) -> st.SearchStrategy[str]:
    """Header values: the given interesting ones, any integer (most out of range), any short text."""
    return st.one_of(st.sampled_from(samples), st.integers(-(2**65), 2**65).map(str), st.text(max_size=20))


HEADER_VALUES = values("T", "G", "0", "1", "-1", "4", "*", "TagA || B", "true", "", "%RETRY%G", "TBW102",
                       "SCHEDULE_TOPIC_XXXX", str(2**63), "A\x01b\x02", "UPPER")  # fmt: skip
HEADER_BODIES = st.one_of(
    st.binary(max_size=64),
    st.just(b'{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[{"topic":"T"}]}]}'),
    st.just(b'{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T","brokerName":"b","queueId":1}]}'),
    st.just(b'{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T","brokerName":"b","queueId":-1}]}'),
    st.just(b'{"clientId":"c","group":"G","subscriptionData":{"expressionType":"SQL92","subString":"a>1"}}'),
)

SERVICE_CODES = [RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.END_TRANSACTION, RequestCode.POP_MESSAGE,
                 RequestCode.ACK_MESSAGE, RequestCode.BATCH_ACK_MESSAGE, RequestCode.PEEK_MESSAGE,
         RequestCode.CHANGE_MESSAGE_INVISIBLETIME, RequestCode.NOTIFICATION, RequestCode.POLLING_INFO,
         RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ, RequestCode.SEND_MESSAGE_V2]  # fmt: skip
SERVICE_KEYS = ["offset", "group", "delayLevel", "maxReconsumeTimes", "originMsgId", "producerGroup",
        "commitLogOffset", "tranStateTableOffset", "commitOrRollback", "fromTransactionCheck",
        "consumerGroup", "topic", "queueId", "maxMsgNums", "invisibleTime", "pollTime", "bornTime",
        "initMode", "expType", "exp", "order", "extraInfo", "a", "b", "e", "f", "g", "h", "i"]  # fmt: skip
SERVICE_VALUES = values("T", "G", "PG", "0", "1", "-1", "8", "12", "33", "99", "true", "", "%RETRY%G_T",
                        "TAG", "SQL92", str(2**63), "0 1 60000 3 0 broker-a 0 0", "0 1 2 999 1 b 0 0", "x y",
                        "TRAN_MSG\x01true\x02", "DELAY\x01zz\x02",
                        "DELAY\x0199\x02PGROUP\x01PG\x02")  # fmt: skip
SERVICE_BODIES = st.one_of(
    st.binary(max_size=48),
    st.just(b'{"acks":[{"c":"G","t":"T","r":"0","so":0,"q":0,"rq":0,"pt":1,"it":1,"b":"BQ=="}]}'),
    st.just(b'{"acks":[{"c":"G","t":"T","r":"1","so":"x","q":0,"rq":0,"pt":1,"it":1,"b":"BQ=="}]}'),
    st.just(b'{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T","brokerName":"b","queueId":1}]}'),
)

#: Codes that may answer without a remark (success, pull not found / retry / moved).
_QUIET = (ResponseCode.SUCCESS, 19, 20, 21, 22)


async def assert_answered_without_a_bug(code: int, ext: dict[str, str], body: bytes, flag: int) -> None:
    """Handle one request on a fresh broker (topic ``T``, 4 queues, one message in queue 0)."""
    backend = InMemoryBackend()
    await backend.create_topic("T", 4)
    await backend.send(Message("T", b"m", queue_id=0))
    async with open_embedded_broker(backend) as broker:
        session = RemotingSession(broker, ServerContext("10.0.0.8", 8080, long_poll_max_s=0.0))
        request = RemotingCommand(code, opaque=1, flag=flag, ext_fields=ext, body=body)
        with structlog.testing.capture_logs() as logs:
            response = await session.handle(request)
    assert not [entry for entry in logs if entry["event"] == "internal.error"], logs
    if flag == 2:
        assert response is None
        return
    assert response is not None
    assert response.is_response
    assert response.opaque == 1
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in response.ext_fields.items())
    assert {"MSG_REGION", "TRACE_ON"} <= set(response.ext_fields)
    if response.code not in _QUIET:
        assert response.remark


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    code=st.one_of(st.sampled_from(sorted(HANDLERS)), st.integers(-(2**31), 2**31 - 1)),
    ext=st.dictionaries(st.sampled_from(HEADER_KEYS), HEADER_VALUES, max_size=12),
    body=HEADER_BODIES,
    flag=st.sampled_from([0, 2]),
)
async def test_fuzzed_requests_never_hit_a_handler_bug(code, ext, body, flag) -> None:
    await assert_answered_without_a_bug(code, ext, body, flag)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    code=st.sampled_from(SERVICE_CODES),
    ext=st.dictionaries(st.sampled_from(SERVICE_KEYS), SERVICE_VALUES, max_size=14),
    body=SERVICE_BODIES,
    flag=st.sampled_from([0, 2]),
)
async def test_fuzzed_service_requests_never_hit_a_handler_bug(code, ext, body, flag) -> None:
    await assert_answered_without_a_bug(code, ext, body, flag)

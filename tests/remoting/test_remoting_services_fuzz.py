"""Fuzzing the request codes served by the broker services: whatever a peer sends, no handler bug."""

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
from mqproxy.remoting.session import RemotingSession

CODES = [RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.END_TRANSACTION, RequestCode.POP_MESSAGE,
         RequestCode.ACK_MESSAGE, RequestCode.BATCH_ACK_MESSAGE, RequestCode.PEEK_MESSAGE,
         RequestCode.CHANGE_MESSAGE_INVISIBLETIME, RequestCode.NOTIFICATION, RequestCode.POLLING_INFO,
         RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ, RequestCode.SEND_MESSAGE_V2]  # fmt: skip
KEYS = ["offset", "group", "delayLevel", "maxReconsumeTimes", "originMsgId", "producerGroup",
        "commitLogOffset", "tranStateTableOffset", "commitOrRollback", "fromTransactionCheck",
        "consumerGroup", "topic", "queueId", "maxMsgNums", "invisibleTime", "pollTime", "bornTime",
        "initMode", "expType", "exp", "order", "extraInfo", "a", "b", "e", "f", "g", "h", "i"]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(["T", "G", "PG", "0", "1", "-1", "8", "12", "33", "99", "true", "", "%RETRY%G_T", "TAG",
                     "SQL92", str(2**63), "0 1 60000 3 0 broker-a 0 0", "0 1 2 999 1 b 0 0", "x y",
                     "TRAN_MSG\x01true\x02", "DELAY\x01zz\x02", "DELAY\x0199\x02PGROUP\x01PG\x02"]),
    st.integers(-(2**65), 2**65).map(str),
    st.text(max_size=20),
)  # fmt: skip
BODIES = st.one_of(
    st.binary(max_size=48),
    st.just(b'{"acks":[{"c":"G","t":"T","r":"0","so":0,"q":0,"rq":0,"pt":1,"it":1,"b":"BQ=="}]}'),
    st.just(b'{"acks":[{"c":"G","t":"T","r":"1","so":"x","q":0,"rq":0,"pt":1,"it":1,"b":"BQ=="}]}'),
    st.just(b'{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T","brokerName":"b","queueId":1}]}'),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    code=st.sampled_from(CODES),
    ext=st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=14),
    body=BODIES,
    flag=st.sampled_from([0, 2]),
)
async def test_fuzzed_service_requests_never_hit_a_handler_bug(code, ext, body, flag) -> None:
    backend = InMemoryBackend()
    await backend.create_topic("T", 2)
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
    assert response.opaque == 1
    assert all(isinstance(v, str) for v in response.ext_fields.values())
    if response.code not in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND):
        assert response.remark

"""Header coercion rules, and fuzzing: whatever a peer sends, a session answers without a handler bug."""

from __future__ import annotations

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.errors import HeaderError
from mqproxy.remoting.headers import Fields, PullHeader, SendHeader, parse_header
from mqproxy.remoting.session import HANDLERS, RemotingSession


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("TRUE", True), (" True ", True), ("1", True), ("false", False), ("False", False),
     ("0", False)],
)  # fmt: skip
def test_lenient_booleans(raw, expected) -> None:
    assert Fields({"k": raw}).boolean("k") is expected


@pytest.mark.parametrize("raw", ["yes", "2", "t", "nope"])
def test_bad_booleans(raw) -> None:
    with pytest.raises(HeaderError) as info:
        Fields({"k": raw}).boolean("k")
    assert info.value.key == "k"
    assert info.value.code == ResponseCode.INVALID_PARAMETER


def test_integers() -> None:
    fields = Fields({"i": " -12 ", "big": str(2**40), "blank": "", "neg": "-2147483648"})
    assert fields.integer("i") == -12
    assert fields.integer("big", wide=True) == 2**40
    assert fields.integer("neg") == -(2**31)
    assert fields.integer("blank", 5) == 5  # blank counts as missing
    assert fields.optional_integer("missing") is None
    with pytest.raises(HeaderError, match="out of range"):
        fields.integer("big")
    with pytest.raises(HeaderError, match="'blank' is missing"):
        fields.integer("blank")


def test_send_header_short_and_long_keys_agree() -> None:
    long = {"producerGroup": "PG", "topic": "T", "queueId": "1", "sysFlag": "0", "bornTimestamp": "9",
            "flag": "2", "properties": "A\x01b\x02", "reconsumeTimes": "1", "maxReconsumeTimes": "3",
            "defaultTopicQueueNums": "8"}  # fmt: skip
    short = {"a": "PG", "b": "T", "e": "1", "f": "0", "g": "9", "h": "2", "i": "A\x01b\x02", "j": "1",
             "l": "3", "d": "8"}  # fmt: skip
    assert parse_header(SendHeader, long) == parse_header(SendHeader, short, short_keys=True)


def test_pull_header_defaults() -> None:
    header = parse_header(PullHeader, {"consumerGroup": "G", "topic": "T", "queueId": "0", "queueOffset": "0",
                                "maxMsgNums": "32", "sysFlag": "2", "commitOffset": "0",
                                "suspendTimeoutMillis": "15000"})  # fmt: skip
    assert header.suspend
    assert not header.has_subscription
    assert not header.has_commit_offset
    assert header.expression_type is None  # the registered subscription's type applies
    assert header.max_msg_bytes is None


KEYS = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "topic", "queueId", "queueOffset",
        "consumerGroup", "maxMsgNums", "sysFlag", "commitOffset", "suspendTimeoutMillis", "subscription",
        "expressionType", "clientID", "producerGroup", "timestamp", "boundaryType", "setZeroIfNotFound",
        "properties", "flag", "bornTimestamp", "maxMsgBytes"]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(["T", "G", "0", "1", "-1", "4", "*", "TagA || B", "true", "", "%RETRY%G", "TBW102",
                     "SCHEDULE_TOPIC_XXXX", str(2**63), "A\x01b\x02", "UPPER"]),
    st.integers(-(2**65), 2**65).map(str),
    st.text(max_size=20),
)  # fmt: skip
BODIES = st.one_of(
    st.binary(max_size=64),
    st.just(b'{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[{"topic":"T"}]}]}'),
    st.just(b'{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T","brokerName":"b","queueId":1}]}'),
    st.just(b'{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T","brokerName":"b","queueId":-1}]}'),
    st.just(b'{"clientId":"c","group":"G","subscriptionData":{"expressionType":"SQL92","subString":"a>1"}}'),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    code=st.one_of(st.sampled_from(sorted(HANDLERS)), st.integers(-(2**31), 2**31 - 1)),
    ext=st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=12),
    body=BODIES,
    flag=st.sampled_from([0, 2]),
)
async def test_fuzzed_requests_never_hit_a_handler_bug(code, ext, body, flag) -> None:
    backend = InMemoryBackend()
    await backend.create_topic("T", 4)
    async with open_embedded_broker(backend) as broker:
        session = RemotingSession(broker, ServerContext("10.0.0.8", 8080, long_poll_max_s=0.0))
        request = RemotingCommand(code, opaque=1, flag=flag, ext_fields=ext, body=body)
        with structlog.testing.capture_logs() as logs:
            response = await session.handle(request)
    assert not [entry for entry in logs if entry["event"] == "internal.error"], logs
    if flag == 2:
        assert response is None
    else:
        assert response is not None
        assert response.is_response
        assert response.opaque == 1
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in response.ext_fields.items())
        assert {"MSG_REGION", "TRACE_ON"} <= set(response.ext_fields)
        if response.code not in (ResponseCode.SUCCESS, 19, 20, 21, 22):
            assert response.remark

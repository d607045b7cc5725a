"""PULL_MESSAGE / LITE_PULL_MESSAGE and the offset requests through RemotingSession."""

from __future__ import annotations

import functools

import pytest
import trio

from mqproxy.codecs.message_record import MAGIC_V1, decode_records
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.session import RemotingSession

from .conftest import send as send_v2  # type: ignore[import-not-found]


def cpp_pull(**overrides: object) -> dict[str, object]:
    """C++ 2.1 PULL_MESSAGE ext: ints for queueId/sysFlag/maxMsgNums, sysFlag 6 (suspend+subscription)."""
    ext: dict[str, object] = {
        "AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "c2ln",
        "commitOffset": "0", "consumerGroup": "G", "maxMsgNums": 32, "queueId": 0, "queueOffset": "0",
        "subVersion": "1700000000000", "subscription": "*", "suspendTimeoutMillis": "15000", "sysFlag": 6,
        "topic": "T",
    }  # fmt: skip
    ext.update(overrides)
    return ext


def java_pull(**overrides: str) -> dict[str, str]:
    """Java 4.9.4 push-consumer PULL_MESSAGE: strings only, no subscription (sysFlag 2)."""
    ext = {
        "commitOffset": "0", "consumerGroup": "G", "expressionType": "TAG", "maxMsgBytes": "262144",
        "maxMsgNums": "32", "queueId": "0", "queueOffset": "0", "subVersion": "1700000000000",
        "suspendTimeoutMillis": "15000", "sysFlag": "2", "topic": "T",
    }  # fmt: skip
    ext.update(overrides)
    return ext


def java_heartbeat(subscription: str = "*", client_id: str = "192.0.2.2@4242#1") -> bytes:
    import json

    return json.dumps({
        "clientID": client_id,
        "consumerDataSet": [{
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
            "groupName": "G", "messageModel": "CLUSTERING", "unitMode": False,
            "subscriptionDataSet": [
                {"classFilterMode": False, "codeSet": [], "expressionType": "TAG", "subString": subscription,
                 "subVersion": 1700000000000, "tagsSet": [], "topic": "T"},
                {"classFilterMode": False, "codeSet": [], "expressionType": "TAG", "subString": "*",
                 "subVersion": 1700000000000, "tagsSet": [], "topic": "%RETRY%G"},
            ],
        }],
        "heartbeatFingerprint": 0,
        "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
        "withoutSub": False,
    }).encode()  # fmt: skip


async def create_topic_by_route(wire, session, topic: str = "T") -> None:
    """What a consumer does first: the route lookup auto-creates the topic."""
    response = await session.handle(wire(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS


#: Sends here tag messages ``TagA`` and auto-create four-queue topics.
send = functools.partial(send_v2, tags="TagA", queues=4)


async def test_produce_then_pull_returns_the_exact_record(wire, session) -> None:
    await send(wire, session, b"payload-0", KEYS="k1 k2", UNIQ_KEY="AB" * 16, color="blue")
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(), language="CPP", version=333))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert response.remark == "FOUND"
    assert response.ext_fields == {
        "suggestWhichBrokerId": "0", "nextBeginOffset": "1", "minOffset": "0", "maxOffset": "1",
        "MSG_REGION": "DefaultRegion", "TRACE_ON": "true",
    }  # fmt: skip
    (record,) = decode_records(response.body)
    assert record.magic == MAGIC_V1
    assert (record.topic, record.queue_id, record.queue_offset, record.commitlog_offset) == ("T", 0, 0, 0)
    assert record.body == b"payload-0"
    assert record.properties == {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "AB" * 16, "color": "blue",
                                 # stamped by the broker, as a Java broker does
                                 "CLUSTER": "DefaultCluster", "MSG_REGION": "DefaultRegion",
                                 "TRACE_ON": "true"}  # fmt: skip
    assert record.born_host == ("192.0.2.2", 50000)
    assert record.store_host == ("10.0.0.8", 8080)
    assert record.born_timestamp_ms == 1700000000001
    assert (record.flag, record.sys_flag, record.reconsume_times) == (0, 0, 0)
    assert record.store_size == len(response.body)


async def test_pull_batches_and_next_offsets(wire, session) -> None:
    for i in range(5):
        await send(wire, session, b"m%d" % i)
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(maxMsgNums=2, queueOffset=1)))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(response.body)] == [b"m1", b"m2"]
    assert [r.queue_offset for r in decode_records(response.body)] == [1, 2]
    assert response.ext_fields["nextBeginOffset"] == "3"
    assert response.ext_fields["maxOffset"] == "5"


async def test_tag_filter_from_the_request(wire, session) -> None:
    for tag in ("TagA", "TagB", "TagC", "TagA"):
        await send(wire, session, tag.encode(), tags=tag)
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(subscription="TagA || TagC")))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(response.body)] == [b"TagA", b"TagC", b"TagA"]
    assert response.ext_fields["nextBeginOffset"] == "4"


async def test_no_match_without_suspend_is_retry_immediately(wire, session) -> None:
    await send(wire, session, b"b", tags="TagB")
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(subscription="TagA", sysFlag=4)))
    assert response is not None
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert response.ext_fields["nextBeginOffset"] == "1"


async def test_subscription_from_the_heartbeat(wire, session) -> None:
    for tag in ("TagA", "TagB"):
        await send(wire, session, tag.encode(), tags=tag)
    # no heartbeat yet: no subscription to filter by
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, java_pull()))
    assert response is not None
    assert response.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    beat = await session.handle(wire(RequestCode.HEART_BEAT, None, java_heartbeat("TagB")))
    assert beat is not None
    assert beat.code == ResponseCode.SUCCESS
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, java_pull()))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(response.body)] == [b"TagB"]


async def test_lite_pull(wire, session) -> None:
    await send(wire, session, b"lite")
    ext = java_pull(sysFlag="22", maxMsgNums="10", suspendTimeoutMillis="20000", subscription="*")
    response = await session.handle(wire(RequestCode.LITE_PULL_MESSAGE, ext))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(response.body)] == [b"lite"]


async def test_long_poll_returns_when_a_message_arrives(wire, session, autojump_clock) -> None:
    await create_topic_by_route(wire, session)
    result = {}

    async def poll() -> None:
        started = trio.current_time()
        result["response"] = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull()))
        result["waited"] = trio.current_time() - started

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.sleep(4)
        assert "response" not in result
        await send(wire, session, b"late")
    response = result["response"]
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(response.body)] == [b"late"]
    assert 4 <= result["waited"] < 4.1


async def _held_pull(wire, session, **pull: object):
    """A pull (``cpp_pull(**pull)``) of a new, empty topic: the answer and how long (trio time) the session
    held it."""
    await create_topic_by_route(wire, session)
    started = trio.current_time()
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(**pull)))
    assert response is not None
    return response, trio.current_time() - started


async def test_long_poll_times_out_with_pull_not_found(wire, session, autojump_clock) -> None:
    response, held = await _held_pull(wire, session, suspendTimeoutMillis="15000")
    assert held == pytest.approx(15.0)
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert response.ext_fields["nextBeginOffset"] == "0"
    assert response.ext_fields["minOffset"] == "0"
    assert response.ext_fields["maxOffset"] == "0"
    assert response.ext_fields["suggestWhichBrokerId"] == "0"


async def test_long_poll_is_capped_by_the_server(wire, backend, autojump_clock, broker) -> None:
    session = RemotingSession(broker, ServerContext("10.0.0.8", 8080, long_poll_max_s=2.0))
    response, held = await _held_pull(wire, session, suspendTimeoutMillis="3600000")
    assert held == pytest.approx(2.0)
    assert response.code == ResponseCode.PULL_NOT_FOUND


async def test_without_suspend_bit_there_is_no_hold(wire, session, autojump_clock) -> None:
    response, held = await _held_pull(wire, session, sysFlag=4)
    assert held == 0
    assert response.code == ResponseCode.PULL_NOT_FOUND


async def test_long_poll_skips_messages_that_do_not_match(wire, session, autojump_clock) -> None:
    await create_topic_by_route(wire, session)
    result = {}

    async def poll() -> None:
        result["response"] = await session.handle(
            wire(RequestCode.PULL_MESSAGE, cpp_pull(subscription="TagA"))
        )
        result["at"] = trio.current_time()

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.sleep(3)
        await send(wire, session, b"b", tags="TagB")
        await trio.sleep(3)
        assert "response" not in result  # a non-matching message does not end the hold
        await send(wire, session, b"a", tags="TagA")
    response = result["response"]
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(response.body)] == [b"a"]
    assert response.ext_fields["nextBeginOffset"] == "2"
    assert result["at"] - started == pytest.approx(6.0, abs=0.01)


async def test_long_poll_timeout_after_non_matching_advances_the_offset(
    wire, session, autojump_clock
) -> None:
    await send(wire, session, b"b", tags="TagB")
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(subscription="TagA")))
    assert response is not None
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert response.ext_fields["nextBeginOffset"] == "1"


@pytest.mark.parametrize(
    ("offset", "next_offset"),
    [("5", "2"), ("-3", "0"), (str(2**62), "2"), (str(2**63 - 1), "2")],
)
async def test_illegal_offsets_move(offset, next_offset, wire, session) -> None:
    await send(wire, session, b"one")
    await send(wire, session, b"two")
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(queueOffset=offset)))
    assert response is not None
    assert response.code == ResponseCode.PULL_OFFSET_MOVED
    assert response.ext_fields["nextBeginOffset"] == next_offset
    assert response.ext_fields["maxOffset"] == "2"


async def test_nonzero_offset_on_empty_queue_moves_to_zero(wire, session) -> None:
    await send(wire, session, b"x", queue=1)  # creates T; queue 0 stays empty
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(queueOffset="7")))
    assert response is not None
    assert response.code == ResponseCode.PULL_OFFSET_MOVED
    assert response.ext_fields["nextBeginOffset"] == "0"


async def test_pull_offset_beyond_int64_is_a_header_error(wire, session) -> None:
    await send(wire, session, b"x")
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(queueOffset=str(2**63))))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "queueOffset" in (response.remark or "")


@pytest.mark.parametrize("queue_id", [4, 99, -1])
async def test_pull_for_a_queue_that_does_not_exist(queue_id, wire, session) -> None:
    await send(wire, session, b"x")
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(queueId=queue_id)))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert f"queueId[{queue_id}]" in (response.remark or "")


async def test_pull_for_an_unknown_topic(wire, session, backend) -> None:
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(topic="Nope")))
    assert response is not None
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert await backend.get_topic("Nope") is None


async def test_sql92_in_the_request_filters_by_properties(wire, session) -> None:
    for i in range(6):
        await send(wire, session, f"m{i}".encode(), a=str(i), b="even" if i % 2 == 0 else "odd")
    ext = cpp_pull(expressionType="SQL92", subscription="a >= 2 AND b = 'even'", suspendTimeoutMillis="0")
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, ext))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(response.body)] == [b"m2", b"m4"]
    assert response.ext_fields["nextBeginOffset"] == "6"


async def test_sql92_from_the_heartbeat_when_the_pull_has_no_subscription(wire, session) -> None:
    """A Java push consumer pulls without ``subscription``: the heartbeat's SQL92 expression applies."""
    heartbeat = java_heartbeat().replace(
        b'"expressionType": "TAG", "subString": "*", "subVersion": 1700000000000, '
        b'"tagsSet": [], "topic": "T"',
        b'"expressionType": "SQL92", "subString": "color = \'blue\'", '
        b'"subVersion": 1700000000000, "tagsSet": [], "topic": "T"',
    )
    assert b"SQL92" in heartbeat
    assert (await session.handle(wire(RequestCode.HEART_BEAT, None, heartbeat))).code == ResponseCode.SUCCESS
    await send(wire, session, b"red", color="red")
    await send(wire, session, b"blue", color="blue")
    response = await session.handle(
        wire(RequestCode.PULL_MESSAGE, java_pull(expressionType="SQL92", suspendTimeoutMillis="0"))
    )
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(response.body)] == [b"blue"]


async def test_sql92_with_nothing_matching_moves_the_cursor_on(wire, session) -> None:
    await send(wire, session, b"x", a="1")
    ext = cpp_pull(expressionType="SQL92", subscription="a > 5", sysFlag=4)  # no long polling
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, ext))
    assert response is not None
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert response.ext_fields["nextBeginOffset"] == "1"


@pytest.mark.parametrize(("kind", "expression"), [("SQL92", "a >"), ("SQL92", "a = NULL"), ("GROOVY", "x")])
async def test_bad_filters_are_refused(kind, expression, wire, session) -> None:
    await send(wire, session, b"x")
    ext = cpp_pull(expressionType=kind, subscription=expression)
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, ext))
    assert response is not None
    assert response.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


PULL_REQUIRED = ["consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag", "commitOffset",
                 "suspendTimeoutMillis"]  # fmt: skip


@pytest.mark.parametrize("key", PULL_REQUIRED)
async def test_pull_missing_required_key(key, wire, session) -> None:
    await send(wire, session, b"x")
    ext = cpp_pull()
    del ext[key]
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, ext))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert response.remark == f"header field {key!r} is missing"


async def test_pull_commit_bit_stores_the_offset(wire, session, backend) -> None:
    await send(wire, session, b"x")
    response = await session.handle(wire(RequestCode.PULL_MESSAGE, cpp_pull(sysFlag=5, commitOffset="1",
                                                                            queueOffset="1")))  # fmt: skip
    assert response is not None
    assert await backend.query_consumer_offset("G", "T", 0) == 1


# --- offsets -------------------------------------------------------------------------------------------


def offset_ext(queue: int = 0, **extra: object) -> dict[str, object]:
    ext: dict[str, object] = {"consumerGroup": "G", "topic": "T", "queueId": queue}
    ext.update(extra)
    return ext


async def test_offsets_committed_by_one_client_are_seen_by_another(
    wire, session, backend, ctx, broker
) -> None:
    await send(wire, session, b"x")
    # Java: oneway UPDATE_CONSUMER_OFFSET, all strings
    update = wire(RequestCode.UPDATE_CONSUMER_OFFSET, {"commitOffset": "1", "consumerGroup": "G",
                                                       "queueId": "0", "topic": "T"}, flag=2)  # fmt: skip
    assert await session.handle(update) is None
    other = RemotingSession(broker, ctx, peer=("192.0.2.3", 1))
    response = await other.handle(wire(RequestCode.QUERY_CONSUMER_OFFSET, offset_ext(), language="CPP"))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["offset"] == "1"


async def test_alions_negative_commit_is_ignored(wire, session, backend) -> None:
    await send(wire, session, b"x")
    update = wire(RequestCode.UPDATE_CONSUMER_OFFSET, offset_ext(commitOffset=-1), version=121)
    response = await session.handle(update)
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert await backend.query_consumer_offset("G", "T", 0) is None


async def test_query_offset_of_a_new_group(wire, session, backend, monkeypatch) -> None:
    await send(wire, session, b"x", queue=0)
    # offset 0 still readable (fresh or with history): 0, as a real broker answers (spec §3.4)
    for queue in (0, 1):
        fresh = await session.handle(wire(RequestCode.QUERY_CONSUMER_OFFSET, offset_ext(queue=queue)))
        assert fresh is not None
        assert fresh.code == ResponseCode.SUCCESS
        assert fresh.ext_fields["offset"] == "0"
    strict = offset_ext(queue=1, setZeroIfNotFound=False)
    refused = await session.handle(wire(RequestCode.QUERY_CONSUMER_OFFSET, strict))
    assert refused is not None
    assert refused.code == ResponseCode.QUERY_NOT_FOUND

    async def trimmed(topic: str, queue_id: int) -> int:  # the head of the queue was deleted
        return 1

    monkeypatch.setattr(backend, "min_offset", trimmed)
    used = await session.handle(wire(RequestCode.QUERY_CONSUMER_OFFSET, offset_ext(queue=0)))
    assert used is not None
    assert used.code == ResponseCode.QUERY_NOT_FOUND
    assert used.remark


async def test_update_offset_with_bad_header(wire, session) -> None:
    response = await session.handle(wire(RequestCode.UPDATE_CONSUMER_OFFSET, offset_ext(commitOffset="x")))
    assert response is not None
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "commitOffset" in (response.remark or "")


async def test_queue_offsets_and_store_times(wire, session, backend, autojump_clock) -> None:
    await send(wire, session, b"x")
    first_time = (await backend.pull("T", 0, 0, 1)).messages[0].store_timestamp_ms
    await send(wire, session, b"y")
    queue = {"topic": "T", "queueId": 0}
    max_r = await session.handle(wire(RequestCode.GET_MAX_OFFSET, queue))
    min_r = await session.handle(wire(RequestCode.GET_MIN_OFFSET, queue))
    early = await session.handle(wire(RequestCode.GET_EARLIEST_MSG_STORETIME, queue))
    assert max_r is not None
    assert max_r.ext_fields["offset"] == "2"
    assert min_r is not None
    assert min_r.ext_fields["offset"] == "0"
    assert early is not None
    assert early.ext_fields["timestamp"] == str(first_time)
    search = await session.handle(wire(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**queue, "timestamp": 0}))
    assert search is not None
    assert search.ext_fields["offset"] == "0"
    future = {**queue, "timestamp": str(2**62)}
    search = await session.handle(wire(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, future))
    assert search is not None
    assert search.ext_fields["offset"] == "2"
    upper = {**queue, "timestamp": str(2**62), "boundaryType": "upper"}
    search = await session.handle(wire(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, upper))
    assert search is not None
    assert search.ext_fields["offset"] == "1"
    bad = {**queue, "timestamp": "0", "boundaryType": "MIDDLE"}
    search = await session.handle(wire(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, bad))
    assert search is not None
    assert search.code == ResponseCode.INVALID_PARAMETER


async def test_queue_offset_requests_on_unknown_queue(wire, session) -> None:
    await send(wire, session, b"x")
    missing = await session.handle(wire(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 9}))
    assert missing is not None
    assert missing.code == ResponseCode.INVALID_PARAMETER
    unknown = await session.handle(wire(RequestCode.GET_MIN_OFFSET, {"topic": "Nope", "queueId": 0}))
    assert unknown is not None
    assert unknown.code == ResponseCode.TOPIC_NOT_EXIST
    no_topic = await session.handle(wire(RequestCode.GET_MIN_OFFSET, {"queueId": 0}))
    assert no_topic is not None
    assert no_topic.code == ResponseCode.INVALID_PARAMETER

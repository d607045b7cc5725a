"""RecallMessage through the driver: deliver-at messages get a recall handle; recalling before the
delivery time cancels the message (durably, through the scheduler), after it answers MESSAGE_NOT_FOUND."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from mqproxy.backends.embedded.schedule import recall_handle
from mqproxy.codecs import rocketmq_v2 as pb

from ..conftest import wait_until  # type: ignore[import-not-found]

GrpcEnv = Any  # the grpc_env fixture (tests/grpc_service/conftest.py)
Code = pb.Code


def message(topic: str, body: bytes, msg_id: str, deliver_at_ms: int | None = None) -> Any:
    sp = pb.SystemProperties(
        message_id=msg_id, tag="TagA", message_type=pb.MessageType.NORMAL, body_encoding=pb.Encoding.IDENTITY
    )
    if deliver_at_ms is not None:
        sp.message_type = pb.MessageType.DELAY
        sp.delivery_timestamp.FromMilliseconds(deliver_at_ms)
    return pb.RmqMessage(topic=pb.Resource(name=topic), system_properties=sp, body=body)


async def send_one(client: Any, msg: Any) -> Any:
    response = await client.unary("SendMessage", pb.SendMessageRequest(messages=[msg]))
    assert response.status.code == Code.OK
    (entry,) = response.entries
    return entry


async def recall(client: Any, topic: str, handle: str) -> Any:
    return await client.unary(
        "RecallMessage", pb.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle)
    )


async def receive_all(client: Any, topic: str, group: str, poll_s: int = 0) -> list[Any]:
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=16,
        invisible_duration=pb.Duration(seconds=30),
        long_polling_timeout=pb.Duration(seconds=poll_s),
    )
    sid = await client.open("ReceiveMessage", [request.SerializeToString()], grpc_timeout="5S")
    result = await client.wait(sid, 10)
    assert result.grpc_status == 0
    responses = [pb.ReceiveMessageResponse.FromString(m) for m in result.messages()]
    return [r.message for r in responses if r.WhichOneof("content") == "message"]


async def test_recalled_message_is_never_delivered_the_other_is(
    grpc_env: GrpcEnv, autojump_clock: trio.testing.MockClock
) -> None:
    client = await grpc_env.connect()
    due = grpc_env.now_ms() + 1200
    kept = await send_one(client, message("RecallT", b"kept", "R-KEEP", due))
    gone = await send_one(client, message("RecallT", b"gone", "R-GONE", due))
    assert kept.recall_handle
    assert gone.recall_handle
    assert kept.recall_handle != gone.recall_handle
    plain = await send_one(client, message("RecallT", b"now", "R-NOW"))
    assert plain.recall_handle == ""  # only parked messages can be recalled

    answer = await recall(client, "RecallT", gone.recall_handle)
    assert (answer.status.code, answer.message_id) == (Code.OK, "R-GONE")
    again = await recall(client, "RecallT", gone.recall_handle)  # idempotent
    assert (again.status.code, again.message_id) == (Code.OK, "R-GONE")

    got: list[Any] = []

    async def two_delivered() -> bool:  # each look is a long poll: it returns once something is due
        got.extend(await receive_all(client, "RecallT", "RecallG", poll_s=3))
        return len(got) >= 2

    await wait_until(two_delivered)
    await trio.sleep(0.5)  # (the autojump clock) well past the recalled one's delivery time as well
    got += await receive_all(client, "RecallT", "RecallG")
    assert sorted(m.body for m in got) == [b"kept", b"now"]
    assert grpc_env.services.scheduler.dropped_recalled == 1

    late = await recall(client, "RecallT", kept.recall_handle)
    assert late.status.code == Code.MESSAGE_NOT_FOUND


async def test_recall_rejects_bad_handles(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    entry = await send_one(client, message("RecallBad", b"x", "RB-1", grpc_env.now_ms() + 60_000))
    garbled = recall_handle("RecallBad", "RB-1", 1, broker_name="broker-a")[:-3] + "@@@"
    for handle in ("", "h", "!!!not base64!!!", garbled):
        assert (await recall(client, "RecallBad", handle)).status.code == Code.BAD_REQUEST, handle
    other_topic = await recall(client, "OtherTopic", entry.recall_handle)
    assert other_topic.status.code == Code.BAD_REQUEST
    illegal = await recall(client, "bad topic!", entry.recall_handle)
    assert illegal.status.code == Code.ILLEGAL_TOPIC
    assert (await recall(client, "RecallBad", entry.recall_handle)).status.code == Code.OK

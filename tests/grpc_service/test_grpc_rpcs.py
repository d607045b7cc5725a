"""MessagingService RPC semantics through the driver: routes, heartbeat, send, receive/ack, offsets,
transactions, delay, and the application error codes (v2 Status in the body, grpc-status 0)."""

from __future__ import annotations

import zlib
from typing import Any

import trio
import trio.testing

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.grpc_service.convert import PROPERTY_SHARDING_KEY
from mqproxy.model.types import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, Message

GrpcEnv = Any  # the grpc_env fixture (tests/grpc_service/conftest.py)
Code = pb.Code


def message(
    topic: str,
    body: bytes = b"hello",
    *,
    msg_id: str = "ID1",
    tag: str | None = "TagA",
    keys: tuple[str, ...] = ("k1",),
    props: dict[str, str] | None = None,
    group: str | None = None,
    deliver_at_ms: int | None = None,
    mtype: pb.MessageType = pb.MessageType.NORMAL,
) -> Any:
    sp = pb.SystemProperties(
        message_id=msg_id, keys=list(keys), message_type=mtype, body_encoding=pb.Encoding.IDENTITY
    )
    if tag is not None:
        sp.tag = tag
    if group is not None:
        sp.message_group = group
    if deliver_at_ms is not None:
        sp.delivery_timestamp.FromMilliseconds(deliver_at_ms)
    return pb.RmqMessage(
        topic=pb.Resource(name=topic), user_properties=props or {}, system_properties=sp, body=body
    )


async def send(client: Any, *messages: Any) -> Any:
    return await client.unary("SendMessage", pb.SendMessageRequest(messages=list(messages)))


async def receive(
    client: Any,
    topic: str,
    group: str,
    *,
    batch: int = 16,
    poll_s: int = 0,
    invisible_s: int = 30,
    grpc_timeout: str = "5S",
) -> tuple[Any, list[Any]]:
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=batch,
        invisible_duration=pb.Duration(seconds=invisible_s),
        long_polling_timeout=pb.Duration(seconds=poll_s),
    )
    sid = await client.open("ReceiveMessage", [request.SerializeToString()], grpc_timeout=grpc_timeout)
    result = await client.wait(sid, 10)
    assert result.grpc_status == 0
    responses = [pb.ReceiveMessageResponse.FromString(m) for m in result.messages()]
    assert responses[0].WhichOneof("content") == "status"
    if responses[0].status.code not in (Code.OK, Code.MESSAGE_NOT_FOUND):
        assert len(responses) == 1
        return responses[0].status, []
    assert responses[-1].WhichOneof("content") == "delivery_timestamp"
    return responses[0].status, [r.message for r in responses[1:-1]]


async def test_query_route_shapes(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    response = await client.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="RouteT")))
    assert response.status.code == Code.OK
    assert [q.id for q in response.message_queues] == [0, 1, 2, 3]
    for queue in response.message_queues:
        assert queue.permission == pb.Permission.READ_WRITE
        assert queue.broker.id == 0
        assert queue.broker.endpoints.scheme == pb.AddressScheme.IPv4
        assert (queue.broker.endpoints.addresses[0].host, queue.broker.endpoints.addresses[0].port) == (
            "127.0.0.1",
            9876,
        )
        assert set(queue.accept_message_types) == {
            pb.MessageType.NORMAL,
            pb.MessageType.FIFO,
            pb.MessageType.DELAY,
            pb.MessageType.TRANSACTION,
        }
    bad = await client.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="bad topic!")))
    assert bad.status.code == Code.ILLEGAL_TOPIC
    assert not bad.message_queues


async def test_query_route_unknown_topic_without_auto_create(grpc_env: GrpcEnv) -> None:
    grpc_env.service.resources.auto_create_topics = False
    client = await grpc_env.connect()
    response = await client.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="Missing")))
    assert response.status.code == Code.TOPIC_NOT_FOUND
    assignment = await client.unary(
        "QueryAssignment",
        pb.QueryAssignmentRequest(topic=pb.Resource(name="Missing"), group=pb.Resource(name="G")),
    )
    assert assignment.status.code == Code.TOPIC_NOT_FOUND


async def test_heartbeat_rules(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    unknown = await client.unary("Heartbeat", pb.HeartbeatRequest(group=pb.Resource(name="G")))
    assert unknown.status.code == Code.UNRECOGNIZED_CLIENT_TYPE
    ok = await client.unary(
        "Heartbeat",
        pb.HeartbeatRequest(group=pb.Resource(name="G"), client_type=pb.ClientType.SIMPLE_CONSUMER),
    )
    assert ok.status.code == Code.OK
    no_id = await client.unary(
        "Heartbeat", pb.HeartbeatRequest(client_type=pb.ClientType.PRODUCER), x_mq_client_id=None
    )
    assert no_id.status.code == Code.CLIENT_ID_REQUIRED
    bye = await client.unary("NotifyClientTermination", pb.NotifyClientTerminationRequest())
    assert bye.status.code == Code.OK
    assert grpc_env.service.clients.get("test@1@0") is None


async def test_send_stores_remoting_conventions(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    response = await send(
        client, message("SendT", b"payload", msg_id="MSG-1", keys=("a", "b"), props={"p1": "v1"})
    )
    assert response.status.code == Code.OK
    (entry,) = response.entries
    assert (entry.status.code, entry.message_id, entry.offset) == (Code.OK, "MSG-1", 0)
    found = []
    for qid in range(4):
        found += (await grpc_env.backend.pull("SendT", qid, 0, 10)).messages
    (stored,) = found
    assert stored.body == b"payload"
    assert stored.properties[PROPERTY_TAGS] == "TagA"
    assert stored.properties[PROPERTY_KEYS] == "a b"
    assert stored.properties[PROPERTY_UNIQ_KEY] == "MSG-1"
    assert stored.properties["p1"] == "v1"
    assert stored.born_host[0] == "127.0.0.1"


async def test_send_fifo_hashes_the_group_to_one_queue(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    for i in range(6):
        response = await send(client, message("FifoT", f"m{i}".encode(), msg_id=f"F{i}", group="order-42"))
        assert response.status.code == Code.OK
    queue = zlib.crc32(b"order-42") % 4
    result = await grpc_env.backend.pull("FifoT", queue, 0, 10)
    assert [m.body for m in result.messages] == [f"m{i}".encode() for i in range(6)]
    assert {m.properties[PROPERTY_SHARDING_KEY] for m in result.messages} == {"order-42"}


async def test_send_errors_are_body_statuses(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    too_big = await send(client, message("ErrT", b"x" * (4 * 1024 * 1024 + 1)))
    assert too_big.status.code == Code.MESSAGE_BODY_TOO_LARGE
    assert too_big.entries[0].status.code == Code.MESSAGE_BODY_TOO_LARGE
    assert (await send(client, message("ErrT", b""))).status.code == Code.MESSAGE_BODY_EMPTY
    assert (await send(client, message("ErrT", msg_id=""))).status.code == Code.ILLEGAL_MESSAGE_ID
    assert (
        await send(client, message("ErrT", props={"UNIQ_KEY": "x"}))
    ).status.code == Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    assert (await send(client, message("ErrT", tag="a|b"))).status.code == Code.ILLEGAL_MESSAGE_TAG
    assert (await send(client, message("ErrT", keys=("has space",)))).status.code == Code.ILLEGAL_MESSAGE_KEY
    assert (await send(client, message("SCHEDULE_TOPIC_XXXX"))).status.code == Code.FORBIDDEN
    assert (await send(client)).status.code == Code.BAD_REQUEST
    mixed = await send(client, message("ErrT", msg_id="OK1"), message("ErrT", b""))
    assert mixed.status.code == Code.MULTIPLE_RESULTS
    assert [e.status.code for e in mixed.entries] == [Code.OK, Code.MESSAGE_BODY_EMPTY]
    grpc_env.service.resources.auto_create_topics = False
    assert (await send(client, message("NoSuchTopic"))).status.code == Code.TOPIC_NOT_FOUND


async def test_receive_ack_and_redelivery(grpc_env: GrpcEnv, autojump_clock: trio.testing.MockClock) -> None:
    client = await grpc_env.connect()
    for i in range(3):
        await send(client, message("RecvT", f"r{i}".encode(), msg_id=f"R{i}", props={"k": str(i)}))
    status, messages = await receive(client, "RecvT", "G1")
    assert status.code == Code.OK
    assert sorted(m.body for m in messages) == [b"r0", b"r1", b"r2"]
    first = messages[0]
    sp = first.system_properties
    assert sp.receipt_handle
    assert sp.delivery_attempt == 1
    assert sp.body_encoding == pb.Encoding.IDENTITY
    assert sp.body_digest.type == pb.DigestType.MD5
    assert sp.body_digest.checksum.isupper()
    assert sp.tag == "TagA"
    assert list(sp.keys) == ["k1"]
    assert dict(first.user_properties) == {"k": sp.message_id[1:]}
    ack = await client.unary(
        "AckMessage",
        pb.AckMessageRequest(
            group=pb.Resource(name="G1"),
            topic=pb.Resource(name="RecvT"),
            entries=[
                pb.AckMessageEntry(
                    message_id=m.system_properties.message_id,
                    receipt_handle=m.system_properties.receipt_handle,
                )
                for m in messages[:2]
            ],
        ),
    )
    assert ack.status.code == Code.OK
    assert [e.status.code for e in ack.entries] == [Code.OK, Code.OK]
    # the un-acked one comes back after its (1 s) invisible time; acked ones never
    change = await client.unary(
        "ChangeInvisibleDuration",
        pb.ChangeInvisibleDurationRequest(
            group=pb.Resource(name="G1"),
            topic=pb.Resource(name="RecvT"),
            receipt_handle=messages[2].system_properties.receipt_handle,
            invisible_duration=pb.Duration(seconds=1),
            message_id=messages[2].system_properties.message_id,
        ),
    )
    assert change.status.code == Code.OK
    assert change.receipt_handle
    status, empty = await receive(client, "RecvT", "G1")
    assert status.code == Code.MESSAGE_NOT_FOUND
    assert empty == []
    with trio.fail_after(8):
        while True:
            status, again = await receive(client, "RecvT", "G1", poll_s=1)
            if again:
                break
    assert [m.body for m in again] == [messages[2].body]
    assert again[0].system_properties.delivery_attempt == 2
    bad = await client.unary(
        "AckMessage",
        pb.AckMessageRequest(
            group=pb.Resource(name="G1"),
            topic=pb.Resource(name="RecvT"),
            entries=[pb.AckMessageEntry(message_id="x", receipt_handle="garbage")],
        ),
    )
    assert bad.status.code == Code.INVALID_RECEIPT_HANDLE


async def test_receive_long_poll_wakes_on_send(
    grpc_env: GrpcEnv, autojump_clock: trio.testing.MockClock
) -> None:
    client = await grpc_env.connect()
    await client.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="PollT")))
    sender = await grpc_env.connect("sender@1@0")
    got: list[Any] = []

    async def poll() -> None:
        got.extend((await receive(client, "PollT", "G1", poll_s=10, grpc_timeout="15S"))[1])

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.testing.wait_all_tasks_blocked()  # the receive is in its long poll
        await send(sender, message("PollT", b"late", msg_id="L1"))
    assert [m.body for m in got] == [b"late"]
    assert trio.current_time() - started < 5


async def test_receive_respects_the_deadline(
    grpc_env: GrpcEnv, autojump_clock: trio.testing.MockClock
) -> None:
    client = await grpc_env.connect()
    await client.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="Quiet")))
    started = trio.current_time()
    status, messages = await receive(client, "Quiet", "G1", poll_s=20, grpc_timeout="700m")
    assert status.code == Code.MESSAGE_NOT_FOUND
    assert messages == []
    assert trio.current_time() - started < 0.7


async def test_forward_to_dead_letter_queue(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    await send(client, message("DlqT", b"poison", msg_id="P1"))
    _, (msg,) = await receive(client, "DlqT", "G2")
    response = await client.unary(
        "ForwardMessageToDeadLetterQueue",
        pb.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name="G2"),
            topic=pb.Resource(name="DlqT"),
            receipt_handle=msg.system_properties.receipt_handle,
            message_id="P1",
            delivery_attempt=1,
            max_delivery_attempts=16,
        ),
    )
    assert response.status.code == Code.OK
    dead = await grpc_env.backend.pull("%DLQ%G2", 0, 0, 10)
    assert [m.body for m in dead.messages] == [b"poison"]


async def test_pull_and_offsets(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    await grpc_env.backend.create_topic("PullT", 1)
    for i in range(3):
        await send(client, message("PullT", f"p{i}".encode(), msg_id=f"P{i}"))
    queue = pb.MessageQueue(topic=pb.Resource(name="PullT"), id=0)
    request = pb.PullMessageRequest(
        group=pb.Resource(name="PG"),
        message_queue=queue,
        offset=1,
        batch_size=10,
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        long_polling_timeout=pb.Duration(seconds=0),
    )
    sid = await client.open("PullMessage", [request.SerializeToString()], grpc_timeout="5S")
    responses = [pb.PullMessageResponse.FromString(m) for m in (await client.wait(sid)).messages()]
    assert responses[0].status.code == Code.OK
    assert [r.message.body for r in responses[1:-1]] == [b"p1", b"p2"]
    assert responses[-1].next_offset == 3
    begin = await client.unary(
        "QueryOffset",
        pb.QueryOffsetRequest(message_queue=queue, query_offset_policy=pb.QueryOffsetPolicy.BEGINNING),
    )
    end = await client.unary(
        "QueryOffset",
        pb.QueryOffsetRequest(message_queue=queue, query_offset_policy=pb.QueryOffsetPolicy.END),
    )
    assert (begin.offset, end.offset) == (0, 3)
    missing = await client.unary(
        "GetOffset", pb.GetOffsetRequest(group=pb.Resource(name="PG"), message_queue=queue)
    )
    assert missing.status.code == Code.OFFSET_NOT_FOUND
    update = await client.unary(
        "UpdateOffset", pb.UpdateOffsetRequest(group=pb.Resource(name="PG"), message_queue=queue, offset=2)
    )
    assert update.status.code == Code.OK
    got = await client.unary(
        "GetOffset", pb.GetOffsetRequest(group=pb.Resource(name="PG"), message_queue=queue)
    )
    assert (got.status.code, got.offset) == (Code.OK, 2)
    bad_queue = pb.MessageQueue(topic=pb.Resource(name="PullT"), id=7)
    assert (
        await client.unary(
            "GetOffset", pb.GetOffsetRequest(group=pb.Resource(name="PG"), message_queue=bad_queue)
        )
    ).status.code == Code.BAD_REQUEST


async def test_delay_message_is_held_until_due(
    grpc_env: GrpcEnv, autojump_clock: trio.testing.MockClock
) -> None:
    client = await grpc_env.connect()
    due = grpc_env.now_ms() + 1500
    response = await send(
        client, message("DelayT", b"later", msg_id="D1", deliver_at_ms=due, mtype=pb.MessageType.DELAY)
    )
    assert response.status.code == Code.OK
    status, _ = await receive(client, "DelayT", "GD")
    assert status.code == Code.MESSAGE_NOT_FOUND
    with trio.fail_after(8):
        while True:
            _, got = await receive(client, "DelayT", "GD", poll_s=1)
            if got:
                break
    assert got[0].body == b"later"
    assert got[0].system_properties.message_type == pb.MessageType.DELAY
    assert grpc_env.now_ms() >= due


async def test_transaction_commit_and_rollback(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    for msg_id in ("TX1", "TX2"):
        response = await send(
            client, message("TxT", msg_id.encode(), msg_id=msg_id, mtype=pb.MessageType.TRANSACTION)
        )
        assert response.status.code == Code.OK
    status, _ = await receive(client, "TxT", "GT")
    assert status.code == Code.MESSAGE_NOT_FOUND  # half messages are invisible
    for msg_id, resolution in (
        ("TX1", pb.TransactionResolution.COMMIT),
        ("TX2", pb.TransactionResolution.ROLLBACK),
    ):
        end = await client.unary(
            "EndTransaction",
            pb.EndTransactionRequest(
                topic=pb.Resource(name="TxT"),
                message_id=msg_id,
                transaction_id=msg_id,
                resolution=resolution,
                source=pb.TransactionSource.SOURCE_CLIENT,
            ),
        )
        assert end.status.code == Code.OK
    _, got = await receive(client, "TxT", "GT", poll_s=1)
    assert [m.body for m in got] == [b"TX1"]
    again = await client.unary(
        "EndTransaction",
        pb.EndTransactionRequest(
            topic=pb.Resource(name="TxT"),
            message_id="TX1",
            transaction_id="TX1",
            resolution=pb.TransactionResolution.COMMIT,
        ),
    )
    assert again.status.code == Code.INVALID_TRANSACTION_ID


async def test_transaction_check_back_reaches_the_producer(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect("producer@1@0")
    settings = pb.Settings(
        client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="TxC")])
    )
    sid = await client.open(
        "Telemetry", [pb.TelemetryCommand(settings=settings).SerializeToString()], end=False
    )
    while not client.results[sid].messages():
        await client.changed.wait()
    await send(client, message("TxC", b"half", msg_id="TXC", mtype=pb.MessageType.TRANSACTION))
    half = (await grpc_env.backend.pull("RMQ_SYS_TRANS_HALF_TOPIC", 0, 0, 10)).messages[-1]
    from mqproxy.facade.types import TransactionCheck

    check = TransactionCheck("%GRPC%TxC", "TXC", 1, half, _retopic(half, "TxC"))
    assert await grpc_env.service.check_back(check) is True
    while len(client.results[sid].messages()) < 2:
        await client.changed.wait()
    command = pb.TelemetryCommand.FromString(client.results[sid].messages()[1])
    recover = command.recover_orphaned_transaction_command
    assert recover.transaction_id == "TXC"
    assert recover.message.body == b"half"
    assert dict(recover.message.user_properties) == {}  # the service's own TRAN_HALF_TIME_MS stays inside
    assert (
        await grpc_env.service.check_back(
            TransactionCheck("%GRPC%Other", "X", 1, half, _retopic(half, "Other"))
        )
        is False
    )


def _retopic(stored: Any, topic: str) -> Any:
    import dataclasses

    return dataclasses.replace(stored, topic=topic)


async def test_unsupported_rpcs_answer_a_status(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    lite = await client.unary("SyncLiteSubscription", pb.SyncLiteSubscriptionRequest())
    assert lite.status.code == Code.NOT_IMPLEMENTED


async def test_remoting_message_is_delivered_over_grpc(grpc_env: GrpcEnv) -> None:
    """A message stored the way the remoting layer stores it (zlib-compressed body, UNIQ_KEY, TAGS, KEYS)
    reaches a gRPC consumer intact."""
    body = b"compressed " * 100
    await grpc_env.backend.create_topic("FromRemoting", 1)
    await grpc_env.backend.send(
        Message(
            topic="FromRemoting",
            body=zlib.compress(body),
            sys_flag=0x1,
            properties={
                PROPERTY_TAGS: "TagR",
                PROPERTY_KEYS: "k1 k2",
                PROPERTY_UNIQ_KEY: "UNIQ-R",
                "u": "1",
                "WAIT": "true",
            },
        )
    )
    client = await grpc_env.connect()
    _, (msg,) = await receive(client, "FromRemoting", "GR")
    sp = msg.system_properties
    assert msg.body == body
    assert (sp.tag, list(sp.keys), sp.message_id) == ("TagR", ["k1", "k2"], "UNIQ-R")
    assert dict(msg.user_properties) == {"u": "1"}

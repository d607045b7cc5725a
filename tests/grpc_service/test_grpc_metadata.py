"""What administrator-set metadata changes for gRPC clients (Apache proxy behaviour): typed topics in
routes and sends, FIFO groups in settings, assignments and receives; and the client's own born host."""

from __future__ import annotations

from typing import Any

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.facade.types import GroupConfig, TopicMessageType

from .test_grpc_rpcs import message, receive, send

GrpcEnv = Any  # the grpc_env fixture (tests/grpc_service/conftest.py)
Code = pb.Code
ALL_TYPES = [pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY, pb.MessageType.TRANSACTION]


async def _accepts(client: Any, topic: str) -> list[list[pb.MessageType]]:
    route = await client.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name=topic)))
    assert route.status.code == Code.OK
    return [list(q.accept_message_types) for q in route.message_queues]


async def test_typed_topics_accept_their_type_only(grpc_env: GrpcEnv) -> None:
    metadata = grpc_env.broker
    await metadata.set_topic_type("FifoT", TopicMessageType.FIFO)
    await metadata.set_topic_type("MixedT", TopicMessageType.MIXED)
    client = await grpc_env.connect()
    assert await _accepts(client, "FifoT") == [[pb.MessageType.FIFO]] * 4
    assert await _accepts(client, "MixedT") == [ALL_TYPES] * 4
    assert await _accepts(client, "UntypedT") == [ALL_TYPES] * 4
    refused = await send(client, message("FifoT", msg_id="N1"))
    assert refused.status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert refused.entries[0].status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    delayed_fifo = await send(client, message("FifoT", msg_id="D1", group="g", deliver_at_ms=1))
    # a delivery time makes it a DELAY message
    assert delayed_fifo.status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    accepted = await send(client, message("FifoT", msg_id="F1", group="g", mtype=pb.MessageType.FIFO))
    assert accepted.status.code == Code.OK
    mixed = await send(client, message("MixedT", msg_id="M1"), message("MixedT", msg_id="M2", group="g"))
    assert [e.status.code for e in mixed.entries] == [Code.OK, Code.OK]


async def _settings_reply(client: Any, settings: Any) -> Any:
    command = pb.TelemetryCommand(settings=settings).SerializeToString()
    sid = await client.open("Telemetry", [command], end=False)
    while not client.results[sid].messages():
        await client.changed.wait()
    return pb.TelemetryCommand.FromString(client.results[sid].messages()[0]).settings


def _consumer_settings(group: str) -> Any:
    return pb.Settings(
        client_type=pb.ClientType.SIMPLE_CONSUMER,
        subscription=pb.Subscription(
            group=pb.Resource(name=group), subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name="T"))]
        ),
    )


async def test_fifo_group_settings_and_assignments(grpc_env: GrpcEnv) -> None:
    await grpc_env.broker.put_group_config(GroupConfig("FifoG", consume_orderly=True, retry_max_times=2))
    client = await grpc_env.connect("fifo@1@0")
    reply = await _settings_reply(client, _consumer_settings("FifoG"))
    assert reply.subscription.fifo is True
    assert reply.backoff_policy.max_attempts == 3
    plain = await _settings_reply(await grpc_env.connect("plain@1@0"), _consumer_settings("PlainG"))
    assert plain.subscription.fifo is False
    assert plain.backoff_policy.max_attempts == 17

    async def assigned(group: str) -> list[tuple[int, list[Any]]]:
        response = await client.unary(
            "QueryAssignment",
            pb.QueryAssignmentRequest(topic=pb.Resource(name="AssignT"), group=pb.Resource(name=group)),
        )
        assert response.status.code == Code.OK
        queues = [a.message_queue for a in response.assignments]
        return [(q.id, list(q.accept_message_types)) for q in queues]

    assert [qid for qid, _ in await assigned("FifoG")] == [0, 1, 2, 3]
    assert await assigned("PlainG") == [(-1, [])]  # one broker-wide queue, as the Apache proxy assigns


async def test_fifo_group_receives_a_group_in_order_one_at_a_time(grpc_env: GrpcEnv) -> None:
    """The Java client never says ``fifo`` itself: the group's config makes its receives ordered."""
    await grpc_env.broker.put_group_config(GroupConfig("OrderG", consume_orderly=True))
    client = await grpc_env.connect()
    for i in range(2):
        await send(client, message("OrderT", f"o{i}".encode(), msg_id=f"O{i}", group="g1"))
    status, first = await receive(client, "OrderT", "OrderG", batch=1)
    assert [m.body for m in first] == [b"o0"]
    status, meanwhile = await receive(client, "OrderT", "OrderG")
    assert (status.code, meanwhile) == (Code.MESSAGE_NOT_FOUND, [])  # o1 waits for o0's ack
    sp = first[0].system_properties
    ack = await client.unary(
        "AckMessage",
        pb.AckMessageRequest(
            group=pb.Resource(name="OrderG"),
            topic=pb.Resource(name="OrderT"),
            entries=[pb.AckMessageEntry(message_id=sp.message_id, receipt_handle=sp.receipt_handle)],
        ),
    )
    assert ack.status.code == Code.OK
    status, second = await receive(client, "OrderT", "OrderG")
    assert [m.body for m in second] == [b"o1"]


async def test_born_host_is_the_clients_own(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    named = message("HostT", b"named", msg_id="H1")
    named.system_properties.born_host = "client-host"
    await send(client, named, message("HostT", b"anonymous", msg_id="H2"))
    _, received = await receive(client, "HostT", "HostG")
    hosts = {m.body: m.system_properties.born_host for m in received}
    assert hosts == {b"named": "client-host", b"anonymous": "127.0.0.1"}  # else the connection's address
    assert all("__BORNHOST" not in m.user_properties for m in received)

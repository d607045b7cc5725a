"""A RoutingFacade over two in-memory embedded brokers, driven through a remoting session as a client
would: sends, pulls, offsets and retries land on the backend owning the topic; an unrouted topic is
refused naming the rules."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from mqproxy.backends.embedded.broker import EmbeddedBroker, open_embedded_broker
from mqproxy.backends.embedded.internal_topics import trio_clock_ms
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.remoting import FrameDecoder, RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.routing import RoutingFacade
from mqproxy.facade.routing_rules import RoutingTable, parse_rule
from mqproxy.grpc_service.errors import code_for
from mqproxy.model.errors import ClusterUnavailable, TopicUnrouted
from mqproxy.model.types import ConsumerInfo, Subscription
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.session import RemotingSession, backend_error_reply

from ..conftest import wait_until  # type: ignore[import-not-found]
from ..remoting.conftest import pull, send, wire_frame  # type: ignore[import-not-found]

ADVERTISED = ("10.0.0.8", 8080)
RULES = (parse_rule("exact:orders", "east"), parse_rule("re:^audit-.*$", "east"))


@pytest.fixture(name="wire")
def wire_factory() -> Any:
    """``wire(code, ext, body)``: the command a Java client's frame decodes to."""

    def build(code: int, ext: dict[str, Any], body: bytes = b"") -> RemotingCommand:
        fields = {"code": code, "language": "JAVA", "version": 401, "opaque": 7, "flag": 0, "extFields": ext}
        (command,) = FrameDecoder().receive_data(wire_frame(fields, body))
        return command

    return build


@dataclass
class Two:
    east: EmbeddedBroker
    local: EmbeddedBroker
    routing: RoutingFacade
    session: RemotingSession


async def _open(default: str) -> AsyncIterator[Two]:
    stores = [InMemoryBackend(default_queue_count=2, store_host=ADVERTISED) for _ in range(2)]
    async with open_embedded_broker(stores[0], now_ms=trio_clock_ms()) as east:
        async with open_embedded_broker(stores[1], now_ms=trio_clock_ms()) as local:
            routing = RoutingFacade({"east": east, "local": local}, RoutingTable(RULES, default))
            session = RemotingSession(routing, ServerContext(*ADVERTISED), peer=("192.0.2.2", 50000))
            yield Two(east, local, routing, session)


@pytest.fixture
async def two() -> AsyncIterator[Two]:
    async for opened in _open("local"):
        yield opened


@pytest.fixture
async def no_default() -> AsyncIterator[Two]:
    async for opened in _open(""):
        yield opened


async def test_sends_and_pulls_go_to_the_owning_backend(two: Two, wire: Any) -> None:
    await send(wire, two.session, b"misc-1", topic="misc")
    await send(wire, two.session, b"order-1", topic="orders")
    await send(wire, two.session, b"audit-1", topic="audit-7")
    assert await two.east.get_topic("orders") is not None
    assert await two.east.get_topic("audit-7") is not None
    assert await two.east.get_topic("misc") is None
    assert await two.local.get_topic("misc") is not None
    assert await two.local.get_topic("orders") is None
    assert [r.body for r in await pull(wire, two.session, "orders")] == [b"order-1"]
    assert [r.body for r in await pull(wire, two.session, "misc")] == [b"misc-1"]
    assert sorted(await two.routing.topic_names()) == sorted(
        {*await two.east.topic_names(), *await two.local.topic_names()}
    )


async def test_offsets_go_to_the_owning_backend(two: Two, wire: Any) -> None:
    await send(wire, two.session, b"order-1", topic="orders")
    await two.routing.commit_consumer_offset("G", "orders", 0, 1)
    assert await two.east.query_consumer_offset("G", "orders", 0) == 1
    assert await two.local.query_consumer_offset("G", "orders", 0) is None
    assert await two.routing.query_consumer_offset("G", "orders", 0) == 1
    assert await two.routing.max_offset("orders", 0) == await two.east.max_offset("orders", 0) == 1
    user = [(o.group, o.topic, o.offset) for o in await two.routing.consumer_offsets() if o.group == "G"]
    assert user == [("G", "orders", 1)]


async def test_retry_goes_to_the_backend_of_the_groups_topic(
    two: Two, wire: Any, autojump_clock: Any
) -> None:
    # the same commit-log offset 0 exists on both backends: the send-back's originTopic picks the right one
    await send(wire, two.session, b"misc-1", topic="misc")
    await send(wire, two.session, b"order-1", topic="orders")
    (record,) = await pull(wire, two.session, "orders")  # group G is now at home on east
    assert record.commitlog_offset == 0
    ext = {"offset": "0", "group": "G", "delayLevel": "1", "originMsgId": "", "originTopic": "orders",
           "unitMode": "false", "maxReconsumeTimes": "3"}  # fmt: skip
    response = await two.session.handle(wire(RequestCode.CONSUMER_SEND_MSG_BACK, ext))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS, response.remark

    async def retried() -> bool:
        return (
            await two.east.get_topic("%RETRY%G") is not None and await two.east.max_offset("%RETRY%G", 0) > 0
        )

    await wait_until(retried)
    assert await two.local.get_topic("%RETRY%G") is None
    (again,) = await pull(wire, two.session, "%RETRY%G")
    assert again.body == b"order-1"
    assert again.properties["RETRY_TOPIC"] == "orders"


async def test_consumer_of_topics_on_both_backends_is_a_member_of_both(two: Two) -> None:
    info = ConsumerInfo("c1", "G", (Subscription("orders"), Subscription("misc"), Subscription("%RETRY%G")))
    await two.routing.register_consumer(info)
    assert await two.east.consumer_ids("G") == ["c1"]
    assert await two.local.consumer_ids("G") == ["c1"]
    assert await two.routing.consumer_ids("G") == ["c1"]
    assert await two.routing.consumer_info("G", "c1") is not None
    await two.routing.unregister_consumer("G", "c1")
    assert await two.east.consumer_ids("G") == []
    assert await two.local.consumer_ids("G") == []


async def test_unrouted_topic_is_refused_naming_the_rules(no_default: Two, wire: Any, log_sink: Any) -> None:
    response = await send(wire, no_default.session, b"x", topic="nowhere", ok=False)
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert "'nowhere'" in response.remark
    assert "exact:orders -> east, re:^audit-.*$ -> east; no routing.default" in response.remark
    (event,) = log_sink.named("backend.unrouted")
    assert event["topic"] == "nowhere"
    with pytest.raises(TopicUnrouted):
        await no_default.routing.max_offset("nowhere", 0)
    await send(wire, no_default.session, b"o", topic="orders")  # routed topics still work
    assert await no_default.east.max_offset("orders", 0) + await no_default.east.max_offset("orders", 1) == 1


def test_every_protocol_maps_unrouted_to_its_topic_not_found() -> None:
    exc = TopicUnrouted("topic 'x' is not routed to any backend (exact:orders -> east; no routing.default)")
    assert code_for(exc) == pb.Code.TOPIC_NOT_FOUND
    reply = backend_error_reply(exc)
    assert reply.code == ResponseCode.TOPIC_NOT_EXIST
    assert "exact:orders -> east" in reply.remark


async def test_listings_leave_out_a_backend_out_of_reach(
    two: Two, wire: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await send(wire, two.session, b"m", topic="misc")

    async def unreachable() -> list[str]:
        raise ClusterUnavailable("name servers unreachable")

    monkeypatch.setattr(two.east, "topic_names", unreachable)
    names = await two.routing.topic_names()
    assert "misc" in names
    monkeypatch.setattr(two.local, "topic_names", unreachable)
    with pytest.raises(ClusterUnavailable):
        await two.routing.topic_names()


def _half_ext(topic: str) -> dict[str, str]:
    props = "TAGS\x01A\x02TRAN_MSG\x01true\x02PGROUP\x01PG\x02WAIT\x01true\x02"
    return {"a": "PG", "b": topic, "c": "TBW102", "d": "2", "e": "0", "f": "4", "g": "1700000000001",
            "h": "0", "i": props, "j": "0", "k": "false", "m": "false"}  # fmt: skip


async def test_transaction_ends_on_the_half_messages_backend(two: Two, wire: Any) -> None:
    halves = {}
    for topic in ("orders", "misc"):  # both halves at commit-log offset 0 of their own store
        sent = await two.session.handle(wire(RequestCode.SEND_MESSAGE_V2, _half_ext(topic), topic.encode()))
        assert sent is not None
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        halves[topic] = sent
    for topic, sent in halves.items():
        end = {"producerGroup": "PG", "tranStateTableOffset": sent.ext_fields["queueOffset"],
               "commitLogOffset": "0", "commitOrRollback": "8", "fromTransactionCheck": "false",
               "msgId": sent.ext_fields["msgId"], "topic": topic}  # fmt: skip
        response = await two.session.handle(wire(RequestCode.END_TRANSACTION, end))
        assert response is not None
        assert response.code == ResponseCode.SUCCESS, response.remark
    assert [r.body for r in await pull(wire, two.session, "orders")] == [b"orders"]
    assert [r.body for r in await pull(wire, two.session, "misc")] == [b"misc"]
    assert await two.local.get_topic("orders") is None

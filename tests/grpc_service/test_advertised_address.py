"""``[server] advertised_address`` in every answer that names an endpoint, over the real server: gRPC
QueryRoute and QueryAssignment, remoting GET_ROUTEINFO_BY_TOPIC and GET_BROKER_CLUSTER_INFO, and the
``proxy.started`` event; without it the bound address."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.server import ServerHandle, serve
from mqproxy.settings import Settings

GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO = 105, 106


@asynccontextmanager
async def running(advertised: str) -> AsyncIterator[ServerHandle]:
    settings = Settings.for_tests(server={"advertised_address": advertised})
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(
            lambda task_status: serve(settings, install_signal_handlers=False, task_status=task_status)
        )
        yield handle
        handle.stop()


async def remoting_call(handle: ServerHandle, code: int, ext: dict[str, str]) -> dict[str, Any]:
    header = json.dumps({"code": code, "language": "JAVA", "version": 401, "opaque": 1, "flag": 0,
                         "extFields": ext}).encode()
    stream = await trio.open_tcp_stream(*handle.address)
    await stream.send_all(struct.pack(">ii", 4 + len(header), len(header)) + header)
    raw = bytearray()
    with trio.fail_after(5):
        while len(raw) < 4 or len(raw) < 4 + struct.unpack_from(">i", raw)[0]:
            raw += await stream.receive_some(65536)
    await stream.aclose()
    total, header_len = struct.unpack_from(">ii", raw)
    reply = json.loads(raw[8 : 8 + (header_len & 0xFFFFFF)])
    assert reply["code"] == 0, reply
    body: dict[str, Any] = json.loads(bytes(raw[8 + (header_len & 0xFFFFFF) : 4 + total]))
    return body


async def grpc_endpoints(handle: ServerHandle, client_cls: Any, nursery: trio.Nursery) -> list[Any]:
    client = client_cls(await trio.open_tcp_stream(*handle.address), "adv@1@0")
    await client.start(nursery)
    route = await client.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="AdvTopic")))
    assignment = await client.unary(
        "QueryAssignment",
        pb.QueryAssignmentRequest(topic=pb.Resource(name="AdvTopic"), group=pb.Resource(name="AdvGroup")),
    )
    found = [q.broker.endpoints for q in route.message_queues]
    found += [a.message_queue.broker.endpoints for a in assignment.assignments]
    assert len(found) >= 2
    return found


@pytest.mark.parametrize(
    ("advertised", "host", "port", "scheme", "remoting"),
    [
        ("203.0.113.7:19876", "203.0.113.7", 19876, pb.AddressScheme.IPv4, "203.0.113.7:19876"),
        ("mq.example.com:443", "mq.example.com", 443, pb.AddressScheme.DOMAIN_NAME, "mq.example.com:443"),
        ("[2001:db8::7]:19876", "2001:db8::7", 19876, pb.AddressScheme.IPv6, "2001:db8::7:19876"),
    ],
)
async def test_every_endpoint_answer_names_the_advertised_address(
    advertised: str, host: str, port: int, scheme: Any, remoting: str,
    grpc_client_cls: Any, nursery: trio.Nursery, log_sink: Any,
) -> None:
    async with running(advertised) as handle:
        for endpoints in await grpc_endpoints(handle, grpc_client_cls, nursery):
            assert endpoints.scheme == scheme
            assert [(a.host, a.port) for a in endpoints.addresses] == [(host, port)]
        route = await remoting_call(handle, GET_ROUTEINFO_BY_TOPIC, {"topic": "AdvTopic"})
        assert [b["brokerAddrs"] for b in route["brokerDatas"]] == [{"0": remoting}]
        info = await remoting_call(handle, GET_BROKER_CLUSTER_INFO, {})
        assert [b["brokerAddrs"] for b in info["brokerAddrTable"].values()] == [{"0": remoting}]
    (started,) = log_sink.named("proxy.started")
    assert started["advertised"] == advertised
    assert started["listen"] == f"127.0.0.1:{handle.address[1]}"


async def test_without_it_answers_name_the_bound_address(
    grpc_client_cls: Any, nursery: trio.Nursery, log_sink: Any
) -> None:
    settings = Settings.for_tests()
    async with trio.open_nursery() as inner:
        handle: ServerHandle = await inner.start(
            lambda task_status: serve(settings, install_signal_handlers=False, task_status=task_status)
        )
        bound = f"127.0.0.1:{handle.address[1]}"
        for endpoints in await grpc_endpoints(handle, grpc_client_cls, nursery):
            assert [(a.host, a.port) for a in endpoints.addresses] == [handle.address]
        route = await remoting_call(handle, GET_ROUTEINFO_BY_TOPIC, {"topic": "AdvTopic"})
        assert [b["brokerAddrs"] for b in route["brokerDatas"]] == [{"0": bound}]
        handle.stop()
    assert log_sink.named("proxy.started")[0]["advertised"] == bound


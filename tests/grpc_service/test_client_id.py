"""A gRPC connection's context learns the client's ``x-mq-client-id`` (the console lists it)."""

from __future__ import annotations

from typing import Any

from mqproxy.codecs import rocketmq_v2 as pb


async def test_the_first_call_names_the_connection(grpc_env: Any) -> None:
    client = await grpc_env.connect("10.0.0.9@77@<i>x</i>")
    ctx = grpc_env.contexts[-1]
    assert ctx.client_id is None
    await client.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="CidTopic")))
    assert ctx.client_id == "10.0.0.9@77@<i>x</i>"

"""The real server (``mqproxy.server.serve``) over loopback TCP: gRPC over h2c and over TLS (ALPN h2) on the
same port, through sniffing, the route table and the broker services the server wires."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.server import ServerHandle, serve
from mqproxy.settings import Settings


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[ServerHandle, trustme.CA]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    settings = Settings.for_tests(tls={"cert_file": str(cert_file), "key_file": str(key_file)})
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(
            lambda task_status: serve(settings, install_signal_handlers=False, task_status=task_status)
        )
        yield handle, ca
        handle.stop()


async def open_client(cls: Any, nursery: trio.Nursery, stream: trio.abc.Stream, client_id: str) -> Any:
    client = cls(stream, client_id)
    await client.start(nursery)
    return client


async def test_h2c_and_tls_on_one_port(
    tls_server: tuple[ServerHandle, trustme.CA], grpc_client_cls: Any, nursery: trio.Nursery
) -> None:
    handle, ca = tls_server
    host, port = handle.address
    plain = await open_client(grpc_client_cls, nursery, await trio.open_tcp_stream(host, port), "plain@1@0")
    context = ssl.create_default_context()
    ca.configure_trust(context)
    context.set_alpn_protocols(["h2"])
    tls_stream = trio.SSLStream(await trio.open_tcp_stream(host, port), context, server_hostname="127.0.0.1")
    await tls_stream.do_handshake()
    assert tls_stream.selected_alpn_protocol() == "h2"
    secure = await open_client(grpc_client_cls, nursery, tls_stream, "secure@1@0")

    route = await plain.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="Loop")))
    address = route.message_queues[0].broker.endpoints.addresses[0]
    assert (address.host, address.port) == (host, port)  # the proxy's own advertised address
    sp = pb.SystemProperties(message_id="LOOP-1", tag="T", body_encoding=pb.Encoding.IDENTITY)
    sent = await secure.unary(
        "SendMessage",
        pb.SendMessageRequest(
            messages=[pb.RmqMessage(topic=pb.Resource(name="Loop"), system_properties=sp, body=b"over tls")]
        ),
    )
    assert sent.status.code == pb.Code.OK
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name="LoopGroup"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="Loop")),
        batch_size=4,
        invisible_duration=pb.Duration(seconds=30),
        long_polling_timeout=pb.Duration(seconds=1),
    )
    sid = await plain.open("ReceiveMessage", [request.SerializeToString()], grpc_timeout="5S")
    result = await plain.wait(sid)
    responses = [pb.ReceiveMessageResponse.FromString(m) for m in result.messages()]
    assert responses[0].status.code == pb.Code.OK  # the server wires the pop service itself
    assert [r.message.body for r in responses[1:-1]] == [b"over tls"]
    assert responses[1].message.system_properties.message_id == "LOOP-1"

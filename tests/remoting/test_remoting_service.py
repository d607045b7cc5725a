"""RemotingService as the server core uses it: requests and the close reason go to the connection context,
and every connection shares the service's group registry."""

from __future__ import annotations

import json

import trio
import trio.testing

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.negotiation import Detected, Protocol
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.service import RemotingService
from mqproxy.runtime.context import ConnectionContext

from .conftest import ADVERTISED, Peer  # type: ignore[import-not-found]


class Recorder:
    def __init__(self) -> None:
        self.fields: list[dict[str, object]] = []

    def record(self, protocol: str | None, log: object, fields: dict[str, object]) -> None:
        self.fields.append(fields)


def heartbeat(client_id: str) -> RemotingCommand:
    body = {"clientID": client_id, "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": []}]}
    return RemotingCommand(RequestCode.HEART_BEAT, opaque=1, body=json.dumps(body).encode())


async def test_serve_reports_requests_and_shares_the_registry(broker) -> None:
    service = RemotingService(broker, ServerContext(*ADVERTISED))
    recorder = Recorder()
    conn = ConnectionContext("c1", ("192.0.2.2", 50000), ADVERTISED, recorder=recorder, protocol="remoting")
    client_stream, server_stream = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        nursery.start_soon(service.serve, server_stream, conn, Detected(Protocol.REMOTING))
        peer = Peer(client_stream)
        assert (await peer.request(heartbeat("a@1"))).code == ResponseCode.SUCCESS
        assert service.registry.connections("G") != []
        await client_stream.send_all(b"\x00\x00\x00\x01\x00")  # a frame too short to hold its header
    # serve returned: the connection ended on the bad frame
    assert conn.requests == 1
    assert (recorder.fields[0]["op"], recorder.fields[0]["client_id"]) == ("HEART_BEAT", "a@1")
    assert conn.error is not None
    assert service.registry.connections("G") == []


async def test_only_an_embedded_store_gets_inline_requests_and_sends_only_with_async_flush(broker) -> None:
    from mqproxy.remoting.service import INLINE_ON_EMBEDDED, INLINE_SENDS
    from mqproxy.settings import load_settings

    def inline(overrides: dict[str, dict[str, object]]) -> frozenset[int]:
        settings = load_settings(None, {}, overrides)
        return RemotingService.from_settings(broker, settings, ADVERTISED).limits.inline_codes

    assert inline({"store": {"flush": "async"}}) == INLINE_ON_EMBEDDED | INLINE_SENDS
    assert inline({"store": {"flush": "sync"}}) == INLINE_ON_EMBEDDED
    cluster = {"backend": {"kind": "rocketmq", "namesrv": "127.0.0.1:9876"}}
    assert inline(cluster) == frozenset()
    assert RequestCode.PULL_MESSAGE not in INLINE_ON_EMBEDDED | INLINE_SENDS

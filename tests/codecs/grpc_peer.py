"""The in-memory h2 client peer the gRPC codec tests drive a :class:`GrpcServerConnection` with, and their
request builders."""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.settings import SettingCodes

from mqproxy.codecs import rocketmq_v2 as v2
from mqproxy.codecs.grpc_framing import GrpcEvent
from mqproxy.codecs.grpc_wire import GrpcServerConnection

from ..grpc_service.conftest import with_overrides  # type: ignore[import-not-found]

__all__ = ["PREFACE", "RECEIVE", "SEND", "Peer", "of", "request_headers", "send_request"]


SEND = "/apache.rocketmq.v2.MessagingService/SendMessage"
RECEIVE = "/apache.rocketmq.v2.MessagingService/ReceiveMessage"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def request_headers(path: str = SEND, **overrides: str | None) -> list[tuple[str, str]]:
    headers = {
        ":method": "POST", ":scheme": "http", ":path": path, ":authority": "127.0.0.1:8081",
        "content-type": "application/grpc", "te": "trailers", "grpc-timeout": "3S",
        "x-mq-client-id": "host@1@0", "x-mq-language": "PYTHON",
    }
    return with_overrides(headers, overrides)


class Peer:
    """A real h2 client wired to a GrpcServerConnection through in-memory byte hand-offs."""

    def __init__(self, client_window: int | None = None, **server_kwargs: int) -> None:
        self.server = GrpcServerConnection(**server_kwargs)
        self.server.initiate()
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.client = h2.connection.H2Connection(config)
        self.client.initiate_connection()
        if client_window is not None:  # as grpc-python: SETTINGS for streams, WINDOW_UPDATE for the conn
            self.client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: client_window})
            if client_window > 65_535:
                self.client.increment_flow_control_window(client_window - 65_535)
        self.outbox: dict[int, bytearray] = {}  # client bytes waiting for window
        self.end_after: set[int] = set()
        self.client_events: list[h2.events.Event] = []
        self.received: dict[int, bytearray] = {}
        self.server_s = 0.0  # time spent inside the server codec during pump()

    def open(self, headers: Sequence[tuple[str, str]], *, end_stream: bool = False) -> int:
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, headers, end_stream=end_stream)
        return sid

    def send(self, sid: int, data: bytes, *, end_stream: bool = False) -> None:
        self.outbox.setdefault(sid, bytearray()).extend(data)
        if end_stream:
            self.end_after.add(sid)
        self._client_flush()

    def _client_flush(self) -> None:
        for sid, buf in list(self.outbox.items()):
            while buf:
                window = self.client.local_flow_control_window(sid)
                n = min(window, self.client.max_outbound_frame_size, len(buf))
                if n <= 0:
                    break
                self.client.send_data(sid, bytes(buf[:n]))
                del buf[:n]
            if not buf:
                del self.outbox[sid]
                if sid in self.end_after:
                    self.end_after.discard(sid)
                    self.client.end_stream(sid)

    def pump(self, max_rounds: int = 10_000) -> list[GrpcEvent]:
        """Exchange bytes until both sides are quiet; return the server's events."""
        events: list[GrpcEvent] = []
        for _ in range(max_rounds):
            to_server = self.client.data_to_send()
            t0 = time.process_time()
            if to_server:
                events.extend(self.server.receive_data(to_server))
            to_client = self.server.data_to_send()
            self.server_s += time.process_time() - t0
            if to_client:
                self.deliver(to_client)
            if not to_server and not to_client:
                return events
        raise AssertionError("pump did not settle")

    def deliver(self, to_client: bytes) -> None:
        """Feed server bytes to the client, recording its events and re-opening its windows."""
        for ev in self.client.receive_data(to_client):
            self.client_events.append(ev)
            if isinstance(ev, h2.events.DataReceived):
                self.received.setdefault(ev.stream_id, bytearray()).extend(ev.data)
                self.client.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        self._client_flush()

    def response_headers(self, sid: int) -> list[list[tuple[str, str]]]:
        blocks: list[list[tuple[str, str]]] = []
        for ev in self.client_events:
            is_headers = isinstance(ev, h2.events.ResponseReceived | h2.events.TrailersReceived)
            if is_headers and ev.stream_id == sid:
                blocks.append(list(ev.headers))  # type: ignore[arg-type]
        return blocks

    def resets(self) -> dict[int, int]:
        return {ev.stream_id: int(ev.error_code) for ev in self.client_events
                if isinstance(ev, h2.events.StreamReset)}

    def messages(self, sid: int) -> list[bytes]:
        buf, out = bytes(self.received.get(sid, b"")), []
        while buf:
            flag, length = struct.unpack_from(">BI", buf)
            assert flag == 0
            out.append(buf[5:5 + length])
            buf = buf[5 + length:]
        return out

    def ended(self, sid: int) -> bool:
        return any(isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid for ev in self.client_events)


def of(events: Sequence[GrpcEvent], kind: type[GrpcEvent]) -> list[GrpcEvent]:
    return [e for e in events if isinstance(e, kind)]


def send_request() -> bytes:
    req = v2.SendMessageRequest()
    msg = req.messages.add()
    msg.topic.name = "TopicTest"
    msg.body = b"hello"
    msg.user_properties["p1"] = "v1"
    msg.system_properties.tag = "TagA"
    msg.system_properties.message_id = "01ABC"
    msg.system_properties.message_type = v2.MessageType.NORMAL
    return req.SerializeToString()

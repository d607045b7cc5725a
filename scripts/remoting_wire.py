#!/usr/bin/env python3
"""One RocketMQ remoting request over a blocking socket (JSON header, optional body), for the
stock-RocketMQ launcher's readiness checks and for tests. Standard library only."""

from __future__ import annotations

import json
import socket

#: Request codes the launcher sends to a name server.
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106


def remoting_call(
    addr: str, code: int, ext: dict[str, str] | None = None, *, timeout: float = 5.0, body: bytes = b""
) -> tuple[int, str, bytes]:
    """One RocketMQ remoting request (JSON header, optional body) to ``addr``: (code, remark, body)."""
    reply, answer = remoting_exchange(addr, code, ext, timeout=timeout, body=body)
    return int(reply["code"]), str(reply.get("remark") or ""), answer


def remoting_exchange(
    addr: str, code: int, ext: dict[str, str] | None = None, *, timeout: float = 5.0, body: bytes = b""
) -> tuple[dict[str, object], bytes]:
    """:func:`remoting_call` returning the whole response header (``code``, ``remark``, ``extFields``)."""
    host, port = addr.rsplit(":", 1)
    header = json.dumps(
        {"code": code, "language": "JAVA", "version": 0, "opaque": 1, "flag": 0, "extFields": ext or {}}
    ).encode()
    frame = (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big")
    frame += header + body
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(frame)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"{addr} closed the connection")
            buf += chunk
    length = int.from_bytes(buf[:4], "big")
    header_len = int.from_bytes(buf[4:8], "big") & 0xFFFFFF
    reply = json.loads(buf[8 : 8 + header_len])
    return reply, buf[8 + header_len : 4 + length]

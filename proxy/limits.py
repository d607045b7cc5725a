"""Connection limits: how many connections the server admits in total and per source address, and the
bytes that refuse one politely. Pure bookkeeping and byte building; :mod:`mqproxy.connection` does the I/O.

Contract:

- :meth:`ConnectionLimiter.open_total` is called once per accepted socket; an admitted one is released
  with :meth:`ConnectionLimiter.close_total`. A socket still being sniffed counts (it holds a descriptor
  and a task), so slow-loris sockets fill the total, never more.
- :meth:`ConnectionLimiter.open_address` is called once the source address is known (after the PROXY
  header when there is one) and released with :meth:`ConnectionLimiter.close_address`.
- Refusing politely needs a short read of the new connection; at most :data:`MAX_POLITE_REFUSALS` run at
  once (:meth:`ConnectionLimiter.begin_refusal`), any further one is closed at once without a word.
- :func:`refusal_bytes` is what a refused connection is told, by protocol: MQTT 5 a CONNACK 0x97 (quota
  exceeded), MQTT 3.1/3.1.1 CONNACK return code 3 (server unavailable), HTTP a 503, gRPC (h2) the server's
  SETTINGS then GOAWAY ENHANCE_YOUR_CALM with nothing processed (a client retries on a new connection);
  remoting, TLS and anything else nothing (a plain close: answering a remoting request means decoding it,
  and TLS means a handshake).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mqproxy.codecs import mqtt as mq
from mqproxy.negotiation import Detected, Protocol

__all__ = [
    "MAX_POLITE_REFUSALS",
    "REASON_MAX_CONNECTIONS",
    "REASON_MAX_PER_ADDRESS",
    "REFUSAL_READ_S",
    "ConnectionLimiter",
    "refusal_bytes",
]

#: Refusals that read the connection's first bytes (to answer in its protocol) at the same time.
MAX_POLITE_REFUSALS = 64
#: Longest a refused connection is read for its protocol, and then for its last bytes after the answer
#: (closing with unread bytes would send a reset that may destroy the answer before the peer reads it).
REFUSAL_READ_S = 1.0

REASON_MAX_CONNECTIONS = "max_connections"
REASON_MAX_PER_ADDRESS = "max_connections_per_address"

_H2_SETTINGS_EMPTY = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_GOAWAY_TYPE = 0x07
_H2_ENHANCE_YOUR_CALM = 0x0B


@dataclass(eq=False)
class ConnectionLimiter:
    """Counts admitted connections in total and per source address. A limit of 0 means unlimited."""

    max_total: int = 0
    max_per_address: int = 0
    total: int = 0
    refusing: int = 0
    per_address: dict[str, int] = field(default_factory=dict)

    def open_total(self) -> bool:
        """Admit one more connection unless the total is reached; True when admitted (and counted)."""
        if self.max_total and self.total >= self.max_total:
            return False
        self.total += 1
        return True

    def close_total(self) -> None:
        self.total -= 1

    def open_address(self, host: str) -> bool:
        """Admit one more connection from ``host`` unless its limit is reached; True when admitted."""
        count = self.per_address.get(host, 0)
        if self.max_per_address and count >= self.max_per_address:
            return False
        self.per_address[host] = count + 1
        return True

    def close_address(self, host: str) -> None:
        count = self.per_address.get(host, 0) - 1
        if count > 0:
            self.per_address[host] = count
        else:
            self.per_address.pop(host, None)  # the table holds only addresses with open connections

    def begin_refusal(self) -> bool:
        """Start a polite refusal unless :data:`MAX_POLITE_REFUSALS` run; True when it may read."""
        if self.refusing >= MAX_POLITE_REFUSALS:
            return False
        self.refusing += 1
        return True

    def end_refusal(self) -> None:
        self.refusing -= 1


def refusal_bytes(detected: Detected | None, reason: str) -> bytes:
    """What a connection refused for ``reason`` is sent before it is closed (b"" = a plain close)."""
    if detected is None:
        return b""
    if detected.protocol is Protocol.MQTT:
        level = int(detected.info.get("mqtt_level", 4))
        props = (
            mq.Properties(reason_string=f"too many connections ({reason})")
            if level == mq.MQTT_5
            else mq.NO_PROPERTIES
        )
        return mq.encode(mq.Connack(False, mq.ReasonCode.QUOTA_EXCEEDED, props), level)
    if detected.protocol is Protocol.HTTP:
        body = f"too many connections ({reason})\n".encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body
    if detected.protocol is Protocol.GRPC:
        debug = reason.encode()
        payload = (0).to_bytes(4, "big") + _H2_ENHANCE_YOUR_CALM.to_bytes(4, "big") + debug
        goaway = (
            len(payload).to_bytes(3, "big") + bytes((_H2_GOAWAY_TYPE, 0)) + (0).to_bytes(4, "big") + payload
        )
        return _H2_SETTINGS_EMPTY + goaway
    return b""

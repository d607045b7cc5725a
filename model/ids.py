"""
mqproxy.model.ids
~~~~~~~~~~~~~~~~~~~~~~~~~

RocketMQ message ids.

* Offset message id (send response ``msgId``, ``offsetMsgId``): uppercase hex of
  ``store IP (4 or 16 bytes) + i32 port + i64 commit-log offset`` -> 32 hex chars (IPv4) or 56 (IPv6).
  Clients decode it to find the store address and the commit-log offset, so it must be well formed.
* ``UNIQ_KEY`` (client message id): uppercase hex of ``IP (4/16) + i16 pid + i32 class-loader hash +
  i32 ms since the start of the month + i16 counter`` (Java ``MessageClientIDSetter``), made here for
  messages that arrive without one (ali-ons). Never parse a client's ``UNIQ_KEY``: layouts vary.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import struct
from datetime import UTC, datetime

__all__ = ["MessageIdError", "new_uniq_key", "offset_msg_id", "pack_ip", "parse_offset_msg_id"]

_PORT_OFFSET = struct.Struct(">iq")
_UNIQ_TAIL = struct.Struct(">hiih")
_HEX_ID = re.compile(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}")


class MessageIdError(ValueError):
    """A message id or host that cannot be encoded or decoded."""


@functools.lru_cache(maxsize=4096)
def pack_ip(ip: str) -> bytes:
    """The 4- or 16-byte form of an IP literal (an IPv6 scope id is dropped). Cached: hosts repeat."""
    try:
        return ipaddress.ip_address(ip).packed
    except ValueError:
        raise MessageIdError(f"not an IP address: {ip!r}") from None


def offset_msg_id(store_host: tuple[str, int], commitlog_offset: int) -> str:
    """The offset message id of the record at ``commitlog_offset`` stored by ``store_host`` (ip, port)."""
    ip, port = store_host
    if not 0 <= port <= 0xFFFF or not 0 <= commitlog_offset < 2**63:
        raise MessageIdError(f"port {port} or offset {commitlog_offset} out of range")
    return (pack_ip(ip) + _PORT_OFFSET.pack(port, commitlog_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """``((ip, port), commitlog_offset)`` from an offset message id (32 or 56 hex chars, any case)."""
    if not isinstance(msg_id, str) or _HEX_ID.fullmatch(msg_id) is None:
        raise MessageIdError(f"not an offset message id: {msg_id!r}")
    raw = bytes.fromhex(msg_id)
    ip_len = len(raw) - _PORT_OFFSET.size
    port, offset = _PORT_OFFSET.unpack_from(raw, ip_len)
    if not 0 <= port <= 0xFFFF or offset < 0:
        raise MessageIdError(f"port {port} or offset {offset} out of range in {msg_id!r}")
    return (_ip_text(raw[:ip_len]), port), offset


@functools.lru_cache(maxsize=4096)
def _ip_text(packed: bytes) -> str:
    """The text of a 4- or 16-byte address. Cached: hosts repeat (a node parses one id per send)."""
    return str(ipaddress.ip_address(packed))


def _start_of_month_ms(timestamp_ms: int) -> int:
    moment = datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC)
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp()) * 1000


def new_uniq_key(host: str, pid: int, counter: int, timestamp_ms: int, *, class_hash: int = 0) -> str:
    """A ``UNIQ_KEY`` in the Java client layout (32 hex chars for an IPv4 ``host``, 56 for IPv6).

    ``pid`` and ``counter`` are truncated to 16 bits and ``class_hash`` to 32, as Java does; the time
    field is milliseconds since the start of the UTC month of ``timestamp_ms``. Uniqueness comes from
    (host, pid, time, counter): callers keep a per-process counter.
    """
    since_month = timestamp_ms - _start_of_month_ms(timestamp_ms)
    tail = _UNIQ_TAIL.pack(
        _signed(pid, 16),
        _signed(class_hash, 32),
        _signed(since_month, 32),
        _signed(counter, 16),
    )
    return (pack_ip(host) + tail).hex().upper()


def _signed(value: int, bits: int) -> int:
    """``value`` truncated to a signed ``bits``-bit integer, the way a Java cast does."""
    mask = (1 << bits) - 1
    value &= mask
    return value - (1 << bits) if value >> (bits - 1) else value

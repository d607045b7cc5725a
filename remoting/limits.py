"""
mqproxy.remoting.limits
~~~~~~~~~~~~~~~~~~~~~~~

What one remoting connection is allowed (:class:`ConnectionLimits`) and what it reports when it ends
(:class:`ConnectionStats`); see :mod:`mqproxy.remoting.connection`, which re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqproxy.codecs.remoting import DEFAULT_MAX_FRAME_BYTES

__all__ = ["ConnectionLimits", "ConnectionStats"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: Requests handled concurrently; more are answered SYSTEM_BUSY ``[OVERLOAD]``.
    max_in_flight: int = 1024
    #: Close after this long without reading or writing anything (Java: 120 s; clients heartbeat
    #: every 30 s).
    idle_timeout_s: float = 120.0
    #: Close when a frame whose first byte arrived is still incomplete this long after (a stalled or
    #: slow-loris peer); the idle timeout only counts silence between frames.
    frame_timeout_s: float = 10.0
    #: Close when one write (the frames queued at its start) is not taken within this time (the peer
    #: stopped reading).
    write_timeout_s: float = 30.0
    #: Bytes of response frames queued for the writer beyond which further responses wait to be queued.
    max_outbox_bytes: int = 4 * 1024 * 1024
    #: Time allowed for unregistering the connection's consumers after it ended.
    cleanup_timeout_s: float = 5.0
    #: Request codes handled inline in the read loop when a read brings one frame alone: only codes
    #: whose handling never waits long (no long poll, hold or network round trip; see the module text).
    inline_codes: frozenset[int] = frozenset()
    #: Request codes (pulls on the embedded store) the read loop serves inline however many frames a read
    #: brings, one after another, their answers written together in one write once the read's frames are
    #: handled. Their handlers answer at once or raise :class:`~mqproxy.remoting.errors.WouldWait` (a pull
    #: that would be held): that request then runs in its own task.
    batch_codes: frozenset[int] = frozenset()
    #: Answers of a batch beyond this many bytes are written before the next frame of the read is served.
    batch_bytes: int = 1024 * 1024


@dataclass(slots=True)
class ConnectionStats:
    """What the caller logs in ``conn.closed``; updated while the connection runs."""

    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    #: None for a clean close (peer EOF or cancellation), else a reason token.
    error: str | None = None
    detail: str | None = None

"""
mqproxy.remoting_client.outbox
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The write side of a framed connection whose frames come from many tasks at once (the remoting
connections: this client's to brokers, and :mod:`mqproxy.remoting`'s client-facing ones):
:class:`FrameOutbox` sends the frames of concurrent callers together, in one ``send_all``, without a lock
for them to queue on.

Contracts:

* :meth:`FrameOutbox.put` appends a whole encoded frame. If no write is under way the caller becomes the
  writer: it takes everything queued, joins it, sends it with one ``send_all``, and repeats until nothing
  is queued; otherwise it returns at once (its frame goes out with the writer's next ``send_all``). Frames
  leave in the order they were put; no schedule point separates the check and the append. An outbox with
  a ``nursery`` has its new writer yield once before its first write, so the frames other tasks put in
  the same scheduling round (e.g. the answers to the requests of one read) leave in that same
  ``send_all``: one ``send`` syscall for them rather than two.
* Back-pressure: while ``max_bytes`` or more are queued (not yet taken by the writer), callers wait until
  the writer takes them (one :class:`trio.Event` wakes them all; no queue of waiters).
* A write that fails (``trio.BrokenResourceError``, ``ClosedResourceError``, ``OSError``), takes longer than
  ``write_timeout_s``, or is cancelled part-way gives the outbox up: ``on_broken(reason, detail)`` is called
  once, queued frames are dropped, callers waiting for room and every later caller get
  :class:`OutboxBroken`. Reasons: ``connection_lost``, ``write_timeout``, ``write_cancelled``. A stream
  given up never receives another byte, so no frame ever follows a cut one.
* A writer cancelled *between* two writes (nothing of the next batch sent) does not give the outbox up: it
  hands the rest to a task started in ``nursery`` (given up if there is none or it is closed).
* With ``shield_writes`` (a connection many callers share, e.g. one to a broker), a write once begun is
  shielded from its caller's cancellation and ends only by completing, failing or ``write_timeout_s``:
  one caller that goes away never cuts a frame and so never ends the connection for the others.
* :meth:`FrameOutbox.close` (the connection ends for another reason) drops what is queued and fails later
  callers; it does not call ``on_broken``. A connection that closes on purpose calls
  :meth:`FrameOutbox.flush` first: a caller's ``put`` may return before its frame left (another caller was
  writing), so only the flush makes sure every frame put so far was written.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

__all__ = ["FrameOutbox", "OutboxBroken"]


class OutboxBroken(Exception):
    """The outbox was given up or closed; ``reason`` is its token (see the module contracts)."""

    def __init__(self, reason: str, detail: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def _ignore_sent(size: int) -> None:
    pass


def _ignore_broken(reason: str, detail: str | None) -> None:
    pass


class FrameOutbox:
    """Coalescing, single-writer sending of whole frames to ``stream`` (see the module contracts)."""

    def __init__(
        self,
        stream: trio.abc.SendStream,
        *,
        max_bytes: int,
        write_timeout_s: float = math.inf,
        nursery: trio.Nursery | None = None,
        shield_writes: bool = False,
        on_sent: Callable[[int], None] = _ignore_sent,
        on_broken: Callable[[str, str | None], None] = _ignore_broken,
    ) -> None:
        self._stream = stream
        self._max_bytes = max_bytes
        self._write_timeout_s = write_timeout_s
        self._shield_writes = shield_writes
        #: Where a writer cancelled between two writes hands the rest over (settable once it exists).
        self.nursery = nursery
        self._on_sent = on_sent
        self._on_broken = on_broken
        self._frames: list[bytes | bytearray] = []
        self._queued_bytes = 0
        #: True from the moment a caller becomes the writer until nothing is queued (or it gave up).
        self._writing = False
        #: Set (and dropped) when the writer takes the queue or the outbox ends; created by a waiter.
        self._room: trio.Event | None = None
        self._error: OutboxBroken | None = None
        #: Set (and dropped) when the writer finds nothing more to write; created by a flush.
        self._idle: trio.Event | None = None
        #: Number of ``send_all`` calls made (what the coalescing saves is frames put minus this).
        self.writes = 0

    @property
    def broken(self) -> OutboxBroken | None:
        """Why the outbox ended, or None while it is usable."""
        return self._error

    @property
    def idle(self) -> bool:
        """Usable, nothing queued and no write under way: a caller may write to the stream directly
        (until its next schedule point) and put what the stream did not take."""
        return not self._writing and not self._frames and self._error is None

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    async def put(self, frame: bytes | bytearray, *, deadline: float = math.inf) -> None:
        """Queue ``frame`` and, if no write is under way, write until nothing is queued.

        Raises :class:`OutboxBroken` if the outbox ended before the frame was queued, or while this
        caller was the writer (its frame may or may not have gone out); :class:`trio.TooSlowError` if
        ``deadline`` (trio time) passed while waiting for room (the frame was not queued)."""
        while True:
            if self._error is not None:
                raise self._error
            if self._queued_bytes < self._max_bytes:
                break
            if self._room is None:
                self._room = trio.Event()
            with trio.CancelScope(deadline=deadline) as waiting:
                await self._room.wait()
            if waiting.cancelled_caught:
                raise trio.TooSlowError
        if not self._writing:
            # A caller already cancelled fails here, before its frame is queued. From this check to the
            # first send_all there is no schedule point, so that send_all cannot be cancelled before
            # it writes something: a cancelled write is always a cut one.
            await trio.lowlevel.checkpoint_if_cancelled()
        self._frames.append(frame)
        self._queued_bytes += len(frame)
        if self._writing:
            return
        self._writing = True
        if self.nursery is not None:
            # Let the callers of this scheduling round queue theirs first: one send_all for them all. A
            # writer cancelled meanwhile hands its frames over before writing anything (see below).
            await trio.lowlevel.cancel_shielded_checkpoint()
        await self._write_queued(may_hand_off=True)

    async def flush(self) -> None:
        """Wait until every frame put so far was written, or the outbox ended (bound it with a timeout)."""
        while self._writing and self._error is None:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()

    def close(self, reason: str = "closed", detail: str | None = None) -> None:
        """End the outbox without calling ``on_broken``; a write under way ends with the stream."""
        if self._error is None:
            self._end(OutboxBroken(reason, detail))

    async def _write_queued(self, *, may_hand_off: bool) -> None:
        handed_off = False
        try:
            while self._frames and self._error is None:
                if trio.current_effective_deadline() == -math.inf:  # cancelled between two writes
                    handed_off = may_hand_off and self._hand_off()
                    if not handed_off:
                        self._give_up("write_cancelled", "writer cancelled with frames queued")
                    break
                frames, self._frames = self._frames, []
                size, self._queued_bytes = self._queued_bytes, 0
                if self._room is not None:
                    self._room.set()
                    self._room = None
                data = frames[0] if len(frames) == 1 else b"".join(frames)
                self.writes += 1
                # one scope for both: its own deadline ends it even when it is shielded
                deadline = trio.current_time() + self._write_timeout_s
                with trio.CancelScope(shield=self._shield_writes, deadline=deadline) as scope:
                    await self._stream.send_all(data)
                if scope.cancelled_caught:
                    self._give_up(
                        "write_timeout", f"{size} bytes not taken within {self._write_timeout_s:g} s"
                    )
                    break
                self._on_sent(size)
        except trio.Cancelled:
            self._give_up("write_cancelled", "cancelled part-way through a write")
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._give_up("connection_lost", str(exc) or type(exc).__name__)
        finally:
            if not handed_off:
                self._writing = False
                self._set_idle()
        if self._error is not None:
            raise self._error

    def _hand_off(self) -> bool:
        if self.nursery is None:
            return False
        try:
            self.nursery.start_soon(self._write_handed_off)
        except RuntimeError:  # the nursery is closing: the connection is ending
            return False
        return True

    async def _write_handed_off(self) -> None:
        try:
            await self._write_queued(may_hand_off=False)
        except OutboxBroken:
            pass  # reported through on_broken

    def _give_up(self, reason: str, detail: str | None) -> None:
        if self._error is None:
            self._end(OutboxBroken(reason, detail))
            self._on_broken(reason, detail)

    def _end(self, error: OutboxBroken) -> None:
        self._error = error
        self._frames.clear()
        self._queued_bytes = 0
        if self._room is not None:
            self._room.set()
            self._room = None
        self._set_idle()

    def _set_idle(self) -> None:
        if self._idle is not None:
            self._idle.set()
            self._idle = None

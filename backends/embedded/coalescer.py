"""Write coalescing: concurrent requests from many tasks share one synchronous write.

:class:`WriteCoalescer` wraps a ``write(requests) -> outcomes`` function that is costly per call (one
``pwrite`` and one index transaction) but cheap per request. The first task to :meth:`~WriteCoalescer.submit`
becomes the *leader*: it yields once (shielded from cancellation), so every task already runnable in this
scheduler turn can queue its request behind it, then runs ``write`` once for everything queued and hands
each waiting *follower* its own outcome. Requests keep their submission order inside one write.

A yield costs a scheduler turn, wasted when nobody joins: after ``SOLO_WRITES`` writes in a row that
carried one request each, the leader writes at once and only every ``PROBE_EVERY``-th leader yields to
look for company; a write that finds some resumes yielding every time.

Contracts:

* ``write`` runs on the trio thread without awaiting, so no other task sees a half-done write.
* ``write`` returns one outcome per request, in order: a result, or a ``BaseException`` instance that
  ``submit`` raises for that request only. If ``write`` itself raises, every request of that write gets
  that exception.
* A follower cancelled before its write started is withdrawn (its request is never written). One
  cancelled after its write ran gets ``Cancelled``; what was written stays written.
* Whether a leader yields never changes an outcome, only how requests are grouped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import trio
import trio.lowlevel

__all__ = ["WriteCoalescer"]

#: Writes of one request in a row after which leaders stop yielding (except to probe).
SOLO_WRITES = 4
#: While solo, one leader in this many yields to look for concurrent requests.
PROBE_EVERY = 8

Request = TypeVar("Request")
Result = TypeVar("Result")


class _Slot(Generic[Request, Result]):
    __slots__ = ("done", "error", "finished", "request", "result")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.result: Result | None = None
        self.error: BaseException | None = None
        self.finished = False
        self.done: trio.Event | None = None  # created for followers only


class WriteCoalescer(Generic[Request, Result]):
    """Batches :meth:`submit` calls made in the same scheduler turn into one ``write`` call.

    ``writes`` and ``requests`` count ``write`` calls and the requests they carried (their ratio is the
    mean batch size).
    """

    def __init__(self, write: Callable[[Sequence[Request]], Sequence[Result | BaseException]]) -> None:
        self._write = write
        self._pending: list[_Slot[Request, Result]] = []
        self._leading = False
        self._solo = 0  # consecutive writes that carried a single request
        self.writes = 0
        self.requests = 0

    async def submit(self, request: Request) -> Result:
        """Queue ``request`` for the next write and return its outcome (or raise its exception)."""
        slot: _Slot[Request, Result] = _Slot(request)
        self._pending.append(slot)
        if self._leading:
            done = slot.done = trio.Event()
            try:
                await done.wait()
            except BaseException:
                if not slot.finished:
                    self._pending.remove(slot)  # withdrawn: the write has not taken it
                raise
        else:
            self._leading = True
            try:
                solo = self._solo
                if solo < SOLO_WRITES or solo % PROBE_EVERY == 0:
                    await trio.lowlevel.cancel_shielded_checkpoint()
            finally:
                self._leading = False
                batch, self._pending = self._pending, []
                self._run(batch)
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _run(self, batch: list[_Slot[Request, Result]]) -> None:
        self.writes += 1
        self.requests += len(batch)
        self._solo = self._solo + 1 if len(batch) == 1 else 0
        try:
            outcomes = self._write([slot.request for slot in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"write returned {len(outcomes)} outcomes for {len(batch)} requests")
        except BaseException as exc:
            outcomes = [exc] * len(batch)
        for slot, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                slot.error = outcome
            else:
                slot.result = outcome
            slot.finished = True
            if slot.done is not None:
                slot.done.set()

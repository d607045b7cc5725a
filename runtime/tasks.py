"""Background tasks bound to a block (:func:`running`) or to a connection (:class:`TaskHost`)."""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

__all__ = ["TaskHost", "running"]


@asynccontextmanager
async def running(run: Callable[..., Awaitable[Any]]) -> AsyncIterator[None]:
    """Start ``run`` as with ``nursery.start`` (the block is entered once it has called
    ``task_status.started()``) and cancel it when the block exits; its errors propagate out of the block."""
    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()


class TaskHost:
    """The background tasks of one connection, run in a nursery that outlives it (the one its handler task
    was started in; system tasks when it has none) instead of a nursery of its own: a connection without
    tasks then costs no nursery, cancel scope or task-group state (an idle MQTT connection has none).

    Contract, as a nursery's for these tasks: :meth:`start_soon` starts a task while the owner runs;
    :meth:`cancel` cancels every task started here (and any started later); :meth:`join` waits until all
    of them ended. A task's error does not reach the host nursery (it would end every other connection):
    the first one is kept in :attr:`error` and ``on_error`` is called (the owner ends itself and re-raises
    it); cancellation from outside (the host nursery's own) propagates as usual.
    """

    __slots__ = ("_cancelled", "_done", "_nursery", "_on_error", "_scopes", "error")

    def __init__(self, nursery: trio.Nursery | None, on_error: Callable[[BaseException], None]) -> None:
        self._nursery = nursery
        self._on_error = on_error
        #: One per running task (a scope is entered once); made with the first (an idle owner has none).
        self._scopes: set[trio.CancelScope] | None = None
        self._cancelled = False
        self._done: trio.Event | None = None  # made by a join that has to wait
        self.error: BaseException | None = None

    @property
    def running(self) -> int:
        """How many tasks started here have not ended yet."""
        return len(self._scopes) if self._scopes else 0

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> trio.CancelScope:
        """Start ``fn(*args)``; returns the cancel scope it runs in (cancelling it ends that task only)."""
        scope = trio.CancelScope()
        if self._cancelled:
            scope.cancel()
        if self._scopes is None:
            self._scopes = set()
        self._scopes.add(scope)
        if self._nursery is None:  # the owner is the run's root task: system tasks, in its context
            trio.lowlevel.spawn_system_task(
                self._run, scope, fn, args, name=fn, context=contextvars.copy_context()
            )
        else:
            self._nursery.start_soon(self._run, scope, fn, args, name=fn)
        return scope

    async def _run(
        self, scope: trio.CancelScope, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> None:
        try:
            with scope:
                await fn(*args)
        except trio.Cancelled:
            raise
        except BaseException as exc:  # a bug in a task ends its owner, not the host nursery
            if self.error is None:
                self.error = exc
                self._on_error(exc)
        finally:
            assert self._scopes is not None
            self._scopes.discard(scope)
            if not self._scopes and self._done is not None:
                self._done.set()

    def cancel(self) -> None:
        """Cancel every task started here, now and later."""
        self._cancelled = True
        for scope in self._scopes or ():
            scope.cancel()

    async def join(self) -> None:
        """Wait until every task started here has ended (shielded, like a nursery's exit)."""
        with trio.CancelScope(shield=True):
            while self._scopes:
                self._done = trio.Event()
                await self._done.wait()

"""Background tasks bound to a block: :func:`running`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

__all__ = ["running"]


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

"""Long polls that end early when the server drains: :class:`Holds`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import trio

__all__ = ["Holds"]


class Holds:
    """The long polls of one connection. A handler wraps its hold in :meth:`until_drain`; when the server
    drains, the driver calls :meth:`drain` and every hold (and any started later) is cancelled at once, so
    the handler answers with what is there now (a broker answers held pulls with "no new message" as it
    shuts down) instead of keeping the client waiting through the shutdown grace."""

    def __init__(self) -> None:
        self.drained = False
        self._scopes: set[trio.CancelScope] = set()

    @contextlib.contextmanager
    def until_drain(self) -> Iterator[trio.CancelScope]:
        """A cancel scope for one hold; ``scope.cancelled_caught`` tells that the drain ended it."""
        with trio.CancelScope() as scope:
            if self.drained:
                scope.cancel()
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)

    def drain(self) -> None:
        """End every hold now and every later one at once."""
        self.drained = True
        for scope in self._scopes:
            scope.cancel()

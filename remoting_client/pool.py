"""
mqproxy.remoting_client.pool
~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Connections by address, opened on first use and re-opened after a failure with back-off.

Contracts:

* :meth:`RemotingPool.request` / :meth:`RemotingPool.oneway` use the address's live connection or open
  one (one connect attempt at a time per address; concurrent callers share it).
* After a failed connect, requests to that address fail at once with :class:`AddressUnreachable` until
  the back-off delay has passed (``backoff_initial_s``, doubling up to ``backoff_max_s``); the first
  success resets it. Callers choose another address or retry later; the pool never retries a request
  itself (a request may have been executed when its response was lost).
* With ``access_key``/``secret_key`` set, every request is signed (ACL 1.0,
  :mod:`mqproxy.codecs.remoting_acl`).
* Requests from servers go to ``on_request`` (see :class:`~.connection.RemotingConnection`).
* :func:`open_pool` runs the connections in a nursery of its own; leaving it closes them all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog
import trio

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_acl import sign
from mqproxy.remoting_client.connection import (
    RemotingClientError,
    RemotingConnection,
    ServerRequestHandler,
)

__all__ = ["AddressUnreachable", "ClientConfig", "RemotingPool", "open_pool"]

_log = structlog.get_logger("mqproxy.remoting_client")


class AddressUnreachable(RemotingClientError):
    """No connection to the address could be opened (now or within the back-off window)."""


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Timeouts, back-off and credentials of a :class:`RemotingPool`."""

    connect_timeout_s: float = 3.0
    request_timeout_s: float = 3.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    access_key: str | None = None
    secret_key: str | None = None
    security_token: str | None = None

    def __post_init__(self) -> None:
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("access_key and secret_key go together")
        if min(self.connect_timeout_s, self.request_timeout_s, self.backoff_initial_s) <= 0:
            raise ValueError("timeouts and back-off must be positive")


@dataclass(slots=True)
class _Address:
    connection: RemotingConnection | None = None
    connecting: trio.Event | None = None
    failures: int = 0
    retry_at: float = 0.0
    last_error: str = ""


def _split(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


class RemotingPool:
    """Connections by ``host:port``; build with :func:`open_pool`."""

    def __init__(
        self, nursery: trio.Nursery, config: ClientConfig, on_request: ServerRequestHandler | None = None
    ) -> None:
        self._nursery = nursery
        self.config = config
        self._on_request = on_request
        self._addresses: dict[str, _Address] = {}
        self._closed = False

    def _sign(self, command: RemotingCommand) -> None:
        cfg = self.config
        if cfg.access_key is not None and cfg.secret_key is not None:
            sign(command.ext_fields, command.body, cfg.access_key, cfg.secret_key, cfg.security_token)

    async def request(
        self, addr: str, command: RemotingCommand, *, timeout_s: float | None = None
    ) -> RemotingCommand:
        """Send ``command`` to ``addr`` and return its response (see the module contracts)."""
        connection = await self.connection(addr)
        return await connection.request(
            command, self.config.request_timeout_s if timeout_s is None else timeout_s
        )

    async def oneway(self, addr: str, command: RemotingCommand) -> None:
        connection = await self.connection(addr)
        await connection.oneway(command)

    def connected(self, addr: str) -> bool:
        state = self._addresses.get(addr)
        return bool(state and state.connection and not state.connection.closed.is_set())

    async def connection(self, addr: str) -> RemotingConnection:
        """The live connection to ``addr``, opened if needed."""
        if self._closed:
            raise AddressUnreachable(addr, "the client pool is closed")
        state = self._addresses.setdefault(addr, _Address())
        while True:
            if state.connection is not None and not state.connection.closed.is_set():
                return state.connection
            if state.connecting is not None:
                await state.connecting.wait()
                if state.connection is None or state.connection.closed.is_set():
                    raise AddressUnreachable(addr, state.last_error or "connect failed")
                continue
            now = trio.current_time()
            if state.failures and now < state.retry_at:
                raise AddressUnreachable(
                    addr, f"{state.last_error}; next attempt in {state.retry_at - now:.1f} s"
                )
            await self._connect(addr, state)

    async def _connect(self, addr: str, state: _Address) -> None:
        state.connecting = trio.Event()
        try:
            host, port = _split(addr)
            try:
                with trio.fail_after(self.config.connect_timeout_s):
                    stream = await trio.open_tcp_stream(host, port)
            except (OSError, trio.TooSlowError) as exc:
                timed_out = isinstance(exc, trio.TooSlowError)
                reason = "connect timed out" if timed_out else f"connect failed: {exc}"
                self._failed(addr, state, reason)
                raise AddressUnreachable(addr, reason) from None
            connection = RemotingConnection(stream, addr, on_request=self._on_request, hook=self._sign)
            await self._nursery.start(connection.run)
            if state.failures:
                _log.info("remoting_client.reconnected", remote=addr, failures=state.failures)
            state.connection, state.failures, state.last_error = connection, 0, ""
        finally:
            state.connecting.set()
            state.connecting = None

    def _failed(self, addr: str, state: _Address, reason: str) -> None:
        state.failures += 1
        delay = min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (state.failures - 1))
        state.retry_at = trio.current_time() + delay
        state.last_error = reason
        _log.warning(
            "remoting_client.unreachable",
            remote=addr,
            reason=reason,
            failures=state.failures,
            retry_in_s=round(delay, 3),
        )

    async def close_address(self, addr: str) -> None:
        """Close the connection to ``addr`` (the next request opens a new one)."""
        state = self._addresses.get(addr)
        if state is not None and state.connection is not None:
            await state.connection.aclose()
            state.connection = None

    async def aclose(self) -> None:
        self._closed = True
        for state in self._addresses.values():
            if state.connection is not None:
                await state.connection.aclose()


@asynccontextmanager
async def open_pool(
    config: ClientConfig | None = None, on_request: ServerRequestHandler | None = None
) -> AsyncIterator[RemotingPool]:
    """A :class:`RemotingPool` whose connections live until the block exits."""
    async with trio.open_nursery() as nursery:
        pool = RemotingPool(nursery, config or ClientConfig(), on_request)
        try:
            yield pool
        finally:
            await pool.aclose()
            nursery.cancel_scope.cancel()

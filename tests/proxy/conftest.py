"""Fixtures for the I/O layer: an in-process server on 127.0.0.1:0 and loopback helpers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from mqproxy.server import ServerHandle, serve
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]


@asynccontextmanager
async def running_server(settings: Settings) -> AsyncIterator[ServerHandle]:
    """Start :func:`serve` in a nursery, yield its handle, stop it gracefully on exit."""
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(
            lambda task_status: serve(settings, install_signal_handlers=False, task_status=task_status)
        )
        try:
            yield handle
        finally:
            handle.stop("test")


@pytest.fixture
async def server(log_sink: Any) -> AsyncIterator[ServerHandle]:
    async with running_server(Settings.for_tests()) as handle:
        yield handle


@pytest.fixture
def wait_for() -> Any:
    """Poll ``predicate()`` until true (log events written by other tasks): the shared ``wait_until``."""
    return wait_until


@pytest.fixture
def start_server() -> Any:
    """``async with start_server(settings) as handle`` runs a server with custom settings."""
    return running_server


async def keep_alive_healthz(stream: trio.abc.Stream) -> bytes:
    """``GET /healthz`` on an open HTTP/1.1 ``stream``; the answer up to its JSON body's end."""
    await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = bytearray()
    with trio.fail_after(10):
        while not reply.endswith(b"}"):
            reply += await stream.receive_some(65536)
    return bytes(reply)

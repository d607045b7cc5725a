from __future__ import annotations

import errno
import socket

import pytest
import trio

from mqproxy.accepting import ACCEPT_BATCH, Acceptor, Addresses
from tests.conftest import EventSink, wait_until


class _ScriptedAccept:
    """The listener's socket, whose first ``accept`` calls raise ``errors`` in turn."""

    def __init__(self, raw: socket.socket, errors: list[int]) -> None:
        self.raw = raw
        self.errors = errors

    def fileno(self) -> int:
        return self.raw.fileno()

    def accept(self) -> tuple[socket.socket, object]:
        if self.errors:
            code = self.errors.pop(0)
            raise OSError(code, "scripted")
        return self.raw.accept()


async def test_every_backlogged_connection_is_handled_with_its_addresses() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    acceptor = Acceptor(listener)
    assert acceptor.local is not None
    seen: list[tuple[bytes, Addresses]] = []

    async def handler(stream: trio.SocketStream, tag: str, addresses: Addresses) -> None:
        assert tag == "tag"
        seen.append((await stream.receive_some(100), addresses))
        await stream.aclose()

    count = ACCEPT_BATCH * 2 + 3  # more than one batch
    clients = []
    for i in range(count):  # all waiting in the backlog before the loop starts
        client = await trio.open_tcp_stream("127.0.0.1", acceptor.local[1])
        await client.send_all(b"%d" % i)
        clients.append(client)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(acceptor.run, nursery, handler, "tag")
        await wait_until(lambda: len(seen) == count)
        nursery.cancel_scope.cancel()
    await acceptor.aclose()
    names = {}
    for i, client in enumerate(clients):
        name = client.socket.getsockname()
        names[b"%d" % i] = ((name[0], name[1]), acceptor.local)
        await client.aclose()
    assert dict(seen) == names  # the peer is the client's own address, the local one the listener's


async def test_without_a_listener_address_each_socket_is_asked_its_local_address() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    acceptor = Acceptor(listener)
    acceptor.local = None  # as for a wildcard listener (tests bind 127.0.0.1 only)
    got: list[Addresses] = []

    async def handler(stream: trio.SocketStream, addresses: Addresses) -> None:
        got.append(addresses)
        await stream.aclose()

    port = acceptor.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(acceptor.run, nursery, handler)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await wait_until(lambda: len(got) == 1)
        nursery.cancel_scope.cancel()
    await acceptor.aclose()
    assert got[0][1] == ("127.0.0.1", port)
    await client.aclose()


async def test_a_vanished_connection_is_skipped_and_exhaustion_is_logged_and_retried(
    log_sink: EventSink,
) -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    acceptor = Acceptor(listener)
    assert acceptor.local is not None
    script = _ScriptedAccept(acceptor._raw, [errno.ECONNABORTED, errno.EMFILE])
    acceptor._raw = script  # type: ignore[assignment]
    got: list[Addresses] = []

    async def handler(stream: trio.SocketStream, addresses: Addresses) -> None:
        got.append(addresses)
        await stream.aclose()

    client = await trio.open_tcp_stream("127.0.0.1", acceptor.local[1])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(acceptor.run, nursery, handler)
        await wait_until(lambda: len(got) == 1)
        nursery.cancel_scope.cancel()
    await acceptor.aclose()
    await client.aclose()
    assert script.errors == []
    failed = log_sink.named("proxy.accept_failed")
    assert len(failed) == 1  # EMFILE only: ECONNABORTED is skipped
    assert "retrying" in failed[0]["detail"]


async def test_any_other_accept_error_ends_the_loop() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    acceptor = Acceptor(listener)
    assert acceptor.local is not None
    acceptor._raw = _ScriptedAccept(acceptor._raw, [errno.EBADF])  # type: ignore[assignment]
    client = await trio.open_tcp_stream("127.0.0.1", acceptor.local[1])

    async def never(stream: trio.SocketStream, addresses: Addresses) -> None:
        raise AssertionError("no connection is handled")

    with pytest.raises(ExceptionGroup) as raised:  # the nursery's
        async with trio.open_nursery() as nursery:
            await acceptor.run(nursery, never)
    (error,) = raised.value.exceptions
    assert isinstance(error, OSError)
    assert error.errno == errno.EBADF
    await acceptor.aclose()
    await client.aclose()

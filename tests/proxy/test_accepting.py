from __future__ import annotations

import trio

from mqproxy.accepting import ACCEPT_BATCH, Acceptor, Addresses
from tests.conftest import wait_until


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

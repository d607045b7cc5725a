"""An unreachable cluster: ``connector.error`` with back-off, then recovery, still exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import trio

from ..conftest import serve_proxy, wait_proxy_started, wait_until  # type: ignore[import-not-found]
from .conftest import Node, config, produce, read_all, rules_text, running


async def test_target_down_then_back_is_retried_and_copied_once(
    node_factory: Any, tmp_path: Path, log_sink: Any
) -> None:
    a: Node = node_factory("a")
    b: Node = node_factory("b")
    await produce(a.addr, "F", 20)
    rules = '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "F"\nstart = "earliest"\n'
    async with running(config(rules_text(a.addr, b.addr, rules))):

        async def first() -> bool:
            return len(await read_all(b.addr, "F")) >= 20

        await wait_until(first)
        b.proc.kill()
        b.proc.wait()
        await produce(a.addr, "F", 20, start=20)
        await wait_until(lambda: any(e["cluster"] == "b" for e in log_sink.named("connector.error")))
        log = tmp_path / "b2.log"
        with log.open("wb") as out:
            again = serve_proxy(tmp_path / "b", "--log-format", "json", "--listen", b.addr, stdout=out)
        try:
            wait_proxy_started(again, log)

            async def rest() -> bool:
                return len(await read_all(b.addr, "F")) >= 40

            await wait_until(rest, 60)
            seqs = Counter(m.properties["seq"] for m in await read_all(b.addr, "F"))
        finally:
            again.kill()
            again.wait()
            if again.stderr:
                again.stderr.close()
    error = next(e for e in log_sink.named("connector.error") if e["cluster"] == "b")
    assert error["retry_in_s"] > 0
    assert error["op"] in ("send", "recover", "rebalance", "pull")
    assert seqs == Counter(str(n) for n in range(40))


class Relay:
    """A TCP relay in front of a node. While ``armed``, the first send request (SEND_MESSAGE_V2 or
    SEND_BATCH_MESSAGE) to pass makes it drop the next answer and close that connection: the node stored
    the message, the connector gets no response (an unknown outcome)."""

    def __init__(self) -> None:
        self.target = ""
        self.armed = False
        self.cuts = 0
        self._cut_next = False

    async def serve(self, task_status: Any) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(f"127.0.0.1:{listeners[0].socket.getsockname()[1]}")
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        host, port = self.target.rsplit(":", 1)
        server = await trio.open_tcp_stream(host, int(port))
        async with trio.open_nursery() as nursery:

            async def up() -> None:
                while data := await client.receive_some(65536):
                    if self.armed and (b'"code":310,' in data or b'"code":320,' in data):
                        self.armed, self._cut_next = False, True
                    await server.send_all(data)
                nursery.cancel_scope.cancel()

            async def down() -> None:
                while data := await server.receive_some(65536):
                    if self._cut_next:
                        self._cut_next = False
                        self.cuts += 1
                        nursery.cancel_scope.cancel()
                        return
                    await client.send_all(data)
                nursery.cancel_scope.cancel()

            nursery.start_soon(up)
            nursery.start_soon(down)
        await trio.aclose_forcefully(client)
        await trio.aclose_forcefully(server)


async def test_lost_send_answers_are_recovered_from_the_tail_without_duplicates(
    node_factory: Any, log_sink: Any
) -> None:
    relay = Relay()
    async with trio.open_nursery() as nursery:
        front = await nursery.start(relay.serve)
        a: Node = node_factory("a")
        b: Node = node_factory("b", env={"MQPROXY_SERVER_ADVERTISED_ADDRESS": front})
        relay.target = b.addr
        await produce(a.addr, "U", 200)
        rules = '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "U"\nstart = "earliest"\n'
        text = rules_text(a.addr, front, rules, connector="batch_messages = 4")
        async with running(config(text)):

            def copied() -> int:
                return sum(e["messages"] for e in log_sink.named("connector.batch"))

            def unknown_sends() -> int:
                return sum(1 for e in log_sink.named("connector.error") if e["op"] == "send")

            for cut in (1, 2):  # two lost answers, at 40 and 120 copied messages
                await wait_until(lambda n=cut: copied() >= 40 * (2 * n - 1))  # type: ignore[misc]
                relay.armed = True
                await wait_until(lambda n=cut: relay.cuts >= n)

            async def done() -> bool:
                return len(await read_all(b.addr, "U")) >= 200 and copied() >= 200

            await wait_until(done, 60)
        seqs = Counter(m.properties["seq"] for m in await read_all(b.addr, "U"))  # routes name the relay
        nursery.cancel_scope.cancel()
    assert unknown_sends() >= 2
    assert seqs == Counter(str(n) for n in range(200))

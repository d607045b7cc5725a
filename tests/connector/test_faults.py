"""An unreachable cluster: ``connector.error`` with back-off, then recovery, still exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

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

"""The connector between an mqproxy node and a stock Apache RocketMQ 5.3 cluster, both ways (e2e tier:
``export MQTEST_CACHE=...`` where ``scripts/stock_rocketmq.py fetch`` put the jars)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import running_stock_cluster, wait_until  # type: ignore[import-not-found]
from .conftest import Node, config, produce, read_all, running

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import stock_rocketmq

pytestmark = pytest.mark.e2e


@pytest.fixture
def stock(tmp_path: Path) -> Iterator[stock_rocketmq.StockCluster]:
    yield from running_stock_cluster(tmp_path / "stock", brokers=1)


async def test_mqproxy_to_stock_and_back_exactly_once(
    node_factory: Any, stock: stock_rocketmq.StockCluster, log_sink: Any
) -> None:
    node: Node = node_factory("a")
    namesrv = stock.namesrv_addr
    await produce(node.addr, "ToStock", 50, props={"k": "1"})
    await produce(namesrv, "FromStock", 30, tag="y")
    text = (
        f'[connector]\nname = "x"\nrefresh_s = 0.5\n'
        f'[clusters.edge]\nnamesrv = "{node.addr}"\n[clusters.central]\nnamesrv = "{namesrv}"\n'
        '[[rules]]\nsource = "edge"\ntarget = "central"\ntopic = "ToStock"\nstart = "earliest"\n'
        '[[rules]]\nsource = "central"\ntarget = "edge"\ntopic = "re:FromStock|ToStock"\nstart = "earliest"\n'
    )
    async with running(config(text)):

        async def copied() -> bool:
            return (
                len(await read_all(namesrv, "ToStock")) >= 50
                and len(await read_all(node.addr, "FromStock")) >= 30
            )

        await wait_until(copied, 120)
        await produce(namesrv, "FromStock", 10, tag="y", start=30)

        async def more() -> bool:
            return len(await read_all(node.addr, "FromStock")) >= 40

        await wait_until(more, 60)
        marker = len(log_sink.lines)
        await wait_until(
            lambda: len([e for e in log_sink.events[marker:] if e["event"] == "connector.lag"]) >= 8
        )
    on_stock = await read_all(namesrv, "ToStock")
    assert Counter(m.properties["seq"] for m in on_stock) == Counter(str(n) for n in range(50))
    assert all(m.properties["k"] == "1" and m.properties["CONNECTOR_PATH"] == node.addr for m in on_stock)
    back = await read_all(node.addr, "FromStock")
    assert Counter(m.properties["seq"] for m in back) == Counter(str(n) for n in range(40))
    # the copies on the stock cluster came from the node: never copied back there
    assert Counter(m.properties["seq"] for m in await read_all(node.addr, "ToStock")) == Counter(
        str(n) for n in range(50)
    )

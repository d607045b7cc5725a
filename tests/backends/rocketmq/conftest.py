"""A stock Apache RocketMQ cluster (name server + two brokers) for the cluster backend's tests, and a way to
open mqproxy nodes' broker facades on it in the test's trio run."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from mqproxy.backends.rocketmq import ClusterConfig, RocketMQBroker, open_rocketmq_broker

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts"))
import stock_rocketmq  # noqa: E402

from ...conftest import running_stock_cluster  # type: ignore[import-not-found]  # noqa: E402

#: Check-backs within seconds; no SYSTEM_BUSY on a loaded 2-core machine.
BROKER_CONF = {
    "transactionCheckInterval": "1000",
    "transactionTimeOut": "1000",
    "waitTimeMillsInSendQueue": "3000",
}


@dataclass(frozen=True)
class Tunables:
    delay_levels: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    max_reconsume_times: int = 16


running_cluster = running_stock_cluster


@pytest.fixture(scope="module")
def stock2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stock_rocketmq.StockCluster]:
    yield from running_cluster(
        tmp_path_factory.mktemp("stock2"), brokers=2, cluster_name="FacadeTest", broker_conf=BROKER_CONF
    )


@asynccontextmanager
async def open_node(namesrv: str, port: int, **overrides: object) -> AsyncIterator[RocketMQBroker]:
    """One mqproxy node's broker facade (``port`` only names it: message ids carry it)."""
    config = ClusterConfig(namesrv=tuple(namesrv.split(";")), refresh_s=1.0, **overrides)  # type: ignore[arg-type]
    async with open_rocketmq_broker(config, advertised=("127.0.0.1", port), service=Tunables()) as broker:
        yield broker

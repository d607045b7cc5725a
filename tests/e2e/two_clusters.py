"""What the several-clusters tests share: two stock Apache RocketMQ 5.3 clusters of one broker each (their
own name servers), one mqproxy node in front of both, and what each cluster's broker itself says about a
group (members, committed offsets).

The node's routing sends ``east_*`` topics to cluster ``east`` and ``west_<hex>`` topics to ``west``;
:func:`node_config` adds a ``routing.default`` when asked. ``test_several_clusters.py`` starts one pair for
all its tests (module scope) and stops it at its end.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from remoting_wire import remoting_exchange  # type: ignore[import-not-found]

from ..conftest import running_stock_cluster  # type: ignore[import-not-found]
from .conftest import STOCK_BROKER_CONF, stock_rocketmq
from .harness import ProxyProcess

QUERY_CONSUMER_OFFSET = 14
GET_CONSUMER_LIST_BY_GROUP = 38
NAMES = ("east", "west")
#: The routing rules as the node describes them in errors and events (no default).
DESCRIBED = "prefix:east_ -> east, re:^west_[0-9a-f]+$ -> west; no routing.default"

CONFIG = """
[backends.east]
kind = "rocketmq"
namesrv = "{east}"
refresh_s = 1.0

[backends.west]
kind = "rocketmq"
namesrv = "{west}"
refresh_s = 1.0

[[routing.rules]]
match = "prefix:east_"
backend = "east"

[[routing.rules]]
match = "re:^west_[0-9a-f]+$"
backend = "west"
"""


def other(name: str) -> str:
    """The other cluster's name."""
    return "west" if name == "east" else "east"


@contextlib.contextmanager
def two_clusters(factory: pytest.TempPathFactory) -> Iterator[dict[str, stock_rocketmq.StockCluster]]:
    """Clusters ``east`` and ``west``, started one after the other, stopped on exit."""
    with contextlib.ExitStack() as stack:
        out: dict[str, stock_rocketmq.StockCluster] = {}
        for name in NAMES:
            run = running_stock_cluster(
                factory.mktemp(f"stock-{name}"), brokers=1, broker_conf=STOCK_BROKER_CONF
            )
            out[name] = next(run)
            stack.callback(next, run, None)  # resumes the helper past its yield: stops that cluster
        yield out


def node_config(clusters: dict[str, stock_rocketmq.StockCluster], default: str = "") -> str:
    """The node's settings file: both backends, the rules, and ``routing.default`` when given."""
    text = CONFIG.format(east=clusters["east"].namesrv_addr, west=clusters["west"].namesrv_addr)
    return text + (f'\n[routing]\ndefault = "{default}"\n' if default else "")


@contextlib.contextmanager
def routing_node(
    clusters: dict[str, stock_rocketmq.StockCluster], proxy_bin: str, base: Path, default: str = ""
) -> Iterator[ProxyProcess]:
    """One mqproxy node in front of both clusters; it must exit 0 on SIGTERM."""
    (base / "data").mkdir()
    config = base / "mqproxy.toml"
    config.write_text(node_config(clusters, default))
    proc = ProxyProcess(proxy_bin, base / "data", base, args=("--config", str(config)))
    proc.start()
    yield proc
    if proc.proc is not None:
        rc = proc.stop()
        assert rc == 0, f"node exited with {rc} on SIGTERM:\n{proc.diagnostics()}"


def broker(cluster: stock_rocketmq.StockCluster) -> str:
    """The address of the cluster's one broker."""
    return str(cluster.broker_list[0].addr)


def consumer_ids(broker_addr: str, group: str) -> list[str]:
    """The members of ``group`` the broker knows."""
    reply, body = remoting_exchange(broker_addr, GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    if reply["code"] != 0 or not body:
        return []
    return list(json.loads(body).get("consumerIdList") or [])


def committed(broker_addr: str, group: str, topic: str, queues: int) -> list[int]:
    """The offsets the broker holds for ``group`` on each of ``topic``'s queues (-1: none)."""
    out = []
    for queue in range(queues):
        reply, _ = remoting_exchange(
            broker_addr,
            QUERY_CONSUMER_OFFSET,
            {"consumerGroup": group, "topic": topic, "queueId": str(queue)},
        )
        ext = reply.get("extFields") or {}
        assert isinstance(ext, dict)
        out.append(int(ext["offset"]) if reply["code"] == 0 else -1)
    return out

"""The publisher remembers dispatch targets while the wildcard filters stay the same."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from mqproxy.mqtt.mapping import RETAINED_LMQ, lmq_name
from mqproxy.mqtt.publishing import MAX_CACHED_TARGETS, Publisher
from mqproxy.mqtt.subscriptions import SubscriptionIndex


def _publisher(cluster: Any = None) -> tuple[Publisher, Any]:
    gateway = SimpleNamespace(index=SubscriptionIndex(), cluster=cluster)
    return Publisher(gateway), gateway  # type: ignore[arg-type]


def test_targets_follow_subscribes_and_unsubscribes() -> None:
    publisher, gateway = _publisher()
    assert publisher.dispatch_targets("a/b", False) == (lmq_name("a/b"),)
    gateway.index.add("a/+")
    assert publisher.dispatch_targets("a/b", False) == (lmq_name("a/b"), lmq_name("a/+"))
    assert publisher.dispatch_targets("a/b", True) == (lmq_name("a/b"), lmq_name("a/+"), RETAINED_LMQ)
    gateway.index.add("#")
    assert set(publisher.dispatch_targets("a/b", False)) == {lmq_name(f) for f in ("a/b", "a/+", "#")}
    gateway.index.remove("a/+")
    gateway.index.remove("#")
    assert publisher.dispatch_targets("a/b", False) == (lmq_name("a/b"),)
    gateway.index = SubscriptionIndex()  # replaced (a failed load): its version starts again
    gateway.index.add("a/#")
    assert publisher.dispatch_targets("a/b", False) == (lmq_name("a/b"), lmq_name("a/#"))


def test_targets_follow_the_other_nodes_filters_in_cluster_mode() -> None:
    filters = SubscriptionIndex()
    cluster = SimpleNamespace(filters=filters, match=filters.match)
    publisher, gateway = _publisher(cluster)
    gateway.index.add("x/+")
    assert publisher.dispatch_targets("x/y", False) == (lmq_name("x/y"), lmq_name("x/+"))
    filters.add("x/+")  # also held elsewhere: listed once
    filters.add("x/#")
    assert publisher.dispatch_targets("x/y", False) == (lmq_name("x/y"), lmq_name("x/+"), lmq_name("x/#"))


def test_the_remembered_targets_are_bounded() -> None:
    publisher, _ = _publisher()
    for n in range(MAX_CACHED_TARGETS + 10):
        assert publisher.dispatch_targets(f"t/{n}", False) == (lmq_name(f"t/{n}"),)
    assert len(publisher._targets) <= MAX_CACHED_TARGETS

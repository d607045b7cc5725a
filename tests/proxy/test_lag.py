"""Consumer-lag series (:mod:`mqproxy.lag`, :mod:`mqproxy.lag_sources`): mqadmin's figures, bounded."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.facade.api import SendRequest
from mqproxy.lag import LMQ_TOPIC, LagCollector, QueueProgress, lag_events, summarize
from mqproxy.lag_sources import LagRefresher, log_lag_readings, read_progress
from mqproxy.model.types import Message
from mqproxy.settings import MetricsSettings


def q(group: str, topic: str, queue: int, broker_offset: int, consumer_offset: int) -> QueueProgress:
    return QueueProgress(group, topic, "broker-a", queue, broker_offset, consumer_offset)


def exposition(view: Any) -> str:
    registry = CollectorRegistry()
    collector = LagCollector()
    collector.view = view
    registry.register(collector)
    return generate_latest(registry).decode()


def test_lag_is_mqadmins_diff_per_queue_with_sums() -> None:
    view = summarize([q("G", "T", 0, 5, 3), q("G", "T", 1, 4, 4), q("G", "U", 0, 2, 0), q("H", "T", 0, 5, 5)],
                     100, updated_unix_s=1700000000.0)
    assert [(x.topic, x.queue_id, x.lag) for x in view.queues if x.group == "G"] == [("T", 0, 2), ("T", 1, 0),
                                                                                     ("U", 0, 2)]
    assert {k: v.lag for k, v in view.pairs.items()} == {("G", "T"): 2, ("G", "U"): 2, ("H", "T"): 0}
    assert view.group_totals() == {"G": 4, "H": 0}
    text = exposition(view)
    labels = '{broker="broker-a",group="G",queue="0",topic="T"}'
    assert f"mqproxy_consumer_queue_lag_messages{labels} 2.0" in text
    assert f"mqproxy_consumer_queue_broker_offset{labels} 5.0" in text
    assert f"mqproxy_consumer_queue_consumer_offset{labels} 3.0" in text
    assert 'mqproxy_consumer_lag_messages{group="G",topic="U"} 2.0' in text
    assert 'mqproxy_consumer_group_lag_messages{group="G"} 4.0' in text
    assert "mqproxy_consumer_lag_capped_pairs 0.0" in text
    assert "mqproxy_consumer_lag_updated_seconds 1.7e+09" in text


def test_negative_offsets_read_zero_as_the_broker_reports_them() -> None:
    (only,) = summarize([q("G", "T", 0, -1, -1)], 10).queues
    assert (only.broker_offset, only.consumer_offset, only.lag) == (0, 0, 0)


def test_lmq_queues_are_summed_per_group_never_one_series_each() -> None:
    lmqs = [q("mqtt-s1", f"%LMQ%dev%2F{i}", 0, 10, 7) for i in range(500)]
    view = summarize([*lmqs, q("mqtt-s1", "T", 0, 1, 0)], 10_000)
    assert [(x.topic, x.queue_id) for x in view.queues] == [("T", 0)]
    assert view.pairs[("mqtt-s1", LMQ_TOPIC)].lag == 1500
    assert view.pairs[("mqtt-s1", LMQ_TOPIC)].queues == 500
    assert view.group_totals() == {"mqtt-s1": 1501}
    assert "%LMQ%dev" not in exposition(view)


def test_past_the_cap_whole_pairs_become_sums() -> None:
    readings = [q(f"G{g}", "T", i, 10, 4) for g in range(5) for i in range(4)]  # 5 pairs x 4 queues
    view = summarize(readings, 10)
    assert len(view.queues) == 8  # two whole pairs fit, never a partial pair
    assert {x.group for x in view.queues} == {"G0", "G1"}
    assert view.capped_pairs == 3
    assert all(pair.lag == 24 for pair in view.pairs.values())  # every pair keeps its sum
    assert summarize(readings, 0).queues == ()
    text = exposition(view)
    assert 'mqproxy_consumer_lag_messages{group="G4",topic="T"} 24.0' in text
    assert "mqproxy_consumer_lag_capped_pairs 3.0" in text


async def test_facade_reading_matches_consume_stats_rules(broker: Any) -> None:
    for i in range(5):
        await broker.send(SendRequest(Message(topic="LagT", body=b"x", queue_id=i % 2), create_queues=2))
    await broker.commit_consumer_offset("LagG", "LagT", 0, 2)  # queue 0 holds 3: lag 1; queue 1 none: lag 2
    rows = sorted((r.group, r.topic, r.broker, r.queue_id, r.broker_offset, r.consumer_offset)
                  for r in await read_progress(broker))
    assert rows == [("LagG", "LagT", "broker-a", 0, 3, 2), ("LagG", "LagT", "broker-a", 1, 2, 0)]


async def test_refresher_reuses_a_reading_for_lag_refresh_s(broker: Any, autojump_clock: Any) -> None:
    await broker.send(SendRequest(Message(topic="RT", body=b"x", queue_id=0), create_queues=1))
    await broker.commit_consumer_offset("RG", "RT", 0, 0)
    refresher = LagRefresher(LagCollector(), MetricsSettings(max_lag_series=10, lag_refresh_s=5.0))
    await refresher.refresh(broker)
    assert refresher.collector.view.pairs[("RG", "RT")].lag == 1
    await broker.commit_consumer_offset("RG", "RT", 0, 1)
    await refresher.refresh(broker)
    assert refresher.collector.view.pairs[("RG", "RT")].lag == 1  # still the cached reading
    await trio.sleep(5.0)
    await refresher.refresh(broker)
    assert refresher.collector.view.pairs[("RG", "RT")].lag == 0


async def test_capping_is_logged_once(broker: Any, log_sink: Any) -> None:
    for topic in ("CA", "CB"):
        await broker.send(SendRequest(Message(topic=topic, body=b"x", queue_id=0), create_queues=1))
        await broker.commit_consumer_offset("CG", topic, 0, 0)
    refresher = LagRefresher(LagCollector(), MetricsSettings(max_lag_series=1, lag_refresh_s=0.0))
    await refresher.refresh(broker)
    await refresher.refresh(broker)
    (capped,) = log_sink.named("metrics.lag_capped")
    assert (capped["capped_pairs"], capped["lag_series"], capped["max_lag_series"]) == (1, 1, 1)


def test_lag_events_one_per_pair_largest_first_bounded() -> None:
    view = summarize([q("G", "T", 0, 5, 3), q("G", "T", 1, 4, 4), q("H", "U", 0, 9, 0), q("K", "T", 0, 1, 1)],
                     100, updated_unix_s=1700000000.25)  # fmt: skip
    events = lag_events(view, 2)
    assert [(e["group"], e["topic"], e["lag"]) for e in events] == [("H", "U", 9), ("G", "T", 2)]
    assert events[1] == {"group": "G", "topic": "T", "queues": 2, "broker_offset": 9, "consumer_offset": 7,
                         "lag": 2, "reading_ms": 1700000000250}  # fmt: skip
    assert lag_events(summarize([], 100), 10) == []  # no reading yet


async def test_periodic_readings_are_logged_once_each(
    broker: Any, log_sink: Any, autojump_clock: Any
) -> None:
    await broker.send(SendRequest(Message(topic="PT", body=b"x", queue_id=0), create_queues=1))
    await broker.commit_consumer_offset("PG", "PT", 0, 0)
    refresher = LagRefresher(LagCollector(), MetricsSettings(max_lag_series=10, lag_refresh_s=30.0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log_lag_readings, refresher, broker, 10.0)
        await trio.sleep(25.0)  # readings due at 10 s and 20 s: one reading (reused for 30 s), one log
        logged = [(e["group"], e["topic"], e["lag"]) for e in log_sink.named("metrics.lag")]
        assert logged == [("PG", "PT", 1)]
        await broker.commit_consumer_offset("PG", "PT", 0, 1)
        await trio.sleep(20.0)  # at 40 s a new reading
        nursery.cancel_scope.cancel()
    lags = [e["lag"] for e in log_sink.named("metrics.lag")]
    assert lags == [1, 0]


@pytest.fixture
async def broker() -> Any:
    from mqproxy.backend_setup import service_settings
    from mqproxy.backends.embedded.broker import open_embedded_broker
    from mqproxy.settings import BrokerSettings

    store = InMemoryBackend(default_queue_count=4, auto_create_topics=True)
    async with open_embedded_broker(store, service_settings(BrokerSettings())) as opened:
        yield opened

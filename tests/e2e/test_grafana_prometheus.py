"""The Grafana dashboard's PromQL against a stock Prometheus (3.16, built from its Go module into the cache
folder) that scrapes a live ``mqproxy serve`` and ``mqproxy connect --metrics`` every second, after MQTT,
remoting and connector traffic (``scripts/dashboard_rig.py``): every panel target of
``config/grafana/mqproxy.json`` parses and evaluates through ``/api/v1/query_range``, the panels whose
metrics the traffic moved return series, a few return the figures the traffic implies, and every template
variable lists values. ``tests/config/test_grafana_dashboard.py`` checks only metric names; this checks the
queries.

Variables are substituted as Grafana does (``scripts/grafana_panels.py``): the data source's scrape interval
set to Prometheus's (1 s), a panel :data:`MAX_POINTS` pixels wide, so ``$__interval`` and the step are 1 s
and ``$__rate_interval`` is ``max(1 s + 1 s, 4 * 1 s)`` = 4 s; ``$instance``/``$group``/``$rule`` are "All"
(their ``allValue``, ``.*``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dashboard_rig  # scripts/ is on sys.path (tests/e2e/conftest.py)
import grafana_panels
import pytest
from prometheus_server import PrometheusError

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]  # a first run builds Prometheus

SCRAPE_S = 1.0
MAX_POINTS = 1000
LAG_PER_QUEUE = 2
#: Panel targets this set-up leaves without series, and why; every other target must return series.
NOT_EXERCISED = {
    (14, "A"): "no ACL file is set, so nothing is refused by access control",
    (30, "A"): "the connector meets no error",
    (30, "B"): "the connector dead-letters nothing",
}


@dataclass
class Run:
    rig: dashboard_rig.Rig
    start: float
    end: float
    dashboard: dict[str, Any]

    def query(self, target: grafana_panels.Target) -> dict[str, Any]:
        """What Grafana asks for ``target``: a range query, or an instant one at the range's end."""
        step = grafana_panels.interval_s(self.end - self.start, MAX_POINTS, SCRAPE_S)
        start, end = self.start // step * step, self.end // step * step  # Grafana aligns to the step
        if target.instant:
            return self.rig.prometheus.api("query", query=self.grafana(target.expr), time=end)
        return self.rig.prometheus.query_range(self.grafana(target.expr), start, end, step)

    def grafana(self, expr: str) -> str:
        interval = grafana_panels.interval_s(self.end - self.start, MAX_POINTS, SCRAPE_S)
        return grafana_panels.substitute(
            expr, interval=interval, scrape_interval_s=SCRAPE_S,
            values={"instance": None, "group": None, "rule": None},
            known=grafana_panels.variables(self.dashboard),
        )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir: Path = tmp_path_factory.mktemp("dashboard")
    try:
        with dashboard_rig.running_rig(workdir, scrape_interval_s=SCRAPE_S) as rig:
            start = time.time()
            rig.traffic(lag_per_queue=LAG_PER_QUEUE)
            rig.wait_scraped(time.time())  # a second round after a scrape: the counters move between samples
            rig.traffic(lag_per_queue=LAG_PER_QUEUE)

            def copied() -> bool:  # the connector has copied both rounds and checkpointed, as Prometheus saw
                def total(metric: str) -> float:
                    result = rig.prometheus.api("query", query=f"sum({metric})")["data"]["result"]
                    return float(result[0]["value"][1]) if result else 0.0

                return (total("mqproxy_connector_messages_total") >= rig.sent_remoting
                        and total("mqproxy_connector_checkpoints_total") > 0)

            dashboard_rig.wait_for(copied, "the connector's copies on Prometheus")
            # two scrapes more: the range's last step (the end rounded down) sees a counter born just now
            rig.wait_scraped(time.time() + 2 * SCRAPE_S)
            yield Run(rig, start, time.time(), grafana_panels.load())
    except PrometheusError as exc:
        pytest.fail(f"Prometheus: {exc}", pytrace=False)


def _series(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return list(answer["data"]["result"])


def _last(series: dict[str, Any]) -> float:
    return float(series["values"][-1][1] if "values" in series else series["value"][1])


Pick = Callable[[dict[str, Any]], float]


def _peak(series: dict[str, Any]) -> float:
    """The largest value of a range (NaN where every value is NaN, as a quantile of no requests)."""
    values = [float(v) for _, v in series.get("values", [series.get("value")])]
    numbers = [v for v in values if not math.isnan(v)]
    return max(numbers) if numbers else math.nan


def test_every_panel_query_evaluates_and_exercised_panels_have_series(run: Run) -> None:
    failures = []
    checked = 0
    for panel in grafana_panels.panels(run.dashboard):
        for target in panel.targets:
            answer = run.query(target)
            checked += 1
            where = f"panel {panel.id} {panel.title!r} {target.ref_id}: {run.grafana(target.expr)}"
            if answer.get("status") != "success":
                failures.append(f"{where}: {answer.get('errorType')}: {answer.get('error')}")
            elif not _series(answer) and (panel.id, target.ref_id) not in NOT_EXERCISED:
                failures.append(f"{where}: no series")
    assert checked == 32  # every target of the 31 panels (24 graphs and tables, 7 rows)
    assert not failures, "\n".join(failures)


def test_panels_show_what_the_traffic_did(run: Run) -> None:
    panels = {p.title: p for p in grafana_panels.panels(run.dashboard)}

    def query(title: str, ref: str = "A", pick: Pick = _last) -> dict[str, float]:
        """Legend → value (the last, or ``pick`` of the range) of a panel target's series."""
        panel = panels[title]
        target = next(t for t in panel.targets if t.ref_id == ref)
        found = _series(run.query(target))
        return {grafana_panels.legend(target.legend, s["metric"]): pick(s) for s in found}

    assert query("Open connections by protocol")["mqtt"] == 2  # the subscriber and the publisher
    assert query("Lag by group (mqadmin Consume Diff Total)")[dashboard_rig.GROUP] == (
        dashboard_rig.QUEUES * LAG_PER_QUEUE)
    progress = query("Per-queue progress (as mqadmin consumerProgress)", "C")
    assert set(progress.values()) == {LAG_PER_QUEUE}
    assert query("Lag by group and topic (top 20)")[f"{dashboard_rig.GROUP} {dashboard_rig.TOPIC}"] == (
        dashboard_rig.QUEUES * LAG_PER_QUEUE)
    requests = query("Requests by protocol and operation", pick=_peak)
    assert any(k.startswith("mqtt ") and v > 0 for k, v in requests.items()), requests
    assert any(k.startswith("remoting ") and v > 0 for k, v in requests.items()), requests
    failed = query("Failed requests by protocol and operation", pick=_peak)
    assert any(k.startswith("remoting ") and v > 0 for k, v in failed.items()), failed  # the unsupported one
    ratio = query("Error ratio by protocol", pick=_peak)
    assert ratio["mqtt"] == 0, ratio  # a protocol without errors shows 0, not nothing
    assert 0 < ratio["remoting"] < 1, ratio
    assert max(query("Rejected before a protocol was chosen", pick=_peak).values()) > 0
    assert max(query("Copied by rule", pick=_peak).values()) > 0
    received = query("Bytes by protocol", pick=_peak)
    assert received["in mqtt"] > 0, received  # the MQTT clients stay connected: counted per scrape
    assert query("MQTT sessions", "B")["subscriptions"] == 1
    assert query("Store size")["store"] > 0
    assert query("Connector lag by rule")["orders"] == 0
    p99 = query("Request latency p99 by protocol and operation", pick=_peak)
    assert any(0 < v <= 30 for v in p99.values()), p99


def test_variables_list_values(run: Run) -> None:
    found = {}
    for variable in grafana_panels.variables(run.dashboard):
        if not variable.query:
            continue
        parsed = grafana_panels.label_values(variable.query)
        assert parsed is not None, variable
        metric, label = parsed
        answer = run.rig.prometheus.api(f"label/{label}/values", **{"match[]": metric})
        assert answer["status"] == "success", answer
        found[variable.name] = set(answer["data"])
    assert run.rig.address in found["instance"]
    assert dashboard_rig.GROUP in found["group"]
    assert found["rule"] == {"orders"}

"""Grafana's side of the dashboard test (scripts/grafana_panels.py): variables substituted as Grafana does,
its interval rounding, legends, ``label_values``, and the panels of the real dashboard; and the Prometheus
config the runner writes (scripts/prometheus_server.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import grafana_panels  # noqa: E402
import prometheus_server  # noqa: E402

KNOWN = [grafana_panels.Variable("instance", "label_values(up, instance)", ".*"),
         grafana_panels.Variable("group", "label_values(g, group)", None)]


def test_rate_interval_is_four_scrapes_at_least() -> None:
    expr = 'rate(x{instance=~"$instance"}[$__rate_interval]) / $__interval'
    out = grafana_panels.substitute(expr, interval=1, scrape_interval_s=1, values={"instance": None},
                                    known=KNOWN)
    assert out == 'rate(x{instance=~".*"}[4s]) / 1s'
    out = grafana_panels.substitute("[$__rate_interval]", interval=60, scrape_interval_s=15, values={})
    assert out == "[75s]"  # $__interval + scrape once that is more than 4 scrapes


def test_selections_become_regexes_and_unknown_variables_stay() -> None:
    values = {"instance": ["10.0.0.1:9876"], "group": ["a.b", "c"]}
    out = grafana_panels.substitute('x{i=~"${instance}",g=~"$group"} $other', interval=1, scrape_interval_s=1,
                                    values=values, known=KNOWN)
    assert out == r'x{i=~"10\.0\.0\.1:9876",g=~"(a\.b|c)"} $other'
    assert grafana_panels.substitute('"$group"', interval=1, scrape_interval_s=1, values={"group": None},
                                     known=KNOWN) == '".*"'  # "All" without allValue


@pytest.mark.parametrize(
    ("range_s", "points", "scrape_s", "interval"),
    [(60, 1000, 1, 1), (3600, 1000, 1, 5), (3600, 1000, 15, 15), (86400, 1000, 15, 60),
     (0.5, 1000, 0.01, 0.01)],
)
def test_interval_is_rounded_and_never_below_the_scrape_interval(
    range_s: float, points: int, scrape_s: float, interval: float
) -> None:
    assert grafana_panels.interval_s(range_s, points, scrape_s) == interval


def test_legend_and_label_values() -> None:
    labels = {"protocol": "mqtt", "op": "PUBLISH"}
    assert grafana_panels.legend("{{protocol}} {{ op }}", labels) == "mqtt PUBLISH"
    assert grafana_panels.legend("in {{missing}}", {}) == "in"
    assert grafana_panels.legend("", {"b": "2", "a": "1"}) == '{a="1", b="2"}'
    assert grafana_panels.label_values("label_values(mqproxy_connections_open, instance)") == (
        "mqproxy_connections_open", "instance")
    assert grafana_panels.label_values("up") is None


def test_the_dashboards_panels_and_variables() -> None:
    dashboard = grafana_panels.load()
    panels = grafana_panels.panels(dashboard)
    assert len({p.id for p in panels}) == len(panels) == 31
    assert all(p.targets for p in panels if p.type != "row")
    assert all(0 <= p.x and p.x + p.w <= 24 for p in panels)
    assert [t.instant for t in next(p for p in panels if p.type == "table").targets] == [True] * 3
    names = {v.name for v in grafana_panels.variables(dashboard) if v.query}
    assert names == {"instance", "group", "rule"}


def test_prometheus_config_scrapes_each_job_at_the_interval() -> None:
    config = json.loads(prometheus_server.scrape_config({"a": ["127.0.0.1:1"], "b": ["127.0.0.1:2"]}, 0.5))
    assert config["global"]["scrape_interval"] == "500ms"
    jobs = [(j["job_name"], j["static_configs"][0]["targets"], j["scrape_interval"])
            for j in config["scrape_configs"]]
    assert jobs == [("a", ["127.0.0.1:1"], "500ms"), ("b", ["127.0.0.1:2"], "500ms")]

"""Every metric the shipped alert rules (deploy/prometheus/alerts.yml) and Grafana dashboard
(deploy/grafana/mqfed.json) query is a series real nodes export: a 2-node cluster (`mqfed up
--detach`: etcd, Mosquitto with the plugin, sidecars) carries one QoS 1 message from n2 to a
subscriber on n1, then each node's /metrics is scraped and every name each expression selects
(tests/harness/promql.py) must be among its series (histograms by their `_bucket` series).
`up` is Prometheus's own series for a scrape target, not a node's."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from tests.harness.promql import (
    alert_expressions,
    dashboard_expressions,
    metric_names,
    series_names,
)

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "mqfed.json"
PROMETHEUS_OWN = {"up"}  # series Prometheus makes for each target


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return resp.read().decode()


@pytest.fixture(scope="module")
def scrapes(cluster: dict[str, dict]) -> dict[str, set[str]]:
    """node id -> the series names of its /metrics."""
    return {node: series_names(scrape(n["metrics"])) for node, n in cluster.items()}


def unknown(exprs: dict[str, str], series: set[str]) -> dict[str, set[str]]:
    """Expression name -> the metric names it selects that `series` lacks."""
    out = {}
    for name, expr in exprs.items():
        names = metric_names(expr)
        assert names, f"{name}: no metric name found in {expr!r}"
        missing = names - series - PROMETHEUS_OWN
        if missing:
            out[name] = missing
    return out


def test_the_nodes_export_what_the_collector_declares(scrapes: dict[str, set[str]]) -> None:
    for node, series in scrapes.items():
        assert {"mqfed_ready", "mqfed_peer_messages_sent_total", "mqfed_queue_spilled_messages",
                "mqfed_forward_hop_latency_seconds_bucket", "process_cpu_seconds_total",
                "mqfed_mosquitto_process_resident_memory_bytes"} <= series, node


def test_every_alert_rule_names_exported_metrics(scrapes: dict[str, set[str]]) -> None:
    exprs = alert_expressions(RULES)
    assert len(exprs) == 9
    for node, series in scrapes.items():
        missing = unknown(exprs, series)
        assert not missing, f"alert rules name metrics {node} lacks: {missing}"


def test_every_dashboard_query_names_exported_metrics(scrapes: dict[str, set[str]]) -> None:
    exprs = dashboard_expressions(DASHBOARD)
    assert len(exprs) >= 30 and "$node" in exprs
    for node, series in scrapes.items():
        missing = unknown(exprs, series)
        assert not missing, f"dashboard queries name metrics {node} lacks: {missing}"

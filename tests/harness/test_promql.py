"""The PromQL metric-name tokenizer (tests/harness/promql.py) that checks the shipped alert
rules and dashboard against real nodes (tests/system/observability/)."""

from __future__ import annotations

import json

import pytest

from tests.harness.promql import (
    alert_expressions,
    dashboard_expressions,
    metric_names,
    series_names,
)


@pytest.mark.parametrize(("expr", "names"), [
    ("mqfed_ready", {"mqfed_ready"}),
    ("mqfed_ready == 0", {"mqfed_ready"}),
    ('up{job="mqfed"} == 0', {"up"}),
    ("rate(mqfed_forwarded_total[5m])", {"mqfed_forwarded_total"}),
    ('sum by (node, peer) (rate(mqfed_peer_messages_sent_total{node=~"$node"}'
     "[$__rate_interval]))", {"mqfed_peer_messages_sent_total"}),
    ("sum(rate(mqfed_received_total[1m])) by (node)", {"mqfed_received_total"}),
    ("histogram_quantile(0.99, sum by (node, le) "
     "(rate(mqfed_forward_hop_latency_seconds_bucket{node=~\"${node}\"}[5m])))",
     {"mqfed_forward_hop_latency_seconds_bucket"}),
    ("(mqfed_peer_stream_up == 0) unless on (instance, peer) "
     '(mqfed_peer_stream_state{state="idle"} == 1)',
     {"mqfed_peer_stream_up", "mqfed_peer_stream_state"}),
    ("mqfed_queue_messages > 1e4 and deriv(mqfed_queue_messages[5m]) > 0",
     {"mqfed_queue_messages"}),
    ("a_total / ignoring(reason) group_left(node) b offset 5m", {"a_total", "b"}),
    ("max_over_time(x[10m:1m]) > bool 3", {"x"}),
    ('{__name__="only_matchers"}', set()),
    ('label_replace(y, "dst", "$1", "src", "(.*)")', {"y"}),
    ("0x1F + 2.5e-3 + Inf - NaN", set()),
    ("topk(3, sum without (peer) (z))", {"z"}),
])
def test_metric_names(expr, names):
    assert metric_names(expr) == names


def test_unbalanced_brackets_are_refused():
    with pytest.raises(ValueError, match="unbalanced"):
        metric_names("rate(x[5m]")


def test_series_names_of_a_scrape():
    scrape = (
        "# HELP mqfed_forwarded_total Local publishes.\n"
        "# TYPE mqfed_forwarded_total counter\n"
        "mqfed_forwarded_total 3.0\n"
        "# TYPE h histogram\n"
        'h_bucket{le="0.1"} 1.0\n'
        'h_bucket{le="+Inf"} 2.0\n'
        "h_sum 0.3\n"
        "h_count 2.0\n"
        'mqfed_clients{state="online"} 1.0\n'
    )
    assert series_names(scrape) == {"mqfed_forwarded_total", "h_bucket", "h_sum", "h_count",
                                    "mqfed_clients"}


def test_dashboard_expressions_walk_rows_and_variables(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({
        "panels": [
            {"title": "top", "targets": [{"refId": "A", "expr": "a"}]},
            {"title": "row", "type": "row", "panels": [
                {"title": "inner", "targets": [{"refId": "B", "expr": "rate(b[1m])"}]}]},
        ],
        "templating": {"list": [
            {"name": "DS", "type": "datasource", "query": "prometheus"},
            {"name": "node", "type": "query",
             "query": {"query": "label_values(mqfed_ready, node)", "refId": "n"}},
        ]},
    }))
    assert dashboard_expressions(path) == {"top #A": "a", "inner #B": "rate(b[1m])",
                                           "$node": "mqfed_ready"}


def test_alert_expressions(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text("groups:\n  - name: g\n    rules:\n"
                    "      - alert: Down\n        expr: up == 0\n"
                    "      - record: job:x:rate\n        expr: rate(x[1m])\n")
    assert alert_expressions(path) == {"Down": "up == 0", "job:x:rate": "rate(x[1m])"}

"""A real Prometheus (Debian's `prometheus`, the binary only, on loopback) scraping the
package's 2-node cluster with deploy/prometheus/alerts.yml loaded, asked through its HTTP
API: every node a healthy target, every alert rule evaluating without error, and every
Grafana dashboard query (its variables filled in as Grafana would) returning series."""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.harness.procs import ProcessGroup, free_port, wait_for
from tests.harness.promql import alert_expressions, dashboard_expressions

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "mqfed.json"
PROMETHEUS = shutil.which("prometheus")
RATE_INTERVAL = "5s"  # $__rate_interval at a 1 s scrape interval

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus is not installed (Debian package `prometheus`; "
    "`make install` installs it): the rules and dashboard cannot be run in Prometheus")


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.get("query", query=expr)["result"]


@pytest.fixture(scope="module")
def prometheus(cluster: dict[str, dict],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """Prometheus scraping every node each second, the alert rules loaded; stopped by PID."""
    assert PROMETHEUS is not None
    root = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "mqfed", "static_configs": [
            {"targets": [n["metrics"]], "labels": {"node": node}}
            for node, n in cluster.items()]}],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    group = ProcessGroup(root / "procs")
    api = Api(f"http://127.0.0.1:{port}")
    try:
        group.start("prometheus", [PROMETHEUS, f"--config.file={root / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={root / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{port}"])

        def scraped_a_few_times() -> bool:
            try:
                samples = api.query("count_over_time(up[1m])")
            except OSError:
                return False
            return len(samples) == len(cluster) and all(
                float(s["value"][1]) >= 4 for s in samples)
        wait_for(scraped_a_few_times, 60, "4 scrapes of every node", interval=0.5)
        yield api
    except BaseException:
        print(group.dump_logs())
        raise
    finally:
        group.stop_all()


def test_every_node_is_a_healthy_target(prometheus: Api, cluster: dict[str, dict]) -> None:
    targets = prometheus.get("targets")["activeTargets"]
    assert {t["labels"]["node"]: t["health"] for t in targets} == {n: "up" for n in cluster}


def test_the_alert_rules_evaluate(prometheus: Api) -> None:
    def rules() -> dict[str, dict]:
        groups = prometheus.get("rules")["groups"]
        return {r["name"]: r for g in groups for r in g["rules"]}

    wait_for(lambda: all(r["health"] != "unknown" for r in rules().values()), 30,
             "every rule evaluated once")
    evaluated = rules()
    assert set(evaluated) == set(alert_expressions(RULES))
    bad = {name: r.get("lastError") for name, r in evaluated.items() if r["health"] != "ok"}
    assert not bad, bad
    # a healthy cluster: its node-level alerts select nothing
    for name in ("MqfedNodeDown", "MqfedNodeNotReady", "MqfedPeerStreamDown",
                 "MqfedEtcdUnreachable", "MqfedOverloadShedding"):
        assert prometheus.query(alert_expressions(RULES)[name]) == [], name


def test_every_dashboard_query_returns_series(prometheus: Api,
                                              cluster: dict[str, dict]) -> None:
    exprs = dashboard_expressions(DASHBOARD)
    empty = []
    for name, expr in exprs.items():
        promql = (expr.replace("$__rate_interval", RATE_INTERVAL)
                  .replace("${node}", ".*").replace("$node", ".*"))
        if not prometheus.query(promql):
            empty.append(f"{name}: {promql}")
    assert not empty, "dashboard queries without a series:\n" + "\n".join(empty)
    nodes = prometheus.get("label/node/values", **{"match[]": exprs["$node"]})
    assert nodes == sorted(cluster)

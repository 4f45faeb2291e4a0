"""The shipped Prometheus files pass promtool (Debian's `prometheus` package, installed by
`make install`): the rules file and the scrape config check, and the alert rules fire as
deploy/prometheus/alerts_test.yml expects."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.harness.promql import alert_expressions

PROMETHEUS = Path(__file__).resolve().parents[3] / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian package `prometheus`; "
    "`make install` installs it): the alert rules and scrape config cannot be checked")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60,
                          cwd=PROMETHEUS)


def test_alert_rules_check() -> None:
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def test_scrape_config_checks_and_loads_the_rules() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_alerts_fire_as_expected() -> None:
    result = promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_every_alert_has_a_unit_test() -> None:
    alerts = set(alert_expressions(PROMETHEUS / "alerts.yml"))
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t["alert_rule_test"]
             if case["exp_alerts"]}
    assert alerts == fired, f"alerts no unit test fires: {sorted(alerts - fired)}"

"""migd's recording and alerting rules (prometheus/) pass promtool's checks and unit tests: each
alert fires on a synthetic series and stays silent without it, each recording rule computes the
expected share, ratio or join (prometheus/tests/*.test.yml).  Needs promtool (Debian's prometheus
package; .ci/run installs it and requires these tests)."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import REPO, required_tool

pytestmark = pytest.mark.integration  # promtool

PROM = REPO / "prometheus"


@pytest.fixture
def promtool() -> str:
    return required_tool("promtool", "MIGD_REQUIRE_PROMETHEUS", "apt-get install prometheus")


def test_rule_files_are_valid(promtool: str) -> None:
    r = subprocess.run([promtool, "check", "rules", str(PROM / "migd.rules.yml"), str(PROM / "migd.alerts.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("tests", ["migd.alerts.test.yml", "migd.rules.test.yml"])
def test_promtool_test_rules(promtool: str, tests: str) -> None:
    r = subprocess.run([promtool, "test", "rules", str(PROM / "tests" / tests)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_alert_has_a_firing_test(promtool: str) -> None:
    """No alert ships untested."""
    import yaml
    alerts = {r["alert"] for g in yaml.safe_load((PROM / "migd.alerts.yml").read_text())["groups"] for r in g["rules"]}
    tested = {t["alertname"] for case in yaml.safe_load((PROM / "tests" / "migd.alerts.test.yml").read_text())["tests"]
              for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert alerts == tested

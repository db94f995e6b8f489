"""dashboards/migd.json is what dashboards/build.py writes, and it type-checks against Grafana's
published dashboard schema (the @grafana/schema npm package, pinned in dashboards/package.json), so
it imports cleanly.  .ci/run installs the package (npm ci) and requires this test; locally it skips
with a reason when dashboards/node_modules is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration  # node and tsc

DASHBOARDS = REPO / "dashboards"
TSC = DASHBOARDS / "node_modules" / ".bin" / "tsc"
SCHEMA = DASHBOARDS / "node_modules" / "@grafana" / "schema"


def test_the_dashboard_is_what_build_py_writes() -> None:
    r = subprocess.run([sys.executable, str(DASHBOARDS / "build.py"), "--check"], capture_output=True, timeout=60)
    assert r.returncode == 0, "dashboards/migd.json is stale: run python3 dashboards/build.py"


def _typecheck(tmp_path: Path, dashboard: dict[str, object]) -> subprocess.CompletedProcess[str]:
    check = tmp_path / "check.ts"
    check.write_text(f"import type {{ Dashboard }} from '{SCHEMA}';\n"
                     f"export const dashboard: Dashboard = {json.dumps(dashboard, indent=1)};\n")
    return subprocess.run([str(TSC), "--noEmit", "--strict", "--skipLibCheck", "--moduleResolution", "bundler",
                           "--module", "esnext", "--target", "es2022", str(check)], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def schema() -> None:
    if not (TSC.exists() and SCHEMA.exists()):
        if os.environ.get("MIGD_REQUIRE_NODE") == "1":
            pytest.fail("dashboards/node_modules is missing: npm ci --prefix dashboards")
        pytest.skip("@grafana/schema is not installed (npm ci --prefix dashboards; .ci/run does it)")


def test_the_dashboard_type_checks_against_grafanas_schema(schema: None, tmp_path: Path) -> None:
    r = _typecheck(tmp_path, json.loads((DASHBOARDS / "migd.json").read_text()))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_schema_check_rejects_what_grafana_would_not_import(schema: None, tmp_path: Path) -> None:
    """The check can fail: a field the schema does not know, or a wrong type, is refused."""
    dash = json.loads((DASHBOARDS / "migd.json").read_text())
    dash["templating"]["list"][1]["definition"] = "label_values(migd_gpu_info, instance)"  # not in the schema
    dash["panels"][0]["collapsed"] = "no"
    r = _typecheck(tmp_path, dash)
    assert r.returncode != 0 and "definition" in r.stdout and "boolean" in r.stdout, r.stdout

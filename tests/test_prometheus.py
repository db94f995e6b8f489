"""The dashboard's PromQL against a real Prometheus scraping a real migd --sim; promtool on /metrics.

Needs Debian's ``prometheus`` package (promtool included).  .ci/run installs it; locally
the tests skip with a reason when it is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from migd.sim import control
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess, free_port
from tests.helpers import REPO

DASHBOARD = REPO / "dashboards" / "migd.json"


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", v["definition"]) for v in dash["templating"]["list"] if "definition" in v]
    return out


def substitute(expr: str) -> str:
    return expr.replace("$node", ".*").replace("$gpu", ".*").replace("$owner", ".*")


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MigdProcess, int]]:
    prom = shutil.which("prometheus")
    if prom is None:
        pytest.skip("prometheus is not installed (CI installs Debian's prometheus package)")
    tmp = tmp_path_factory.mktemp("prom")
    m = MigdProcess(tmp, fleet="mixed", reconcile_interval="2s")
    m.start(now="2026-11-23T10:00:00")
    m.wait_ready()
    store = StateStore(m.migctl.state)
    st = store.read()
    for g in (0, 2):  # a busy instance on an A100 and on an H100
        control.start_process(store, g, st.gpus[g].gis[0].id, 0, used_mib=2048)
    pport = free_port()
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: migd\n    static_configs: [{{targets: ['127.0.0.1:{m.port}']}}]\n")
    proc = subprocess.Popen([prom, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{pport}"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "prom.log", "w"))  # noqa: SIM115
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{pport}/-/ready", timeout=2):
                    break
            except OSError:
                time.sleep(0.3)
        else:
            pytest.fail("prometheus did not become ready: " + (tmp / "prom.log").read_text()[-2000:])
        time.sleep(3)
        # events after scraping began: an apply (apply counters, histogram), Xids, an NVML error
        keep = tmp / "keep.yaml"  # keeps the busy 1g instances at 0..3, adds a 3g
        keep.write_text("apiVersion: migd/v1\nkind: Profile\nname: keep\ngpus:\n  - select: all\n"
                        "    instances: [{profile: 1g, count: 3, owner: notebooks}, {profile: 3g, owner: training}]\n")
        r = m.migctl("apply", str(keep))
        assert r.code == 0, r.err
        control.raise_xid(store, 3, 31, gi=store.read().gpus[3].gis[0].id, ci=0)
        control.raise_xid(store, 1, 79)
        control.fail_call(store, "nvmlGpmMigSampleGet", 999)
        time.sleep(6)
        yield m, pport
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        m.close()


@pytest.mark.parametrize("title,expr", dashboard_exprs(), ids=[t for t, _ in dashboard_exprs()])
def test_dashboard_expression_returns_data(stack: tuple[MigdProcess, int], title: str, expr: str) -> None:
    _, pport = stack
    q = substitute(expr)
    m = re.fullmatch(r"label_values\((.*), *(\w+)\)", q) or re.fullmatch(r"label_values\((\w+), *(\w+)\)", q)
    if m:  # a template variable: the series it reads must exist and carry the label
        q = m.group(1)
    res = get(f"http://127.0.0.1:{pport}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    assert res["status"] == "success", res
    assert res["data"]["result"], f"{title}: {q} returned no data"
    if m:
        assert all(m.group(2) in r["metric"] for r in res["data"]["result"])


def test_promtool_check_metrics(stack: tuple[MigdProcess, int]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    m, _ = stack
    with urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=10) as r:
        text = r.read()
    assert b"migd_xid_events_total" in text and b"migd_gpu_unhealthy" in text
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), (p.stdout + p.stderr).decode()


def test_daemon_kept_serving_through_faults(stack: tuple[MigdProcess, int]) -> None:
    m, pport = stack
    res = get(f"http://127.0.0.1:{pport}/api/v1/query?" + urllib.parse.urlencode(
        {"query": 'count_over_time(up{job="migd"}[1m])'}))
    samples = int(res["data"]["result"][0]["value"][1])
    res = get(f"http://127.0.0.1:{pport}/api/v1/query?" + urllib.parse.urlencode(
        {"query": 'min_over_time(up{job="migd"}[1m])'}))
    assert samples >= 3 and res["data"]["result"][0]["value"][1] == "1"  # scraped throughout, none failed

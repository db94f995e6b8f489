"""The dashboard's PromQL against a real Prometheus scraping a real migd --sim (and a recorded
dcgm-exporter exposition), with migd's recording and alerting rules loaded; promtool on /metrics.

Needs Debian's ``prometheus`` package (promtool included).  .ci/run installs it; locally
the tests skip with a reason when it is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from migd.sim import world
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import REPO
from tests.prom_server import binary, prometheus, query, served

pytestmark = pytest.mark.integration  # Prometheus, real migd daemons

DASHBOARD = REPO / "dashboards" / "migd.json"
DCGM = REPO / "tests" / "fixtures" / "dcgm-exporter-mig.txt"


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", v["query"]["query"]) for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


def substitute(expr: str) -> str:
    return expr.replace("$node", ".*").replace("$gpu", ".*").replace("$owner", ".*")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MigdProcess, int]]:
    binary()
    tmp = tmp_path_factory.mktemp("prom")
    m = MigdProcess(tmp, fleet="mixed", reconcile_interval="2s")
    m.start(now="2026-11-23T10:00:00")
    try:
        m.wait_ready()
        store = StateStore(m.migctl.state)
        st = store.read()
        for g in (0, 2):  # a busy instance on an A100 and on an H100
            world.start_process(store, g, st.gpus[g].gis[0].id, 0, used_mib=2048)
        with served(DCGM) as dport, prometheus(tmp, {"migd": m.port, "dcgm": dport}) as pport:
            time.sleep(2)
            # events after scraping began: an apply (apply counters, histogram), Xids, an NVML error
            keep = tmp / "keep.yaml"  # keeps the busy 1g instances at 0..3, adds a 3g
            keep.write_text("apiVersion: migd/v1\nkind: Profile\nname: keep\ngpus:\n  - select: all\n"
                            "    instances: [{profile: 1g, count: 3, owner: notebooks}, "
                            "{profile: 3g, owner: training}]\n")
            r = m.migctl("apply", str(keep))
            assert r.code == 0, r.err
            world.raise_xid(store, 3, 31, gi=store.read().gpus[3].gis[0].id, ci=0)
            world.raise_xid(store, 1, 79)
            world.set_lost(store, 0)  # GPU 0 fell off the bus: NVML reads it no more
            world.fail_call(store, "nvmlGpmMigSampleGet", 999)
            time.sleep(8)
            yield m, pport
    finally:
        m.close()


@pytest.mark.parametrize("title,expr", dashboard_exprs(), ids=[t for t, _ in dashboard_exprs()])
def test_dashboard_expression_returns_data(stack: tuple[MigdProcess, int], title: str, expr: str) -> None:
    _, pport = stack
    q = substitute(expr)
    m = re.fullmatch(r"label_values\((.*), *(\w+)\)", q) or re.fullmatch(r"label_values\((\w+), *(\w+)\)", q)
    if m:  # a template variable: the series it reads must exist and carry the label
        q = m.group(1)
    result = query(pport, q)
    assert result, f"{title}: {q} returned no data"
    if m:
        assert all(m.group(2) in r["metric"] for r in result)


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
    (count,) = query(pport, 'count_over_time(up{job="migd"}[1m])')
    (least,) = query(pport, 'min_over_time(up{job="migd"}[1m])')
    assert int(count["value"][1]) >= 3 and least["value"][1] == "1"  # scraped throughout, none failed


def test_the_first_xid_shows_in_increase(stack: tuple[MigdProcess, int]) -> None:
    """The counter existed at 0 before the Xid, so increase() counts the first one (it did not)."""
    _, pport = stack
    (r,) = query(pport, 'increase(migd_xid_events_total{gpu="3", xid="31"}[1m])')
    assert float(r["value"][1]) > 0.5
    (r,) = query(pport, 'increase(migd_xid_events_total{gpu="1", xid="79"}[1m])')
    assert float(r["value"][1]) > 0.5


def test_dcgm_exporter_pods_reach_migds_owner_view(stack: tuple[MigdProcess, int]) -> None:
    """The recording rules join dcgm-exporter's pod attribution (UUID, GPU_I_ID) to migd's instances
    (gpu_uuid, gi): each pod gets the owner and MIG profile of the instance it runs in."""
    _, pport = stack
    rows = {(r["metric"]["namespace"], r["metric"]["pod"]): r["metric"] for r in query(pport, "migd_instance:pod:info")}
    assert set(rows) == {("ml-training", "llm-finetune-0"), ("team-vision", "jupyter-alice"),
                         ("team-vision", "jupyter-bob")}
    assert rows[("ml-training", "llm-finetune-0")]["owner"] == "training"
    assert rows[("ml-training", "llm-finetune-0")]["profile"] == "3g.20gb"
    assert {rows[("team-vision", p)]["owner"] for p in ("jupyter-alice", "jupyter-bob")} == {"notebooks"}
    by_owner = {(r["metric"]["owner"], r["metric"]["namespace"]): float(r["value"][1])
                for r in query(pport, "count by (owner, namespace) (migd_instance:pod:info)")}
    assert by_owner == {("training", "ml-training"): 1.0, ("notebooks", "team-vision"): 2.0}


def test_alerts_fire_on_the_live_daemon(stack: tuple[MigdProcess, int]) -> None:
    """GPU 1's Xid 79 marked it unhealthy: MigdGpuUnhealthy fires against the real exposition."""
    _, pport = stack
    firing = {(r["metric"]["alertname"], r["metric"].get("gpu")) for r in
              query(pport, 'ALERTS{alertstate="firing", alertname=~"Migd.*"}')}
    assert ("MigdGpuUnhealthy", "1") in firing



def test_a_lost_gpu_stays_in_the_dashboards_gpu_list(stack: tuple[MigdProcess, int]) -> None:
    """GPU 0 fell off the bus: its info and memory series are gone, but the dashboard's GPU list, read
    from the series every GPU keeps, still offers it, and the lost-GPU panel names it."""
    _, pport = stack
    dash = json.loads(DASHBOARD.read_text())
    (var,) = [v for v in dash["templating"]["list"] if v["name"] == "gpu"]
    m = re.fullmatch(r"label_values\((.*), *(\w+)\)", substitute(var["query"]["query"]))
    assert m is not None
    assert "0" in {r["metric"][m.group(2)] for r in query(pport, m.group(1))}
    assert not query(pport, 'migd_gpu_info{gpu="0"}')  # (what the list was read from)
    (lost,) = [t["expr"] for p in dash["panels"] if p["title"].startswith("GPUs NVML cannot read")
               for t in p["targets"]]
    assert [r["metric"]["gpu"] for r in query(pport, substitute(lost))] == ["0"]

"""bench/demand.py: its queue model behaves as the real-Slurm tests show Slurm does, its trace CSV is
read or refused as documented, and its report has the promised shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import demand  # noqa: E402
from demand_model import Cluster, run  # noqa: E402
from demand_trace import TraceJob, read_csv, synthetic, write_csv  # noqa: E402

from migd.demand.model import Layout  # noqa: E402


def one_node(layout: str = "day") -> Cluster:
    c = demand.cluster(1, "dgx-h100", 1)
    c.nodes[0].layout = c.layouts[layout]
    return c


def job(at: float, gres: str, run_s: float, count: int = 1) -> TraceJob:
    return TraceJob(at, "a", "gpu", gres, count, run_s, run_s * 2)


def test_a_running_job_is_not_cut_short_and_the_switch_waits_for_it() -> None:
    """As tests/test_slurm.py shows on real Slurm: drained, the node starts nothing new, its job runs to
    its end, then the layout changes (after the switch's own time)."""
    c = one_node("day")
    night = c.layouts["night"]
    trace = [job(0, "1g.10gb", 600), job(60, "1g.10gb", 60)]

    def policy(now: float, cl: Cluster) -> dict[str, Layout]:
        return {"gpu000": night} if now == 300 else {}
    run(trace, c, policy, 3600, decide_every_s=300)
    node = c.nodes[0]
    assert node.layout.name == "night" and node.switches == [600.0]  # when the job ended, not at 300
    assert c.killed == 0 and len(c.done) == 2
    assert c.drain_slice_s == pytest.approx((56 - 1) * 300 + 56 * 180)  # drain with one busy slice, then the switch


def test_a_job_for_a_type_the_layout_lacks_waits_for_that_layout() -> None:
    """As on real Slurm: a job queued for the day layout stays pending through the night."""
    c = one_node("night")
    run([job(0, "1g.10gb", 60)], c, lambda now, cl: {}, 3600)
    assert c.done == [] and len(c.pending["1g.10gb"]) == 1


def test_the_short_bench_reports_the_three_policies(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--short", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    keys = {"utilization", "wait_p50_s", "wait_p95_s", "jobs_killed", "reconfigs_per_node_day", "drain_slice_hours"}
    assert set(doc["policies"]) == {"static", "greedy", "migd"}
    for p in doc["policies"].values():
        assert keys <= set(p) and p["jobs_killed"] == 0 and 0 < p["utilization"] < 1


def test_a_trace_replays_from_csv(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    write_csv(path, synthetic(2, 1)[:50])
    assert read_csv(path) == synthetic(2, 1)[:50]
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--trace", str(path), "--nodes", "2",
                        "--days", "0.5", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["jobs"] == 50


@pytest.mark.parametrize("row,said", [
    ("10,a,gpu,1g.10gb,1,600,300", "jobs.csv:2: time_limit_s: 300 is shorter than duration_s 600"),
    ("10,a,gpu,gpu:1g,1,600,900", "jobs.csv:2: gres: 'gpu:1g' is not a MIG type"),
    ("ten,a,gpu,1g.10gb,1,600,900", "jobs.csv:2: submit_s: 'ten' is not a number"),
    ("10,a,gpu,1g.10gb,1.5,600,900", "jobs.csv:2: count: 1.5 is not a whole number"),
])
def test_a_bad_trace_row_is_one_line_and_exit_2(tmp_path: Path, row: str, said: str) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("submit_s,account,partition,gres,count,duration_s,time_limit_s\n" + row + "\n")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--trace", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

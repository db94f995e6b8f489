"""The demand mode across several nodes: a real slurmctld with three slurmd on this host
(Slurm's multiple-slurmd mode, tests/slurm_cluster.py), each node's own migd process over its own
simulated A100, one of them the planner.  Notebook jobs pending at night switch the right number of
nodes to the small layout and start; a running training job is not touched; the planner's death
changes nothing while its leases run."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.slurm.want import Want
from tests.daemon_harness import MigdProcess
from tests.slurm_cluster import SlurmCluster
from tests.slurm_node import CONFIG as SLURM_NODE_CONFIG
from tests.slurm_node import migd_fleet

pytestmark = pytest.mark.integration  # a real Slurm cluster, real migd daemons

NAMES = ("gpu1", "gpu2", "gpu3")
CONFIG = SLURM_NODE_CONFIG.format(day_at="08:30", days="mon-fri") + "reconcile_interval: 1s\n"
DEMAND = "  demand:\n    mode: on\n    planner: gpu1\n    candidates: [day, night]\n    interval: 1s\n    lease: 1h\n"


@pytest.fixture(params=["night"])
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[SlurmCluster, dict[str, MigdProcess]]]:
    """Three nodes in ``request.param``'s layout, each with its migd configured (not started)."""
    with migd_fleet(tmp_path, dict.fromkeys(NAMES, request.param), CONFIG + "{slurm}" + DEMAND) as f:
        yield f


def status(m: MigdProcess) -> dict[str, object]:
    return m.control({"cmd": "status"})["daemon"]  # type: ignore[no-any-return]


def _notebooks_at_night(c: SlurmCluster, migds: dict[str, MigdProcess], n: int) -> str:
    """A training job on gpu1, then ``n`` notebooks of an hour; every migd started at Monday 19:00:05 in
    Seoul (the schedule says night everywhere): gpu2 comes to serve the day layout and the notebooks
    run.  The training job's id."""
    training = c.submit("gpu:7g.80gb:1", "sleep 600", "-w", "gpu1", "-t", "60", "-A", "nlp")
    c.wait(lambda: c.job_state(training) == "RUNNING", "the training job to start")
    notebooks = [c.submit("gpu:1g.10gb:1", "sleep 2", "-t", "60", "-A", "teaching") for _ in range(n)]
    for m in migds.values():
        m.start(now="2026-11-23T19:00:05")
    for m in migds.values():
        m.wait_ready(60)
    c.wait(lambda: c.show("gpu2").get("Gres") == "gpu:1g.10gb:7" and "DRAIN" not in c.state("gpu2"),
           "gpu2 to serve the day layout", 120)
    c.wait(lambda: all(c.job_state(j) in ("GONE", "COMPLETING") for j in notebooks), "the notebooks to run", 120)
    return training


def test_notebooks_at_night_switch_one_idle_node_and_leave_training_alone(
        fleet: tuple[SlurmCluster, dict[str, MigdProcess]]) -> None:
    c, migds = fleet
    # 10 notebooks of an hour just submitted: 50 slice-hours expected within the horizon; one day node
    # offers 55.6: one node switches, the idle one first (gpu1 runs the training job; gpu2 < gpu3)
    training = _notebooks_at_night(c, migds, 10)
    assert c.show("gpu1")["Gres"] == "gpu:7g.80gb:1" and c.show("gpu3")["Gres"] == "gpu:7g.80gb:1"
    assert c.job_state(training) == "RUNNING" and "Restarts=0" in c.cmd("scontrol", "show", "job", training)
    assert migds["gpu2"].assert_profile("day") and migds["gpu3"].assert_profile("night")
    st = status(migds["gpu2"])
    assert st["active"] == {"profile": "day", "reason": "demand", "source": "gpu1",  # type: ignore[comparison-overlap]
                            "until": st["active"]["until"]}  # type: ignore[index]
    plan = status(migds["gpu1"])["demand"]["plan"]  # type: ignore[index]
    assert plan["error"] is None, plan

    migds["gpu1"].signal(signal.SIGKILL)  # the planner dies: its leases (an hour) keep every node as it is
    time.sleep(3)  # (three of the nodes' passes)
    assert c.show("gpu2")["Gres"] == "gpu:1g.10gb:7" and c.show("gpu3")["Gres"] == "gpu:7g.80gb:1"
    assert status(migds["gpu2"])["demand"]["source"] == "planner"  # type: ignore[index]
    assert json.loads(json.dumps(status(migds["gpu3"])))["active"]["profile"] == "night"


@pytest.mark.parametrize("fleet", ["day"], indirect=True)
def test_a_training_job_by_day_takes_the_node_whose_jobs_end_first_after_they_end(
        fleet: tuple[SlurmCluster, dict[str, MigdProcess]]) -> None:
    """A pending 7g job by day: of three day nodes each running a notebook, the one whose notebook's time
    limit ends first is drained; it switches only once that notebook has run to its end.  Each notebook
    runs until the test lets it end (not for a fixed time: under load the planner's first decision may
    come later than a fixed run would last)."""
    c, migds = fleet
    done = c.dir / "done"
    done.mkdir()
    limits = {"gpu1": "30", "gpu2": "5", "gpu3": "30"}  # minutes: gpu2's notebook ends first
    notebooks = {n: c.submit("gpu:1g.10gb:1", f"while [ ! -e {done}/end-{n} ]; do sleep 0.2; done; "
                             f"touch {done}/$SLURM_JOB_ID", "-w", n, "-t", t, "-A", "teaching")
                 for n, t in limits.items()}
    c.wait(lambda: all(c.job_state(j) == "RUNNING" for j in notebooks.values()), "the notebooks to start")
    training = c.submit("gpu:7g.80gb:1", f"touch {done}/training", "-t", "60", "-A", "nlp")
    for m in migds.values():  # Monday 10:00 in Seoul: the schedule says day everywhere
        m.start(now="2026-11-23T10:00:05")
    for m in migds.values():
        m.wait_ready(60)
    c.wait(lambda: "DRAIN" in c.state("gpu2"), "gpu2 to drain for the training job", 60)
    time.sleep(2)  # (a switch that did not wait for the notebook would show by now)
    assert c.show("gpu2")["Gres"] == "gpu:1g.10gb:7" and c.job_state(notebooks["gpu2"]) == "RUNNING"
    (done / "end-gpu2").touch()  # its notebook ends: now gpu2 switches
    c.wait(lambda: (done / "training").exists(), "the training job to run on a night node", 120)
    assert c.show("gpu2")["Gres"] == "gpu:7g.80gb:1"
    assert c.show("gpu1")["Gres"] == c.show("gpu3")["Gres"] == "gpu:1g.10gb:7"
    for n in ("gpu1", "gpu3"):
        (done / f"end-{n}").touch()
    c.wait(lambda: all((done / j).exists() for j in notebooks.values()), "every notebook to run to its end", 60)
    assert c.job_state(training) in ("GONE", "COMPLETING")


def test_slurmctld_killed_mid_wave_leaves_no_conflict_and_recovers(
        fleet: tuple[SlurmCluster, dict[str, MigdProcess]]) -> None:
    """Enough notebooks for two day nodes, one node in maintenance at a time: slurmctld is killed as soon
    as the planner has recorded the first change, and started again 5 s later.  No node is left half-
    switched or holding a layout its Gres does not say; each node has one want, by the one planner; the
    notebooks run."""
    c, migds = fleet
    notebooks = [c.submit("gpu:1g.10gb:1", "true", "-t", "60", "-A", "teaching") for _ in range(16)]
    for m in migds.values():
        m.start(now="2026-11-23T19:00:05")
    for m in migds.values():
        m.wait_ready(60)
    c.wait(lambda: any("want=day" in c.show(n).get("Extra", "") for n in NAMES), "the first change", 60)
    os.kill(int((c.dir / "run" / "slurmctld.pid").read_text()), signal.SIGKILL)
    time.sleep(5)
    c.run_sbin("slurmctld")
    c.wait(lambda: all(c.job_state(j) in ("GONE", "COMPLETING") for j in notebooks),
           "the notebooks to run after slurmctld came back", 180)
    c.wait(lambda: not any("DRAIN" in c.state(n) for n in NAMES), "every node back in service", 120)
    for n in NAMES:
        show = c.show(n)
        want = Want.parse(show.get("Extra", ""))
        assert want is not None and want.planner == "gpu1", show  # one want each, by the one planner
        layout = "day" if show["Gres"] == "gpu:1g.10gb:7" else "night"
        assert show["Gres"] in ("gpu:1g.10gb:7", "gpu:7g.80gb:1") and want.layout == layout, show
        assert migds[n].assert_profile(layout)  # the GPUs hold what Slurm advertises
    assert sum(1 for n in NAMES if c.show(n)["Gres"] == "gpu:1g.10gb:7") >= 1


def test_a_node_of_fewer_gpus_is_planned_on_its_own_layouts_and_serves(tmp_path: Path) -> None:
    """A partition of a node with two A100s (the planner's) and one with a single A100: the planner reads
    the small node's GPU count from its Gres=, weighs it with its own slices, and the small node, idle,
    takes the day layout on its one GPU (seven 1g instances) while the planner's node runs training."""
    nodes = {"gpu1": "night", "gpu2": "night"}
    with migd_fleet(tmp_path, nodes, CONFIG + "{slurm}" + DEMAND, fleet={"gpu1": "a100-vm", "gpu2": "single-a100"}) as (
            c, migds):
        assert c.show("gpu1")["Gres"] == "gpu:7g.80gb:2" and c.show("gpu2")["Gres"] == "gpu:7g.80gb:1"
        training = _notebooks_at_night(c, migds, 8)  # (gpu2's day: seven 1g instances on its one GPU)
        plan = status(migds["gpu1"])["demand"]["plan"]  # type: ignore[index]
        assert plan["error"] is None and plan["skipped"] == [], plan
        assert migds["gpu2"].assert_profile("day") and c.show("gpu1")["Gres"].startswith("gpu:7g.80gb:")
        assert c.job_state(training) == "RUNNING"

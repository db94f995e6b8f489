"""The demand planner reads a real Slurm's queue as the jobs that were submitted: Debian's Slurm 22.05,
two nodes (tests/slurm_cluster.py), jobs asking MIG instances in every form sbatch(1) documents, and the
ones that used to be misread (an outside audit of ``scontrol show job -o -d`` parsing):

- a job whose name and output path hold ``TresPerNode=...`` and ``Nodes=gpu2 ... GRES=...`` (users' own
  text: it invented a request and put the job on a node it did not run on), and a CPU-only job named like
  an allocation (a node's switch waited for it);
- a running job stopped with ``scancel --signal=STOP`` (``STOPPED``: it keeps its allocation; it was
  not seen as running, and a switch went ahead under it);
- a pending job array of ten tasks (it was one request);
- ``--gpus=2 --gpus-per-task=1`` (it was counted twice), a job over two nodes (one request), a job
  whose dependency can never be met (it was demand), ``--gres=gpu`` (not counted as untyped) and
  ``--gpus-per-socket`` (not read at all).

``MIGD_RECORD_SQUEUE=FILE`` also writes the ``squeue --json`` output there: how
tests/fixtures/slurm/squeue-json.json was recorded (tests/fixtures/slurm/SOURCES.md).  Skipped where
Slurm is missing or not root, unless MIGD_REQUIRE_SLURM=1 (.ci/run sets it)."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from migd.slurm.ctl import SlurmCtl
from migd.slurm.queue import read_queue
from tests.slurm_cluster import SlurmCluster, skip_without_slurm

pytestmark = pytest.mark.integration  # slurmctld and slurmd, the planner's commands as programs

NODES = ("gpu1", "gpu2")
GRES = "gpu:1g.10gb:2,gpu:3g.40gb:2"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    skip_without_slurm()
    c = SlurmCluster(4, nodes=NODES)
    try:
        conf = "".join(f"NodeName={n} Name=gpu Type={t} File={c.devs[n]}/nvidia{i}\n" for n in NODES
                       for i, t in enumerate(("1g.10gb", "1g.10gb", "3g.40gb", "3g.40gb")))
        c.start(dict.fromkeys(NODES, GRES), conf, catalog="gpu:1g.10gb:2,gpu:3g.40gb:2,gpu:7g.80gb:1", cpus=8)
        yield c
    finally:
        c.stop()


def _sbatch(c: SlurmCluster, *args: str) -> str:
    return c.cmd("sbatch", "--parsable", "-o", "/dev/null", "-A", "physics", "-t", "30", *args).strip()


def test_squeue_json_is_read_as_the_jobs_submitted(cluster: SlurmCluster, tmp_path: Path) -> None:
    c = cluster
    out = tmp_path / "a Nodes=gpu2 CPU_IDs=0 Mem=0 GRES=gpu:7g.80gb:1"
    mine = c.cmd("sbatch", "--parsable", "-o", str(out), "-A", "bio", "-t", "30", "-w", "gpu1",
                 "-J", "x TresPerNode=gres:gpu:3g.40gb:2", "--gres=gpu:1g.10gb:1", "--wrap", "sleep 300").strip()
    failing = _sbatch(c, "--wrap", "false")
    cpu_only = c.cmd("sbatch", "--parsable", "-o", "/dev/null", "-t", "30", "-w", "gpu2", "-J",
                     "y Nodes=gpu2 CPU_IDs=0 Mem=0 GRES=gpu:1g.10gb:1", "--wrap", "sleep 300").strip()
    later = ("--begin=now+1hour",)  # pending, not startable: what it asks is read without it starting
    array = _sbatch(c, "--array=0-9%3", "--gres=gpu:7g.80gb:1", "--wrap", "true")
    both = _sbatch(c, *later, "-n", "2", "--gpus=1g.10gb:2", "--gpus-per-task=1g.10gb:1", "--wrap", "true")
    wide = _sbatch(c, *later, "-N", "2", "--gpus-per-node=3g.40gb:1", "--wrap", "true")
    total = _sbatch(c, *later, "--gpus=1g.10gb:1", "--wrap", "true")
    tasks = _sbatch(c, *later, "-n", "2", "--gpus-per-task=1g.10gb:1", "--wrap", "true")
    sockets = _sbatch(c, *later, "--sockets-per-node=2", "--gpus-per-socket=3g.40gb:1", "--wrap", "true")
    _sbatch(c, f"--dependency=afterok:{failing}", "--gres=gpu:3g.40gb:2", "--wrap", "true")
    _sbatch(c, *later, "--gres=gpu", "--wrap", "true")
    _sbatch(c, "--hold", "--gres=gpu:1g.10gb:1", "--wrap", "true")
    _sbatch(c, *later, "-J", "y TresPerNode=gres:gpu:3g.40gb:2", "--comment", "c TresPerTask=gres:gpu:1g.10gb:3",
            "--wrap", "true")
    c.wait(lambda: c.cmd("squeue", "-h", "-j", mine, "-o", "%T").strip() == "RUNNING", "the job to run", 30)
    c.cmd("scancel", "--signal=STOP", mine)
    c.wait(lambda: c.cmd("squeue", "-h", "-j", mine, "-o", "%T").strip() == "STOPPED", "the job to stop", 30)
    c.wait(lambda: "DependencyNeverSatisfied" in c.cmd("squeue", "-h", "-o", "%r"), "the dependency to fail", 30)
    text = SlurmCtl("gpu1", lambda argv, t: c.cmd(*argv)).all_jobs()
    if os.environ.get("MIGD_RECORD_SQUEUE"):
        Path(os.environ["MIGD_RECORD_SQUEUE"]).write_text(text)

    q = read_queue(text, "main", time.time())
    assert {n: [(r.job, r.mig_type, r.count, r.account) for r in rs] for n, rs in q.running.items()} == {
        "gpu1": [(mine, "1g.10gb", 1, "bio")]}
    asked = Counter((p.job.split("_")[0], p.mig_type, p.count, p.startable, p.nodes) for p in q.pending)
    assert asked == {(array, "7g.80gb", 1, True, 1): 3, (array, "7g.80gb", 1, False, 1): 7,  # (%3: three at once)
                     (both, "1g.10gb", 2, False, 1): 1,
                     (wide, "3g.40gb", 1, False, 2): 1,  # (-N 2: one request over both nodes)
                     (total, "1g.10gb", 1, False, 1): 1,
                     (tasks, "1g.10gb", 2, False, 1): 1, (sockets, "3g.40gb", 2, False, 1): 1}, asked
    # a node's own switch waits for the jobs holding its GPUs: the stopped one, not the CPU-only one named
    # like an allocation (it was waited for, or requeued with on_busy: force)
    c.wait(lambda: c.cmd("squeue", "-h", "-j", cpu_only, "-o", "%T").strip() == "RUNNING", "the CPU job to run", 30)
    gate = {n: [(j.id, j.uses_gpus) for j in SlurmCtl(n, lambda argv, t: c.cmd(*argv)).jobs()] for n in NODES}
    assert gate == {"gpu1": [(mine, True)], "gpu2": [(cpu_only, False)]}, gate
    assert sorted(p.job for p in q.pending if p.job.startswith(f"{array}_")) == sorted(
        f"{array}_{i}" for i in range(10))
    assert q.untyped == 1


def test_words_in_a_nodes_comment_or_reason_are_never_its_fields(cluster: SlurmCluster) -> None:
    """migd's own comment after a registration timeout quotes ``Gres=``; scontrol prints Comment, Extra and
    Reason after the node's other fields, and the comment's ``Gres=`` was read as the node's: every later
    switch timed out, the planner skipped the node."""
    c = cluster
    ctl = SlurmCtl("gpu2", lambda argv, t: c.cmd(*argv))
    ctl.set_extra("gpu2", "migd:want=day,by=gpu1,at=1,until=2")
    ctl.set_comment("migd: Slurm did not take the new GRES of night: timed out waiting for gpu2 to register with "
                    "Gres=gpu:7g.80gb:1 (last seen: state IDLE, Gres=gpu:3g.40gb:2) Extra=x Reason=y State=DOWN")
    try:
        c.cmd("scontrol", "update", "nodename=gpu2", "state=drain", "reason=check Gres=gpu:7g.80gb:8 Extra=z")
        info = ctl.info()
        assert (info.gres, info.extra) == (GRES, "migd:want=day,by=gpu1,at=1,until=2"), info
        assert "DRAIN" in info.states and "DOWN" not in info.states, info  # (IDLE or MIXED: a job may run there)
        assert info.comment.endswith("Extra:x Reason:y State=DOWN") and info.reason.startswith(
            "check Gres=gpu:7g.80gb:8 Extra=z"), info
        assert [n.gres for n in ctl.nodes() if n.name == "gpu2"] == [GRES]
    finally:
        c.cmd("scontrol", "update", "nodename=gpu2", "state=resume", "comment=", "extra=")


def test_a_node_without_jobs_is_told_so_without_reading_the_whole_queue(cluster: SlurmCluster) -> None:
    """22.05's ``squeue --json`` ignores its filters: every pass of a drain read the whole queue (about 3 KB
    a job).  ``squeue -w`` lists the node's jobs first, and the JSON is read only when it names one."""
    c = cluster
    c.cmd("scancel", "-u", "root")
    c.wait(lambda: not c.cmd("squeue", "-h", "-w", "gpu1", "-o", "%A").strip(), "the node's jobs to end", 30)
    calls: list[tuple[str, ...]] = []

    def run(argv: Sequence[str], timeout_s: float) -> str:
        calls.append(tuple(argv))
        return c.cmd(*argv)

    ctl = SlurmCtl("gpu1", run)
    assert ctl.jobs() == [] and not [a for a in calls if "--json" in a], calls
    cpu = c.cmd("sbatch", "--parsable", "-o", "/dev/null", "-t", "30", "-w", "gpu1", "--wrap", "sleep 300").strip()
    try:
        c.wait(lambda: c.cmd("squeue", "-h", "-j", cpu, "-o", "%T").strip() == "RUNNING", "the CPU job to run", 30)
        assert [(j.id, j.uses_gpus) for j in ctl.jobs()] == [(cpu, False)]
        assert ("squeue", "--json") in calls
    finally:
        c.cmd("scancel", cpu)

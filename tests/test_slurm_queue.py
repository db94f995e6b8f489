"""Slurm's queue read for the demand rule, from a recording of Slurm 22.05's own output
(tests/fixtures/slurm/SOURCES.md)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from migd.slurm.ctl import node_info
from migd.slurm.queue import read_queue, seconds

FIX = Path(__file__).parent / "fixtures" / "slurm"
NOW = datetime.fromisoformat("2026-11-26T05:41:40").timestamp()  # (slurmctld's local time, as recorded)


def test_a_pending_request_is_read_however_the_job_asked() -> None:
    q = read_queue((FIX / "show-job-od.txt").read_text(), "main", NOW)
    # the four held jobs are not demand: only the nlp job waiting for resources is
    assert [(p.job, p.account, p.mig_type, p.count, p.time_limit_s) for p in q.pending] == [
        ("7", "nlp", "1g.10gb", 4, 45 * 60)]
    assert 0 <= q.pending[0].age_s < 60
    assert q.untyped == 0


def test_held_jobs_count_once_released() -> None:
    text = (FIX / "show-job-od.txt").read_text().replace("Reason=JobHeldUser", "Reason=Priority")
    asked = {p.job: (p.mig_type, p.count) for p in read_queue(text, "main", NOW).pending}
    assert asked == {"1": ("1g.10gb", 2), "2": ("1g.10gb", 1), "3": ("1g.10gb", 3), "4": ("1g.10gb", 2),
                     "7": ("1g.10gb", 4)}  # --gres, --gpus, --gpus-per-node, --gpus-per-task x 2 tasks


def test_running_jobs_are_read_per_node_with_their_end() -> None:
    q = read_queue((FIX / "show-job-od.txt").read_text(), "main", NOW)
    running = {r.job: r for r in q.running["gpu1"]}
    assert {j: (r.mig_type, r.count, r.account) for j, r in running.items()} == {
        "5": ("1g.10gb", 6, "teaching"), "6": ("1g.10gb", 1, "vision")}
    assert running["5"].limit_s == 26 * 3600 and 26 * 3600 - 60 < running["5"].ends_in_s <= 26 * 3600
    assert read_queue((FIX / "show-job-od.txt").read_text(), "other", NOW).pending == ()


def test_a_job_not_yet_eligible_is_demand_that_reserves_nothing() -> None:
    """squeue(1)'s Dependency and BeginTime: the job is still work to come, but Slurm's backfill does not
    test it, so it holds no node (demand/reserve.py)."""
    line = ("JobId=9 Account=a JobState=PENDING Reason={} Partition=main NumNodes=1 NumTasks=1 "
            "TimeLimit=60 SubmitTime=2026-11-26T05:00:00 TresPerNode=gres/gpu:3g.40gb=2")
    read = {r: read_queue(line.format(r), "main", NOW).pending[0].startable
            for r in ("Priority", "Resources", "Dependency", "DependencyNeverSatisfied", "BeginTime")}
    assert read == {"Priority": True, "Resources": True, "Dependency": False, "DependencyNeverSatisfied": False,
                    "BeginTime": False}


def test_later_slurm_formats_and_time_limits() -> None:
    line = ("JobId=9 Account=a JobState=PENDING Reason=Priority Partition=main NumNodes=1 NumTasks=1 "
            "TimeLimit=2-00:00:00 SubmitTime=2026-11-26T05:00:00 TresPerNode=gres/gpu:3g.40gb=2")
    (p,) = read_queue(line, "main", NOW).pending
    assert (p.mig_type, p.count, p.time_limit_s) == ("3g.40gb", 2, 48 * 3600)
    untyped = line.replace("gres/gpu:3g.40gb=2", "gres:gpu:1")
    assert read_queue(untyped, "main", NOW).untyped == 1
    assert seconds("30") == 1800 and seconds("05:00") == 300 and seconds("UNLIMITED") == float("inf")


def test_a_nodes_extra_and_partitions_are_read() -> None:
    (node,) = [node_info(line) for line in (FIX / "show-node-o.txt").read_text().splitlines() if line.strip()]
    assert node.name == "gpu1" and node.partitions == ("main",) and node.extra == ""
    assert node.gres.startswith("gpu:1g.10gb:7")


def test_a_damaged_planner_history_is_named_and_set_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The planner's record of its switches (demand.json) is checked like every state file: a damaged
    one is said with its file and field, and the planner starts without history."""
    from migd.slurm.ctl import SlurmCtl
    from migd.slurm.demandconf import DemandMode, DemandSettings
    from migd.slurm.demandplan import Planner
    path = tmp_path / "demand.json"
    path.write_text('{"schema": "migd.demand/v1", "switches": {"gpu1": [1795000000, "soon"]}}')
    settings = DemandSettings(DemandMode.ON, "gpu1", ("day", "night"))
    planner = Planner(settings, "main", "gpu1", SlurmCtl("gpu1", lambda argv, t: ""), {}, path)
    assert planner.history == {}
    assert f"{path}" in caplog.text and "switches.gpu1[1]" in caplog.text, caplog.text
    path.write_text('{"schema": "migd.demand/v1", "switches": {"gpu1": [1795000000]}}')
    assert Planner(settings, "main", "gpu1", SlurmCtl("gpu1", lambda argv, t: ""), {}, path).history == {
        "gpu1": [1795000000.0]}

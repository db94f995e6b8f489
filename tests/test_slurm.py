"""Slurm mode on a real one-node Slurm 22.05 cluster over the simulated GPU.

The daemon runs in-process with its virtual clock just after the 19:00 day->night transition;
the Slurm daemons are real (tests/slurm_cluster.py).  Skipped where Slurm is not installed;
.ci/run installs it and sets MIGD_REQUIRE_SLURM=1 so a missing Slurm fails there.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pynvml
import pytest

from migd.api.slurm import Phase
from migd.apply.result import GpuStatus, OnBusy
from migd.ctl.text import daemon_table
from migd.daemon.clock import Clock
from migd.daemon.service import ManualApply
from migd.metrics.daemonstate import slurm_families as _slurm
from migd.sim import world
from migd.sim.state import StateStore
from tests.helpers import PROFILES
from tests.slurm_node import DAY_LAYOUT, NIGHT, NIGHT_LAYOUT, Node

pytestmark = pytest.mark.integration  # a real Slurm cluster


def test_a_running_job_is_not_killed_and_the_switch_waits_for_it(node: Node) -> None:
    c = node.cluster
    finished = c.dir / "finished"
    job = c.submit("gpu:1g.10gb:1", f"sleep 4; touch {finished}")
    c.wait(lambda: c.job_state(job) == "RUNNING", "the job to start")
    d = node.daemon(Clock(NIGHT))
    d.reconcile("transition")
    assert d.slurm is not None
    state = d.slurm.gate.state
    assert state.phase is Phase.DRAINING and state.jobs_waiting == 1 and job in state.reason
    assert "DRAIN" in c.state() and "switching MIG layout to night" in c.show()["Reason"]
    doc = d.status.to_json()["slurm"]
    assert doc["node"] == c.node and doc["phase"] == "draining" and doc["jobs_waiting"] == 1
    metrics = {f.name: {tuple(smp.labels.values()): smp.value for smp in f.samples} for f in _slurm(d.status.slurm)}
    assert metrics["migd_slurm_phase"][(c.node, "draining")] == 1
    assert metrics["migd_slurm_phase"][(c.node, "serving")] == 0
    assert metrics["migd_slurm_jobs_waiting"][(c.node,)] == 1
    gpu = d.status.to_json()["gpus"]["0"]
    assert gpu["state"] == "waiting" and gpu["reason"].startswith("Slurm: waiting for 1 job(s)")
    assert c.job_state(job) == "RUNNING" and node.layout() == DAY_LAYOUT  # nothing touched under the job
    d.reconcile("reconcile")  # a later pass while the job runs: still waiting, still nothing touched
    assert node.layout() == DAY_LAYOUT and state.phase is Phase.DRAINING
    c.wait(lambda: c.job_state(job) == "GONE", "the job to end")
    assert finished.exists()  # it ran to its end: not killed
    d.reconcile("reconcile")
    assert node.layout() == NIGHT_LAYOUT
    show = c.show()
    assert show["Gres"] == "gpu:7g.80gb:1" and "DRAIN" not in show["State"], show
    assert "gpu:7g.80gb:1" in c.cmd("sinfo", "-h", "-N", "-o", "%N %G")
    assert "Type=7g.80gb MultipleFiles=" in c.gres_conf.read_text()
    assert d.slurm.gate.state.phase is Phase.SERVING
    d.reconcile("reconcile")  # nothing to change: the pass compares Slurm's GRES with the layout
    assert d.status.slurm is not None and d.status.slurm.state.gres_in_sync is True
    assert "slurm node gpu1: serving" in daemon_table(d.status.view())
    night_job = c.submit("gpu:7g.80gb:1", f"touch {c.dir / 'night-ran'}")
    c.wait(lambda: (c.dir / "night-ran").exists(), "a job on the night GPU to run")
    assert c.job_state(night_job) in ("GONE", "COMPLETING")


def test_a_job_queued_for_the_day_layout_waits_out_the_night(node: Node) -> None:
    """Queued while the node drains for the night, it stays PENDING through the night (Slurm: no
    node offers its GRES) and runs once the day layout returns.  Slurm 22.05 refuses at submit time
    a job for a GRES type no node has, so a night-time submission needs another node offering it."""
    c = node.cluster
    blocker = c.submit("gpu:1g.10gb:1", "sleep 3")
    c.wait(lambda: c.job_state(blocker) == "RUNNING", "the job to start")
    d = node.daemon(Clock(NIGHT))
    d.reconcile("transition")
    queued = c.submit("gpu:1g.10gb:1", f"touch {c.dir / 'day-ran'}")
    c.wait(lambda: c.job_state(blocker) == "GONE", "the running job to end")
    d.reconcile("reconcile")
    assert node.layout() == NIGHT_LAYOUT and c.job_state(queued) == "PENDING"
    morning = Node.daemon(node, Clock(NIGHT + timedelta(hours=13, minutes=30)))  # Tuesday 08:30:05
    morning.reconcile("transition")
    assert node.layout() == DAY_LAYOUT and c.show()["Gres"] == "gpu:1g.10gb:7"
    c.wait(lambda: (c.dir / "day-ran").exists(), "the queued job to run on the day layout", 60)


def test_slurm_refusing_the_new_gres_leaves_the_node_serving_the_old_layout(node: Node) -> None:
    c = node.cluster
    cmds = c.restart_commands()
    flag = c.dir / "failed-once"
    flaky = c.pid_script("start-slurmd-flaky", f"if [ ! -e {flag} ]; then touch {flag}; exit 1; fi\n"
                         f"exec {cmds['start_slurmd'][0]}\n")
    d = node.daemon(Clock(NIGHT), start_slurmd=flaky)
    result = d.transaction.change(d.desired(), "transition", d._scheduled_options())  # type: ignore[arg-type]
    assert not result.ok and "Slurm did not take the new GRES" in (result.results[0].error or "")
    assert node.layout() == DAY_LAYOUT  # the old layout is back
    show = c.show()
    assert show["Gres"] == "gpu:1g.10gb:7" and "DRAIN" not in show["State"] and "INVALID" not in show["State"]
    assert "Type=1g.10gb" in c.gres_conf.read_text() and "Type=7g" not in c.gres_conf.read_text()
    assert d.slurm is not None and d.slurm.gate.state.phase is Phase.FAILED
    assert show["Comment"].startswith("migd: Slurm did not take the new GRES")  # why, in Slurm itself
    job = c.submit("gpu:1g.10gb:1", f"touch {c.dir / 'served'}")
    c.wait(lambda: (c.dir / "served").exists(), "the node to serve the day layout again")
    assert c.job_state(job) in ("GONE", "COMPLETING")


def test_an_nvml_failure_mid_apply_resumes_the_node_on_its_old_layout(node: Node) -> None:
    c = node.cluster
    world.fail_call(StateStore(node.migctl.state), "nvmlDeviceCreateGpuInstanceWithPlacement",
                      pynvml.NVML_ERROR_UNKNOWN, nth=1)
    d = node.daemon(Clock(NIGHT))
    d.reconcile("transition")
    assert node.layout() == DAY_LAYOUT
    show = c.show()
    assert "DRAIN" not in show["State"] and show["Gres"] == "gpu:1g.10gb:7"
    assert d.slurm is not None and d.slurm.gate.state.phase is Phase.FAILED


def test_a_maint_reservation_keeps_a_too_long_job_from_starting(node: Node) -> None:
    """Ten minutes before the switch the node is reserved from the switch on: a job whose time
    limit would run into it waits; a short one still runs."""
    c = node.cluster
    now = datetime.now().astimezone()
    at = (now + timedelta(minutes=10)).astimezone(ZoneInfo("Asia/Seoul")).strftime("%H:%M")
    d = node.daemon(Clock(now), day_at=at, days="*")
    d.reconcile("reconcile")  # whichever profile is active now, the next transition is <= 10 minutes away
    assert d.slurm is not None and d.slurm.gate.state.reservation is not None
    assert d.slurm.gate.state.reservation in c.cmd("scontrol", "show", "reservation")
    gres = c.show()["Gres"].split(",")[0].rsplit(":", 1)[0] + ":1"  # a GPU of the layout there now
    long_job = c.submit(gres, "true", "-t", "60")
    short_job = c.submit(gres, f"touch {c.dir / 'short-ran'}", "-t", "2")
    c.wait(lambda: (c.dir / "short-ran").exists(), "the short job to run", 30)
    assert c.job_state(long_job) == "PENDING"
    assert c.job_state(short_job) in ("GONE", "COMPLETING")


def test_a_node_whose_slurm_gres_differs_from_its_layout_is_reported(node: Node) -> None:
    """Someone edited slurm.conf: reported (status, metric), not corrected behind Slurm's back."""
    c = node.cluster
    c.conf.write_text(c.conf.read_text().replace("Gres=gpu:1g.10gb:7", "Gres=gpu:1g.10gb:6"))
    lines = c.gres_conf.read_text().splitlines()
    c.gres_conf.write_text("\n".join(lines[:-1]) + "\n")
    for k in ("stop_slurmd", "restart_slurmctld"):
        c.cmd(*c.restart_commands()[k])
    c.wait(lambda: c.ok("scontrol", "ping"), "slurmctld")
    c.cmd(*c.restart_commands()["start_slurmd"])
    c.wait(lambda: c.show().get("Gres") == "gpu:1g.10gb:6", "the edited GRES")
    d = node.daemon(Clock(NIGHT + timedelta(hours=13, minutes=30)))  # day: the layout is as asked
    d.reconcile("reconcile")
    assert node.layout() == DAY_LAYOUT
    assert d.status.slurm is not None and d.status.slurm.state.gres_in_sync is False
    assert "GRES NOT in sync" in daemon_table(d.status.view())


@pytest.mark.parametrize("node", [("gpu2",)], indirect=True)
def test_fleet_waves_wait_for_a_maintenance_slot(node: Node) -> None:
    """max_in_maintenance: 1 and another node of the partition drained: this node does not drain
    (read from Slurm itself, sinfo) while the slot is taken; with a free slot it switches."""
    c = node.cluster
    c.cmd("scontrol", "update", "nodename=gpu2", "state=drain", "reason=other switch")
    d = node.daemon(Clock(NIGHT), waves=1)
    d.reconcile("transition")
    assert d.slurm is not None and "waiting for a maintenance slot" in d.slurm.gate.state.reason
    assert "DRAIN" not in c.state() and node.layout() == DAY_LAYOUT
    d.reconcile("reconcile")  # still one node in maintenance: still waiting
    assert "DRAIN" not in c.state() and node.layout() == DAY_LAYOUT
    d = node.daemon(Clock(NIGHT), waves=2)  # two at a time allowed: one slot is free
    d.reconcile("reconcile")
    assert node.layout() == NIGHT_LAYOUT and c.show()["Gres"] == "gpu:7g.80gb:1"


def test_a_manual_apply_under_slurm_waits_for_the_jobs_and_then_holds(node: Node) -> None:
    """migctl apply through the daemon takes the same path: the node drains, the GPUs report
    BLOCKED with Slurm's reason, and the daemon finishes that switch (not the schedule's) later."""
    c = node.cluster
    job = c.submit("gpu:1g.10gb:1", "sleep 3")
    c.wait(lambda: c.job_state(job) == "RUNNING", "the job to start")
    d = node.daemon(Clock(NIGHT))
    two = d.config.profiles["night-two"]
    result = d.manual_apply(two, ManualApply(on_busy=OnBusy.WAIT))
    assert [r.status for r in result.results] == [GpuStatus.BLOCKED]
    assert "Slurm: waiting for 1 job(s)" in (result.results[0].error or "")
    assert d.status.override is not None and d.status.override.profile.name == "night-two"
    assert node.layout() == DAY_LAYOUT and "DRAIN" in c.state()
    c.wait(lambda: c.job_state(job) == "GONE", "the job to end")
    d.reconcile("reconcile")
    assert node.layout() == [("3g.40gb", 0, ["3g.40gb"]), ("3g.40gb", 4, ["3g.40gb"])]
    assert c.show()["Gres"] == "gpu:3g.40gb:2" and "DRAIN" not in c.state()


def test_on_busy_refuse_does_not_drain_a_node_with_gpu_jobs(node: Node) -> None:
    c = node.cluster
    job = c.submit("gpu:1g.10gb:1", "sleep 3")
    c.wait(lambda: c.job_state(job) == "RUNNING", "the job to start")
    d = node.daemon(Clock(NIGHT))
    result = d.manual_apply(d.config.profiles["night"], ManualApply(on_busy=OnBusy.REFUSE))
    assert [r.status for r in result.results] == [GpuStatus.BLOCKED]
    assert "on_busy is refuse; the node was not drained" in (result.results[0].error or "")
    assert "DRAIN" not in c.state() and d.status.override is None and node.layout() == DAY_LAYOUT


def test_on_busy_force_requeues_the_jobs_after_busy_timeout(node: Node) -> None:
    """force (never the default): after busy_timeout the GPU jobs are requeued, not killed: they
    are back in the queue, and the switch goes ahead."""
    c = node.cluster
    job = c.submit("gpu:1g.10gb:1", "sleep 300")
    c.wait(lambda: c.job_state(job) == "RUNNING", "the job to start")
    d = node.daemon(Clock(NIGHT))
    d.manual_apply(d.config.profiles["night"], ManualApply(on_busy=OnBusy.FORCE, busy_timeout_s=0.0))
    c.wait(lambda: c.job_state(job) != "RUNNING", "the job to be requeued")
    if node.layout() != NIGHT_LAYOUT:  # the requeue took a moment: the next pass switches
        d.reconcile("reconcile")
    assert node.layout() == NIGHT_LAYOUT and c.show()["Gres"] == "gpu:7g.80gb:1"
    assert c.job_state(job) in ("PENDING", "REQUEUED")  # back in the queue for a day GPU, not lost
    assert "Restarts=1" in c.cmd("scontrol", "show", "job", job)  # requeued once by migd


def test_a_switch_left_open_by_a_stopped_migd_is_finished_at_restart(node: Node) -> None:
    """migd stopped after the apply, before Slurm took the GRES: the node is drained and its
    layout is already night.  The restarted daemon publishes the GRES and resumes the node."""
    c = node.cluster
    c.cmd("scontrol", "update", f"nodename={c.node}", "state=drain", "reason=migd: switching MIG layout to night")
    assert node.migctl("apply", str(PROFILES / "night.yaml")).code == 0
    (node.migctl.state_dir / "slurm.json").write_text(
        '{"schema": "migd.slurm/v1", "phase": "switching", "profile": "night", "was_serving": true}')
    d = node.daemon(Clock(NIGHT))
    d.reconcile("start")
    show = c.show()
    assert show["Gres"] == "gpu:7g.80gb:1" and "DRAIN" not in show["State"]
    assert d.slurm is not None and d.slurm.gate.state.phase is Phase.SERVING
    assert "finished after a restart" in d.slurm.gate.state.reason


def test_slurm_files_with_bytes_that_are_not_utf8_switch_and_keep_them(node: Node) -> None:
    """An operator's Latin-1 comment in slurm.conf and gres.conf (Slurm never decodes its files): the
    switch goes through and both files keep those bytes exactly; only the node's GRES change."""
    c = node.cluster
    comment = b"# Rechenknoten f\xfcr M\xfcller (Latin-1)\n"
    for path in (c.conf, c.gres_conf):
        path.write_bytes(comment + path.read_bytes())
    conf_before = c.conf.read_bytes()
    d = node.daemon(Clock(NIGHT))
    d.reconcile("transition")
    assert node.layout() == NIGHT_LAYOUT and c.show()["Gres"] == "gpu:7g.80gb:1"
    assert d.slurm is not None and d.slurm.gate.state.phase is not Phase.FAILED
    for path in (c.conf, c.gres_conf):
        assert path.read_bytes().startswith(comment), path
    before, after = conf_before.splitlines(), c.conf.read_bytes().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith(b"NodeName=gpu1 ") and b"Gres=gpu:7g.80gb:1" in changed[0][1]

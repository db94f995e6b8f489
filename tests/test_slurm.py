"""Slurm mode on a real one-node Slurm 22.05 cluster over the simulated GPU (issue 15).

The daemon runs in-process with its virtual clock just after the 19:00 day->night transition;
the Slurm daemons are real (tests/slurm_cluster.py).  Skipped where Slurm is not installed;
.ci/run installs it and sets MIGD_REQUIRE_SLURM=1 so a missing Slurm fails there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pynvml
import pytest

from migd.api.slurm import Phase
from migd.apply.result import GpuStatus, OnBusy
from migd.daemon.clock import Clock
from migd.daemon.config import load_config
from migd.daemon.service import Daemon, ManualApply
from migd.hardware.nvml.backend import NvmlBackend
from migd.hardware.ports import read_state
from migd.metrics.daemonstate import slurm_families as _slurm
from migd.report_text import daemon_table
from migd.sim import control
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore
from migd.slurm.gres import gres_conf, node_gres, read_minors, records
from tests.helpers import PROFILES, Migctl
from tests.slurm_cluster import SlurmCluster, skip_without_slurm

FLEET = "single-a100"
NIGHT = datetime.fromisoformat("2026-11-23T19:00:05+09:00")  # Monday, just after the night transition
DAY_LAYOUT = [("1g.10gb", s, ["1g.10gb"]) for s in range(7)]
NIGHT_LAYOUT = [("7g.80gb", 0, ["7g.80gb"])]
CONFIG = """\
timezone: Asia/Seoul
profiles_dir: profiles
schedule:
  - {{profile: day,   at: "{day_at}", days: "{days}"}}
  - {{profile: night, at: "19:00", days: "{days}"}}
metrics: {{enabled: false}}
"""


@dataclass
class Node:
    cluster: SlurmCluster
    migctl: Migctl
    backend: NvmlBackend
    tmp: Path

    def daemon(self, clock: Clock, day_at: str = "08:30", days: str = "mon-fri", waves: int | None = None,
               **commands: list[str]) -> Daemon:
        cfg = self.tmp / "migd.yaml"
        cfg.write_text(CONFIG.format(day_at=day_at, days=days) + self.cluster.slurm_section(waves, **commands))
        os.chmod(cfg, 0o644)
        return Daemon(load_config(cfg), self.backend, self.migctl.state_dir, clock)

    def layout(self) -> list[tuple[str, int, list[str]]]:
        return self.migctl.layout()[0]


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    skip_without_slurm()
    others = tuple(getattr(request, "param", ()))
    m = Migctl(tmp_path, FLEET)
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    (tmp_path / "profiles").mkdir()
    for f in PROFILES.glob("*.yaml"):
        shutil.copy(f, tmp_path / "profiles" / f.name)
        os.chmod(tmp_path / "profiles" / f.name, 0o644)
    backend = sim_backend(m.state, FLEET)
    cluster = SlurmCluster(gpus=1)
    try:
        recs = records([read_state(backend, g) for g in backend.list_gpus()], backend.minor_number,
                       read_minors(cluster.mig_minors), cluster.dev)
        cluster.start(node_gres(recs), gres_conf(cluster.node, recs, "day"), others)
        yield Node(cluster, m, backend, tmp_path)
    finally:
        backend.close()
        cluster.stop()


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
    assert "slurm node gpu1: serving" in daemon_table(d.status.to_json())
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
    result = d._change(d.desired(), "transition", d._scheduled_options())  # type: ignore[arg-type]
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
    control.fail_call(StateStore(node.migctl.state), "nvmlDeviceCreateGpuInstanceWithPlacement",
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
    assert "GRES NOT in sync" in daemon_table(d.status.to_json())


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


ASKS = [("--gres=gpu:1g.10gb:1",), ("--gpus=1g.10gb:1",), ("--gpus-per-node=1g.10gb:1",),
        ("--gpus-per-task=1g.10gb:1", "--ntasks=1")]  # (sbatch: --gpus-per-task needs -n)


@pytest.mark.parametrize("ask", ASKS, ids=[a[0] for a in ASKS])
def test_a_job_holding_a_gpu_waits_the_switch_however_it_asked(node: Node, ask: tuple[str, ...]) -> None:
    """squeue's %b shows per-node --gres only (N/A for --gpus, --gpus-per-node, --gpus-per-task): such a
    job was taken for CPU-only, its GPU changed under it and Slurm requeued it.  What Slurm allocated
    (the job's TRES) is read instead, for every way a job can ask (issue 32, item 1)."""
    c = node.cluster
    job = c.submit_asking(ask[0], "sleep 60", *ask[1:])
    c.wait(lambda: c.job_state(job) == "RUNNING", "the job to start")
    d = node.daemon(Clock(NIGHT))
    d.reconcile("transition")
    assert d.slurm is not None
    state = d.slurm.gate.state
    assert state.phase is Phase.DRAINING and state.jobs_waiting == 1 and job in state.reason, state
    assert c.job_state(job) == "RUNNING" and node.layout() == DAY_LAYOUT  # nothing touched under the job
    c.cmd("scancel", job)


def test_an_operators_resume_while_migd_waits_is_not_overridden(node: Node) -> None:
    """An admin resumed the node by hand while migd waited for a job; the job ended and migd changed the
    GPUs of a node Slurm could start a job on at any moment.  Right before changing GPUs migd checks the
    node is still drained, else stops and says why (issue 32, item 2)."""
    c = node.cluster
    job = c.submit("gpu:1g.10gb:1", "sleep 60")
    c.wait(lambda: c.job_state(job) == "RUNNING", "the job to start")
    d = node.daemon(Clock(NIGHT))
    d.reconcile("transition")
    assert d.slurm is not None and d.slurm.gate.state.phase is Phase.DRAINING
    c.cmd("scontrol", "update", f"nodename={c.node}", "state=resume")  # the operator
    c.cmd("scancel", job)
    c.wait(lambda: c.job_state(job) == "GONE", "the job to end")
    d.reconcile("transition")
    state = d.slurm.gate.state
    assert node.layout() == DAY_LAYOUT, "GPUs changed on a node Slurm may start jobs on"
    assert state.phase is Phase.FAILED and "resumed" in state.reason, state


def test_a_persistent_slurm_error_is_retried_with_backoff_not_in_a_loop(node: Node) -> None:
    """Slurm refusing the new GRES every time (gres.conf not writable, slurmd failing): migd drained the
    node and changed its GPUs hundreds of times in seconds, its own MIG changes waking the next pass.
    A failed switch now waits 30 s, then twice as long each time (at most 30 minutes) (issue 32, item 6)."""
    c = node.cluster
    count = c.dir / "starts"
    failing = c.pid_script("start-slurmd-failing", f"echo x >> {count}; exit 1\n")
    d = node.daemon(Clock(NIGHT), start_slurmd=failing)
    store = StateStore(node.migctl.state)
    d.reconcile("transition")
    assert d.slurm is not None and d.slurm.gate.state.phase is Phase.FAILED
    assert "next try in 30s" in d.slurm.gate.state.reason, d.slurm.gate.state.reason
    mutations, drains = store.read().mutations, count.read_text().count("x")  # (the try, and its restore)
    for _ in range(5):  # the passes its own MIG changes wake at once
        d.reconcile("reconcile")
    assert store.read().mutations == mutations and count.read_text().count("x") == drains  # no new try
    assert node.layout() == DAY_LAYOUT and "DRAIN" not in c.show()["State"]


def test_a_drain_left_by_a_migd_that_died_is_undone(node: Node) -> None:
    """migd killed right after it drained, before recording it: the next migd took its own drain for an
    operator's ("the node was not serving") and never resumed the node.  A drain with migd's reason is
    migd's (issue 32, item 5)."""
    c = node.cluster
    c.cmd("scontrol", "update", f"nodename={c.node}", "state=drain", "reason=migd: switching MIG layout to night")
    d = node.daemon(Clock(NIGHT))  # a fresh migd: its state file says serving
    d.reconcile("transition")
    assert d.slurm is not None and d.slurm.gate.state.phase is Phase.SERVING, d.slurm.gate.state
    assert node.layout() == NIGHT_LAYOUT
    c.wait(lambda: "DRAIN" not in c.show()["State"], "the node to be resumed")


def test_an_operators_own_drain_is_left_to_the_operator(node: Node) -> None:
    c = node.cluster
    c.cmd("scontrol", "update", f"nodename={c.node}", "state=drain", "reason=disk replacement")
    d = node.daemon(Clock(NIGHT))
    d.reconcile("transition")
    assert node.layout() == NIGHT_LAYOUT and "DRAIN" in c.show()["State"] and c.show()["Reason"].startswith("disk")


def test_a_node_whose_gres_and_gpus_disagree_stays_drained(node: Node) -> None:
    """Slurm refused the new GRES and putting the old layout back failed too (NVML): migd resumed the node
    advertising gpu:1g.10gb:7 over one 7g instance, and Slurm started a job there.  Such a node stays
    drained, its reason naming the mismatch (issue 32, item 3)."""
    c = node.cluster
    failing = c.pid_script("start-slurmd-failing", "exit 1\n")
    d = node.daemon(Clock(NIGHT), start_slurmd=failing)
    ops = len(node.migctl("plan", str(PROFILES / "night.yaml"), "-o", "json").json()["gpus"][0]["operations"])
    control.fail_call(StateStore(node.migctl.state), "*mutation*", 999, nth=ops + 1)  # the restore's first step
    d.reconcile("transition")
    assert node.layout() != DAY_LAYOUT  # the old layout could not be put back
    show = c.show()
    assert "DRAIN" in show["State"] and "GRES and its GPUs disagree" in show["Reason"], show
    assert d.slurm is not None and d.slurm.gate.state.phase is Phase.FAILED


def test_a_failed_job_listing_is_not_called_a_failed_drain(node: Node, tmp_path: Path) -> None:
    """The node drained, then squeue failed: migd said "cannot drain: squeue ...".  It names the step that
    failed, and changes no GPU while it cannot know which jobs hold them (issue 32, item 8)."""
    c = node.cluster
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "squeue").write_text("#!/bin/sh\necho 'squeue: error: slurm_load_jobs error: Socket timed out' >&2\n"
                                 "exit 1\n")
    (fake / "squeue").chmod(0o755)
    cfg = node.tmp / "migd.yaml"
    section = c.slurm_section().replace(f"env: {{SLURM_CONF: {c.conf}}}",
                                        f"env: {{SLURM_CONF: {c.conf}, PATH: '{fake}:{os.environ['PATH']}'}}")
    cfg.write_text(CONFIG.format(day_at="08:30", days="mon-fri") + section)
    cfg.chmod(0o644)
    d = Daemon(load_config(cfg), node.backend, node.migctl.state_dir, Clock(NIGHT))
    d.reconcile("transition")
    assert d.slurm is not None
    reason = d.slurm.gate.state.reason
    assert reason.startswith("cannot list the node's jobs: squeue") and "Socket timed out" in reason, reason
    assert node.layout() == DAY_LAYOUT and "DRAIN" in c.show()["State"]

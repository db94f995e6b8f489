"""Slurm mode under the faults a real cluster meets, on the real one-node Slurm 22.05
cluster of tests/slurm_cluster.py, with migd's daemon in-process over the simulated GPU."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from migd.api.slurm import Phase
from migd.apply.result import GpuStatus, OnBusy
from migd.config.migdyaml import load_config
from migd.daemon import loop
from migd.daemon.clock import Clock
from migd.daemon.service import ManualApply
from migd.errors import ValidationError
from migd.isolation.events import EventCounters
from migd.isolation.watch import FaultWatch
from migd.metrics.sampler import Sampler
from migd.sim import world
from migd.sim.state import StateStore
from tests.helpers import PROFILES
from tests.slurm_node import CONFIG, DAY_LAYOUT, NIGHT, NIGHT_LAYOUT, Node

pytestmark = pytest.mark.integration  # a real Slurm cluster

ASKS = [("--gres=gpu:1g.10gb:1",), ("--gpus=1g.10gb:1",), ("--gpus-per-node=1g.10gb:1",),
        ("--gpus-per-task=1g.10gb:1", "--ntasks=1")]  # (sbatch: --gpus-per-task needs -n)


@pytest.mark.parametrize("ask", ASKS, ids=[a[0] for a in ASKS])
def test_a_job_holding_a_gpu_waits_the_switch_however_it_asked(node: Node, ask: tuple[str, ...]) -> None:
    """squeue's %b shows per-node --gres only (N/A for --gpus, --gpus-per-node, --gpus-per-task): such a
    job was taken for CPU-only, its GPU changed under it and Slurm requeued it.  What Slurm allocated
    (the job's TRES) is read instead, for every way a job can ask."""
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
    node is still drained, else stops and says why."""
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
    A failed switch now waits 30 s, then twice as long each time (at most 30 minutes)."""
    c = node.cluster
    count = c.dir / "starts"
    failing = c.pid_script("start-slurmd-failing", f"echo x >> {count}; exit 1\n")
    d = node.daemon(Clock(NIGHT), start_slurmd=failing)
    store = StateStore(node.migctl.state)
    d.reconcile("transition")
    assert d.slurm is not None and d.slurm.gate.state.phase in (Phase.FAILED, Phase.RESUMING)
    assert "next try in 30s" in d.slurm.gate.state.reason, d.slurm.gate.state.reason  # (resumed once slurmd is)
    mutations, drains = store.read().mutations, count.read_text().count("x")  # (the try, and its restore)
    for _ in range(5):  # the passes its own MIG changes wake at once
        d.reconcile("reconcile")
    assert store.read().mutations == mutations and count.read_text().count("x") == drains  # no new try
    assert node.layout() == DAY_LAYOUT and "DRAIN" not in c.show()["State"]
    assert d.slurm.gate.state.phase is Phase.FAILED and "next try in 30s" in d.slurm.gate.state.reason


def test_a_drain_left_by_a_migd_that_died_is_undone(node: Node) -> None:
    """migd killed right after it drained, before recording it: the next migd took its own drain for an
    operator's ("the node was not serving") and never resumed the node.  A drain with migd's reason is
    migd's."""
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
    drained, its reason naming the mismatch."""
    c = node.cluster
    failing = c.pid_script("start-slurmd-failing", "exit 1\n")
    d = node.daemon(Clock(NIGHT), start_slurmd=failing)
    ops = len(node.migctl("plan", str(PROFILES / "night.yaml"), "-o", "json").json()["gpus"][0]["operations"])
    world.fail_call(StateStore(node.migctl.state), "*mutation*", 999, nth=ops + 1)  # the restore's first step
    d.reconcile("transition")
    assert node.layout() != DAY_LAYOUT  # the old layout could not be put back
    show = c.show()
    assert "DRAIN" in show["State"] and "GRES and its GPUs disagree" in show["Reason"], show
    assert d.slurm is not None and d.slurm.gate.state.phase is Phase.FAILED


def test_a_failed_job_listing_is_not_called_a_failed_drain(node: Node) -> None:
    """The node drained, then squeue failed: migd said "cannot drain: squeue ...".  It names the step that
    failed, and changes no GPU while it cannot know which jobs hold them."""
    c = node.cluster
    fake = node.fake("squeue", "echo 'squeue: error: slurm_load_jobs error: Socket timed out' >&2\nexit 1\n")
    d = node.daemon(Clock(NIGHT), path_first=fake)
    d.reconcile("transition")
    assert d.slurm is not None
    reason = d.slurm.gate.state.reason
    assert reason.startswith("cannot list the node's jobs: squeue") and "Socket timed out" in reason, reason
    assert node.layout() == DAY_LAYOUT and "DRAIN" in c.show()["State"]


def _reserving_night(now: datetime) -> tuple[str, datetime]:
    """A schedule whose night transition is 10 minutes from ``now`` (a MAINT reservation is made for it)
    and whose day transition fired 12 hours before that; and that night transition's time."""
    seoul = ZoneInfo("Asia/Seoul")
    at = (now + timedelta(minutes=10)).astimezone(seoul).replace(second=0, microsecond=0)
    day = at - timedelta(hours=12)
    return (f'  - {{profile: night, at: "{at:%H:%M}", days: "*"}}\n'
            f'  - {{profile: day, at: "{day:%H:%M}", days: "*"}}\n'), at


def test_slurmctld_killed_as_migd_resumes_the_node_is_retried_until_slurm_confirms(node: Node) -> None:
    """slurmctld SIGKILLed as migd resumed the node: migd recorded "serving", the node stayed drained, its
    MAINT reservation stayed, and nothing retried.  The outcome is recorded first (phase resuming) and the
    resume and the reservation's removal are retried at each pass until Slurm confirms them."""
    c = node.cluster
    mark = c.dir / "killed"
    fake = node.fake("scontrol", f'case "$*" in *state=resume*) if [ ! -e {mark} ]; then touch {mark}; '
                     f'kill -9 $(cat {c.dir}/run/slurmctld.pid); fi;; esac\nexec {shutil.which("scontrol")} "$@"\n')
    schedule, at = _reserving_night(datetime.now().astimezone())
    ahead = node.daemon(Clock(datetime.now().astimezone()), schedule=schedule, path_first=fake)
    ahead.reconcile("reconcile")  # day holds; the night transition is 10 minutes away: reserved
    assert ahead.slurm is not None and node.layout() == DAY_LAYOUT
    reservation = ahead.slurm.gate.state.reservation
    assert reservation is not None and reservation in c.cmd("scontrol", "show", "reservation")

    d = node.daemon(Clock(at + timedelta(seconds=5)), schedule=schedule, path_first=fake)
    d.reconcile("transition")
    assert mark.exists() and node.layout() == NIGHT_LAYOUT
    assert d.slurm is not None and d.slurm.gate.state.phase is Phase.RESUMING, d.slurm.gate.state
    assert "not confirmed" in d.slurm.gate.state.reason and d.status.to_json()["slurm"]["phase"] == "resuming"
    d.reconcile("reconcile")  # slurmctld still down: still resuming, never "serving"
    assert d.slurm.gate.state.phase is Phase.RESUMING and d.slurm_pending

    c.run_sbin("slurmctld")  # back
    c.wait(lambda: c.ok("scontrol", "ping"), "slurmctld to answer again")
    gate = d.slurm.gate

    def retried() -> bool:  # the daemon's passes (Slurm refuses a resume until slurmd registers again)
        d.reconcile("reconcile")
        return gate.state.phase is not Phase.RESUMING
    c.wait(retried, "migd's retries to resume the node", 60)
    assert d.slurm.gate.state.phase is Phase.SERVING, d.slurm.gate.state
    assert d.slurm.gate.state.reservation is None and not d.slurm_pending
    show = c.show()
    assert "DRAIN" not in show["State"] and show["Gres"] == "gpu:7g.80gb:1", show
    assert reservation not in c.cmd("scontrol", "show", "reservation")


def test_a_stale_reservation_does_not_stop_the_next_one(node: Node) -> None:
    """A reservation whose removal failed stayed in migd's state: its name made every later switch skip
    reserving ahead.  One for a transition past is removed and forgotten."""
    c = node.cluster
    (node.migctl.state_dir / "slurm.json").write_text(json.dumps({
        "schema": "migd.slurm/v1", "phase": "serving", "reservation": "migd-gpu1-1795000000",
        "reserved_for": 1795000000.0}))  # (a v1 file, as a migd before v2 left it)
    schedule, at = _reserving_night(datetime.now().astimezone())
    d = node.daemon(Clock(datetime.now().astimezone()), schedule=schedule)
    d.reconcile("reconcile")
    assert d.slurm is not None
    assert d.slurm.gate.state.reservation == f"migd-{c.node}-{int(at.timestamp())}"
    assert d.slurm.gate.state.reservation in c.cmd("scontrol", "show", "reservation")


def _hanging_controller(node: Node) -> tuple[list[str], Path]:
    """A start-slurmd command that SIGSTOPs slurmctld first (once): the switch's wait for the node to
    register then hangs on a controller that accepts connections and never answers."""
    c = node.cluster
    mark = c.dir / "controller-stopped"
    start = c.restart_commands()["start_slurmd"][0]
    return c.pid_script("start-slurmd-hanging", f"if [ ! -e {mark} ]; then touch {mark}; "
                        f"kill -STOP $(cat {c.dir}/run/slurmctld.pid); fi\nexec {start}\n"), mark


def _continue_controller(node: Node) -> None:
    os.kill(int((node.cluster.dir / "run" / "slurmctld.pid").read_text()), signal.SIGCONT)


def test_a_hung_controller_does_not_stop_the_sampler_or_the_fault_watch(node: Node) -> None:
    """slurmctld SIGSTOPped while migd waited for the node to register: the NVML sampler stopped and a
    fatal Xid was handled 50 s late, as the wait held the lock they need.  A Slurm wait lets go of the
    hardware lock."""
    hanging, mark = _hanging_controller(node)
    d = node.daemon(Clock(NIGHT), start_slurmd=hanging)
    watch = FaultWatch(node.backend, d.hw_lock, EventCounters(), d.status.unhealthy)
    watch.start()
    switch = threading.Thread(target=d.reconcile, args=("transition",))
    try:
        switch.start()
        node.cluster.wait(mark.exists, "the switch to reach the hung controller")
        time.sleep(1)  # well inside the registration wait
        assert switch.is_alive() and d.slurm is not None and d.slurm.gate.state.phase is Phase.SWITCHING
        sampled = threading.Thread(target=Sampler(node.backend, d.hw_lock, d.applier.owners.load).sample_once)
        sampled.start()
        sampled.join(10)
        assert not sampled.is_alive(), "the sampler waited on the Slurm switch"
        world.raise_xid(StateStore(node.migctl.state), 0, 79)
        node.cluster.wait(lambda: d.status.unhealthy.snapshot() != {}, "the fault watch to mark the GPU", 10)
        assert switch.is_alive()  # (the wait goes on: slurmctld is still stopped)
    finally:
        _continue_controller(node)
        switch.join(60)
        watch.stop()
    assert not switch.is_alive()


def test_sigterm_during_the_wait_stops_it_and_the_next_start_undoes_what_slurm_refuses(node: Node) -> None:
    """SIGTERM was ignored until register_timeout.  It now ends the wait, leaving the switch recorded; the
    next start publishes the GRES again and, when Slurm refuses it, puts back both the files and the GPUs
    from the layouts recorded before the switch."""
    c = node.cluster
    hanging, mark = _hanging_controller(node)
    d = node.daemon(Clock(NIGHT), start_slurmd=hanging)
    switch = threading.Thread(target=d.reconcile, args=("transition",))
    switch.start()
    try:
        c.wait(mark.exists, "the switch to reach the hung controller")
        d.events.terminate()  # what migd's SIGTERM handler does
        switch.join(15)  # (register_timeout is 30s)
        assert not switch.is_alive(), "SIGTERM waited for register_timeout"
    finally:
        _continue_controller(node)
        switch.join(60)
    saved = json.loads((node.migctl.state_dir / "slurm.json").read_text())
    assert saved["phase"] == "switching" and saved["before"], saved  # recorded, for the next start
    assert node.layout() == NIGHT_LAYOUT and "Type=7g.80gb" in c.gres_conf.read_text()

    flag = c.dir / "refused-once"
    flaky = c.pid_script("start-slurmd-flaky", f"if [ ! -e {flag} ]; then touch {flag}; exit 1; fi\n"
                         f"exec {c.restart_commands()['start_slurmd'][0]}\n")
    after = node.daemon(Clock(NIGHT), start_slurmd=flaky)
    after.reconcile("start")
    assert after.slurm is not None
    assert node.layout() == DAY_LAYOUT, "the GPUs stayed on the layout Slurm refused"
    assert "Type=1g.10gb" in c.gres_conf.read_text() and "Type=7g" not in c.gres_conf.read_text()
    c.wait(lambda: (after.reconcile("reconcile"), after.slurm is not None and not after.slurm_pending)[1],
           "the node's resume to be confirmed", 60)
    assert after.slurm.gate.state.phase is Phase.FAILED and "previous layout restored" in after.slurm.gate.state.reason
    show = c.show()
    assert show["Gres"] == "gpu:1g.10gb:7" and "DRAIN" not in show["State"], show


def test_a_command_past_command_timeout_does_not_leave_slurmd_down(node: Node) -> None:
    """The slurmctld restart ran past command_timeout while slurmd was stopped: the switch and its
    rollback both gave up with slurmd down.  slurmd is started again whatever failed after it was
    stopped."""
    c = node.cluster
    slow = c.pid_script("restart-slurmctld-slow", "sleep 30\n")
    d = node.daemon(Clock(NIGHT), restart_slurmctld=slow, settings="  command_timeout: 2s\n")
    d.reconcile("transition")
    assert d.slurm is not None and "timed out" in d.slurm.gate.state.reason, d.slurm.gate.state.reason
    pid = int(c.pid_file().read_text())
    os.kill(pid, 0)  # slurmd runs
    assert node.layout() == DAY_LAYOUT
    c.wait(lambda: (d.reconcile("reconcile"), not d.slurm_pending)[1], "the node's resume", 60)
    c.wait(lambda: "IDLE" in c.state() and "DRAIN" not in c.state(), "the node to serve again", 60)


def test_register_timeout_must_stay_under_the_watchdogs_limit(tmp_path: Path) -> None:
    cfg = tmp_path / "migd.yaml"
    cfg.write_text(CONFIG.format(day_at="08:30", days="mon-fri") + "slurm:\n  node: gpu1\n  register_timeout: 5m\n")
    (tmp_path / "profiles").mkdir()
    for f in PROFILES.glob("*.yaml"):
        shutil.copy(f, tmp_path / "profiles" / f.name)
    with pytest.raises(ValidationError) as e:
        load_config(cfg)
    assert "register_timeout" in str(e.value) and "under 120s" in str(e.value) and ":" in str(e.value), e.value


def test_a_blocked_manual_apply_goes_on_when_its_job_ends_not_an_interval_later(node: Node) -> None:
    """``migctl apply`` through migd under Slurm waited for a job; the job ended and the switch came a
    reconcile interval (here an hour) later, as the loop slept on the wait it had worked out before the
    manual apply.  The loop works out its wait again after a manual apply."""
    c = node.cluster
    d = node.daemon(Clock(NIGHT - timedelta(hours=9)), top="reconcile_interval: 1h\n")  # Monday 10:00
    d.reconcile("start")  # (the loop's first pass, done here so the test knows when it is over): day holds
    assert d.status.blocked_since is None and not d.slurm_pending
    d.start = lambda: None  # type: ignore[method-assign]
    runner = threading.Thread(target=loop.run, args=(d,))
    runner.start()
    job = c.submit("gpu:1g.10gb:1", "sleep 3")
    c.wait(lambda: c.job_state(job) == "RUNNING", "the job to start")
    try:  # the loop sleeps now, on the wait it worked out: an hour (the reconcile interval)
        result = d.manual_apply(d.config.profiles["night-two"], ManualApply(on_busy=OnBusy.WAIT))
        assert [r.status for r in result.results] == [GpuStatus.BLOCKED]
        c.wait(lambda: c.job_state(job) == "GONE", "the job to end")
        c.wait(lambda: node.layout() == [("3g.40gb", 0, ["3g.40gb"]), ("3g.40gb", 4, ["3g.40gb"])],
               "the switch after the job ended", 60)
    finally:
        d.events.terminate()
        runner.join(30)


def test_a_slurm_without_its_json_serializer_is_said_at_start(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    """A Slurm built without json-c has no serializer/json plugin: ``squeue --json`` fails, so every switch
    with a job on the node waits, and nothing said so before that switch.  migd says it at start.  The real
    squeue, its plugin directory without that one plugin."""
    c = node.cluster
    config = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in
                                                    c.cmd("scontrol", "show", "config").splitlines())}
    plugins = node.tmp / "plugins"
    plugins.mkdir()
    for f in Path(config["PluginDir"]).iterdir():
        if f.name != "serializer_json.so":
            (plugins / f.name).symlink_to(f)
    conf = node.tmp / "slurm-no-json.conf"
    conf.write_text(c.conf.read_text() + f"PluginDir={plugins}\n")
    for command in ("squeue", "sinfo"):
        fake = node.fake(command, f'exec env SLURM_CONF={conf} {shutil.which(command)} "$@"\n')
    assert "Unable to find plugin: serializer/json" in c.cmd("sh", "-c", f"{fake}/squeue --json 2>&1 || true")
    d = node.daemon(Clock(NIGHT - timedelta(hours=10)), path_first=fake)  # (a weekday's day: nothing to switch)
    caplog.set_level(logging.WARNING, logger="migd")
    d.start()
    (said,) = [r.getMessage() for r in caplog.records if "serializer" in r.getMessage()]
    assert said.startswith("Slurm: sinfo --json exited 1: ") and "Unable to find plugin: serializer/json" in said
    assert "until it can, squeue --json fails and a switch while jobs run on this node waits" in said, said
    assert node.layout() == DAY_LAYOUT

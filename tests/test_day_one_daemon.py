"""Issue 39, second pass: what ``migctl daemon`` and migd's log say while work is in the way, through the
real migd and migctl processes against the simulator.  A normal wait for busy work was read as drift
and reported as "last apply: blocked" while seven of eight GPUs switched; a manual apply waiting inside
migd was not shown, and its Ctrl-C was reported as "blocked" with advice that did not apply; migd.yaml's
``on_busy: force`` did not say whom it stopped; a profile for one GPU hid the other seven; ``--now`` put
two clocks on one screen; a manual apply was logged as "(reconcile)"."""

from __future__ import annotations

import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.sim import world
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import MIGCTL, PROFILES

pytestmark = pytest.mark.integration  # real migd daemons


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path)
    yield m
    m.close()


@pytest.fixture
def dgx(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="dgx-a100", reconcile_interval="1s", busy_timeout="30m")
    yield m
    m.close()


# -- 2: a busy wait is a wait, not drift ------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["correct", "report"])
def test_a_busy_wait_is_waiting_never_drift(dgx: MigdProcess, mode: str) -> None:
    """At 19:00 GPU 2 still runs a notebook: the other seven switch, GPU 2 waits.  Passes every second
    (reconcile_interval 1s, and the wait's own retries) must not call it drift; `migctl daemon` says
    which PIDs it waits for, and that the last apply changed seven GPUs."""
    dgx.write_config(reconcile_interval="1s", reconcile=mode)
    assert dgx.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    store = StateStore(dgx.migctl.state)
    pid = world.start_process(store, 2, store.read().gpus[2].gis[0].id, 0)
    dgx.start(now="2026-11-23T18:59:58")
    dgx.wait_ready()
    dgx.wait_until(lambda: dgx.daemon_doc()["gpus"].get("2", {}).get("state") == "waiting"
                   and dgx.daemon_doc()["last_apply"] is not None, timeout=30)
    time.sleep(5)  # five reconcile passes and the wait's retries
    log = dgx.log.read_text()
    assert "drift" not in log, [ln for ln in log.splitlines() if "drift" in ln]
    doc = dgx.daemon_doc()
    assert doc["gpus"]["2"]["state"] == "waiting" and doc["gpus"]["2"]["pids"] == [pid], doc["gpus"]["2"]
    assert [g["state"] for i, g in doc["gpus"].items() if i != "2"] == ["converged"] * 7
    last = doc["last_apply"]
    assert last["changed"] == 7 and last["waiting"] == {"2": [pid]} and last["trigger"] == "transition", last
    table = dgx.migctl.process("daemon").stdout
    assert f"GPU 2 waiting for PIDs {pid}" in table and f"GPU 2: waiting for PIDs {pid} since" in table, table
    assert f"last apply: night: 7 GPU(s) changed, GPU 2 waiting for PIDs {pid}" in table, table
    assert "drifted" not in table and "last apply: night: blocked" not in table, table
    world.stop_process(store, pid)
    dgx.wait_until(lambda: dgx.daemon_doc()["gpus"]["2"]["state"] == "converged", timeout=30)
    assert "drift" not in dgx.log.read_text()


def _sleeper(m: MigdProcess, gpu: int = 0) -> subprocess.Popen[bytes]:
    """A real process on GPU ``gpu``'s first instance (the simulated driver lists it until it exits)."""
    proc = subprocess.Popen(["sleep", "300"])
    store = StateStore(m.migctl.state)
    world.start_process(store, gpu, store.read().gpus[gpu].gis[0].id, 0, pid=proc.pid)
    return proc


# -- 3: migd.yaml's force ---------------------------------------------------------------------------------
def test_on_busy_force_in_the_config_forces_after_busy_timeout_and_migctl_daemon_says_whom(
        migd: MigdProcess) -> None:
    """migd.yaml's force is the same force: after busy_timeout; `migctl daemon` names what it stopped."""
    migd.write_config(on_busy="force", busy_timeout="3s", reconcile_interval="1h")
    assert migd.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    proc = _sleeper(migd)
    try:
        migd.start(now="2026-11-23T18:59:59")
        migd.wait_ready()
        migd.wait_until(lambda: migd.daemon_doc()["gpus"].get("0", {}).get("state") == "waiting", timeout=30)
        t0 = time.monotonic()
        assert proc.wait(timeout=30) == -signal.SIGTERM
        assert time.monotonic() - t0 >= 1.0  # not at once: after busy_timeout (3 s from the wait's start)
        # the GPUs reach night a moment before migd records the apply that put them there: wait for both
        migd.wait_until(lambda: migd.assert_profile("night")
                        and bool((migd.daemon_doc()["last_apply"] or {}).get("signalled")), timeout=30)
        last = migd.daemon_doc()["last_apply"]
        assert [(s["pid"], s["signal"]) for s in last["signalled"]] == [(proc.pid, "SIGTERM")], last
        table = migd.migctl.process("daemon").stdout
        assert f"  on-busy force: PID {proc.pid} on GPU 0: SIGTERM at 2026-11-23 " in table, table
    finally:
        proc.kill()
    migd.assert_no_traceback()


# -- 7: a manual apply waiting inside migd ---------------------------------------------------------------
def test_a_manual_apply_waiting_inside_migd_is_shown_and_its_ctrl_c_is_a_cancel(dgx: MigdProcess) -> None:
    dgx.start(now="2026-11-23T10:00:00")
    dgx.wait_ready()
    store = StateStore(dgx.migctl.state)
    pid = world.start_process(store, 2, store.read().gpus[2].gis[0].id, 0)
    argv = [*MIGCTL, "--sim", dgx.fleet, "--sim-state", str(dgx.migctl.state),
            "--state-dir", str(dgx.migctl.state_dir), "apply", str(PROFILES / "night.yaml"), "--on-busy", "wait",
            "--busy-timeout", "10m"]
    apply = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        dgx.wait_until(lambda: dgx.daemon_doc().get("applying") is not None, timeout=30)
        doc = dgx.daemon_doc()
        assert doc["applying"]["profile"] == "night" and doc["applying"]["waiting"] == {"2": [pid]}, doc["applying"]
        assert doc["applying"]["on_busy"] == "wait" and doc["applying"]["until"] > time.time() + 500
        table = dgx.migctl.process("daemon").stdout
        assert f"manual apply of night ({PROFILES / 'night.yaml'}) in progress since " in table, table
        assert f"GPU 2 waiting for PIDs {pid}; at " in table and "it is refused (on-busy wait" in table, table
        # ... and on what people watch: /metrics (0 and nothing, while migctl daemon said it) and the page
        with urllib.request.urlopen(f"http://127.0.0.1:{dgx.port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert "\nmigd_transition_blocked 1.0\n" in metrics, metrics
        assert re.search(r'\nmigd_gpu_blocked_since_timestamp_seconds\{gpu="2"\} \S+\n', metrics), metrics
        with urllib.request.urlopen(f"http://127.0.0.1:{dgx.port}/", timeout=10) as r:
            page = r.read().decode()
        assert f"GPU 2: waiting: the manual apply of night waits for processes {pid}" in page, page
        apply.send_signal(signal.SIGINT)
        out, err = apply.communicate(timeout=60)
    finally:
        if apply.poll() is None:
            apply.kill()
    assert apply.returncode == 130, (out, err)
    assert "--busy-timeout" not in err and "blocked" not in err + out, (out, err)
    assert out.startswith("night: cancelled in ") and "GPU 0-7 cancelled: cancelled while waiting for busy " \
        f"instances (GPU 2: PIDs {pid}); nothing was changed" in out, out
    doc = dgx.daemon_doc()
    assert doc.get("applying") is None and doc["last_apply"]["result"] == "cancelled", doc["last_apply"]
    assert doc["applied_profile"] == "day" and doc["active"]["reason"] == "schedule", doc
    assert "cancelled" in dgx.migctl.process("daemon").stdout
    assert " blocked" not in dgx.log.read_text()
    dgx.assert_no_traceback()


def test_a_manual_profile_for_one_gpu_keeps_the_other_seven_in_view(dgx: MigdProcess) -> None:
    one = dgx.tmp / "one.yaml"
    one.write_text("apiVersion: migd/v1\nkind: Profile\nname: one\ngpus:\n  - select: {index: 0}\n    mig: enabled\n"
                   "    instances:\n      - {profile: 7g, count: 1}\n")
    dgx.start(now="2026-11-23T10:00:00")
    dgx.wait_ready()
    r = dgx.migctl.process("apply", str(one))
    assert r.returncode == 0, r
    doc = dgx.daemon_doc()
    assert sorted(doc["gpus"], key=int) == [str(i) for i in range(8)], doc["gpus"]
    assert [g.get("selected") for _, g in sorted(doc["gpus"].items())] == [None] + [False] * 7
    table = dgx.migctl.process("daemon").stdout
    assert "GPUs: 1 converged, 7 not selected" in table and "GPU 1-7: not selected by one; left as they are" in table
    time.sleep(2)  # the passes after it
    log = dgx.log.read_text()
    assert "applied profile one (manual)" in log and "(reconcile)" not in log, log
    assert len(dgx.daemon_doc()["gpus"]) == 8


def test_one_clock_on_one_screen(dgx: MigdProcess) -> None:
    """--now far from today: every time `migctl daemon` shows is on migd's clock, which it says."""
    dgx.start(now="2031-03-03T10:00:00")  # Monday, KST: day; night at 19:00
    dgx.wait_ready()
    r = dgx.migctl.process("daemon")
    dates = set(re.findall(r"\b(\d{4}-\d\d-\d\d)[ T]", r.stdout))
    assert dates == {"2031-03-03"}, r.stdout
    assert "clock: migd's own (--now, --time-scale), not this machine's" in r.stdout
    assert r.stdout.startswith("migd running since 2031-03-03 ")
    since, origin = re.search(r"running since (\S+ \S+) UTC.*\n.*from (\S+ \S+) UTC", r.stdout).groups()
    assert since >= origin, r.stdout  # (not before the clock it is shown on began)

    world.raise_xid(StateStore(dgx.migctl.state), 3, 79)  # a fault mark's time is on that clock too
    dgx.wait_until(lambda: bool(dgx.daemon_doc()["unhealthy"]))
    r = dgx.migctl.process("daemon")
    uuid = StateStore(dgx.migctl.state).read().gpus[3].uuid
    assert re.search(rf"^unhealthy: GPU 3 \({uuid}\): Xid 79 \(GPU-wide\) at 2031-03-03 \S+ UTC; reconfiguring "
                     r"it is refused until `migctl clear-fault 3`$", r.stdout, re.M), r.stdout
    assert set(re.findall(r"\b(\d{4}-\d\d-\d\d)[ T]", r.stdout)) == {"2031-03-03"}, r.stdout
    night = dgx.migctl.process("apply", str(PROFILES / "night.yaml"))  # refused: the mark's words on that clock
    refusal = r"error \(from migd\): reconfiguration refused on unhealthy GPUs: GPU 3: Xid 79 \(GPU-wide\) at "
    assert night.returncode == 4 and re.fullmatch(refusal + r"2031-03-03T\S+Z\n", night.stderr), night
    iso = dgx.migctl.process("isolation")  # the same mark, the same clock
    assert iso.returncode == 1 and re.search(rf"^UNHEALTHY GPU 3 \({uuid}\): Xid 79 \(GPU-wide\) at 2031-03-03 \S+ "
                                             r"UTC; reconfiguring it is refused until `migctl clear-fault 3`$",
                                             iso.stdout, re.M), iso.stdout


def test_an_owner_only_change_through_migd_says_what_it_changes(dgx: MigdProcess) -> None:
    """The day layout's instances handed to another team through the running migd (its control socket,
    as an operator's `migctl apply` goes): the same words as a local apply, and migd's count agrees."""
    dgx.start(now="2026-11-23T10:00:00")  # day: 7x1g, owned by notebooks
    dgx.wait_ready()
    other = dgx.tmp / "inference.yaml"
    other.write_text((PROFILES / "day.yaml").read_text().replace("name: day", "name: inference-day")
                     .replace("owner: notebooks", "owner: inference"))
    r = dgx.migctl.process("apply", str(other))
    line = "GPU 0-7 (A100-SXM4-80GB): 7x1g.10gb: an owner change to inference (instances kept, no MIG operation)\n"
    assert r.returncode == 0 and "; 8 GPU(s) changed, 0 already as asked (by migd)\n" + line in r.stdout, r
    assert dgx.daemon_doc()["last_apply"]["changed"] == 8
    again = dgx.migctl.process("apply", str(other))
    assert again.returncode == 0 and "7x1g.10gb: already applied\n" in again.stdout, again

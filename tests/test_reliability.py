"""Issue 7: crashes at every step, every NVML error on every mutating call, load, security."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from migd.apply.executor import Applier
from migd.apply.result import ApplyOptions
from migd.metrics.sampler import NvmlErrorCounter
from migd.profiles.loader import load_profile
from migd.sim import world
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, REPO, Migctl

pytestmark = pytest.mark.integration  # real migd daemons, crashes

E_INSUFFICIENT_RESOURCES, E_IN_USE, E_NO_PERMISSION, E_GPU_IS_LOST, E_TIMEOUT, E_UNKNOWN = 23, 19, 4, 15, 10, 999
ERRORS = {"INSUFFICIENT_RESOURCES": E_INSUFFICIENT_RESOURCES, "IN_USE": E_IN_USE, "NO_PERMISSION": E_NO_PERMISSION,
          "GPU_IS_LOST": E_GPU_IS_LOST, "TIMEOUT": E_TIMEOUT, "UNKNOWN": E_UNKNOWN}
MUTATING = ["nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement",
            "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"]


@pytest.mark.timeout(600)  # (its crash matrix may take the 600 s it is given)
@pytest.mark.xdist_group("caps")  # its owner changes boot capability nodes: tests/conftest.py
def test_crash_at_sampled_steps() -> None:
    """A sample of the crash matrix; .ci/run runs every step (bench/crash_matrix.py)."""
    p = subprocess.run([sys.executable, str(REPO / "bench" / "crash_matrix.py"), "--sample", "64", "--json"],
                       capture_output=True, text=True, timeout=600)
    lines = p.stdout.strip().splitlines()
    assert lines, f"bench/crash_matrix.py exited {p.returncode} with no report: {p.stderr[-2000:]}"
    doc = json.loads(lines[-1])
    assert p.returncode == 0 and doc["failures"] == [], doc["failures"]
    assert doc["scenarios"] >= 18
    relabel = {"day: notebooks->training", "day->night with access"} if os.geteuid() == 0 else set()  # (mknod)
    assert {r["transition"] for r in doc["rows"]} == {"day->night", "night->day", "balanced->day"} | relabel
    assert all(r["mutations"] >= 100 for r in doc["rows"] if r["transition"] not in relabel)  # 8 GPUs each
    assert all(r["scenarios"] >= 40 for r in doc["rows"] if r["transition"] in relabel)  # every write of it


@pytest.mark.parametrize("fn", MUTATING)
@pytest.mark.parametrize("err", sorted(ERRORS))
def test_every_nvml_error_on_every_mutating_call(tmp_path: Path, fn: str, err: str) -> None:
    errors = NvmlErrorCounter()
    state = tmp_path / "s.json"
    backend = sim_backend(state, "single-a100" if fn != "nvmlDeviceSetMigMode" else "single-h100",
                          on_nvml_error=errors)
    applier = Applier(backend, tmp_path / "d")
    old, new = ("night", "day") if fn != "nvmlDeviceSetMigMode" else ("day", "night")
    if fn == "nvmlDeviceSetMigMode":
        old_profile = tmp_path / "off.yaml"  # MIG off -> on is the transition that sets the mode
        old_profile.write_text("apiVersion: migd/v1\nkind: Profile\nname: off\ngpus:\n  - select: all\n"
                               "    mig: disabled\n")
        old_path = old_profile
    else:
        old_path = PROFILES / f"{old}.yaml"
    applier.apply(load_profile(old_path))
    before = applier.plan(load_profile(old_path))
    assert not any(p.changes for p in before)
    store = StateStore(state)
    world.fail_call(store, fn, ERRORS[err])
    result = applier.apply(load_profile(PROFILES / f"{new}.yaml"), ApplyOptions())
    (r,) = result.results
    assert r.status == "rolled_back", r
    assert f"{fn} failed: NVML_ERROR_{err}" in (r.error or "")
    assert not any(p.changes for p in applier.plan(load_profile(old_path)))  # back to the old layout
    assert errors.snapshot()[(fn, err)] == 1
    assert not (tmp_path / "d" / "journal.json").exists()
    assert applier.apply(load_profile(PROFILES / f"{new}.yaml")).ok  # and the next try succeeds
    backend.close()


def test_reset_failure_rolls_back(tmp_path: Path) -> None:
    # A pass-through VM: the Ampere mode change waits for `nvidia-smi -r` (bare metal needs none).
    m = Migctl(tmp_path, "a100-vm")
    world.fail_call(StateStore(m.state) if m.state.exists() else _init(m), "nvidia-smi -r", E_UNKNOWN)
    r = m("apply", str(PROFILES / "day.yaml"), "-o", "json")
    failed = [x for x in r.json()["results"] if "nvidia-smi -r exited" in (x["error"] or "")]
    assert r.code == 1 and len(failed) == 1, r.out
    st = m("status", "-o", "json").json()["gpus"][failed[0]["index"]]["mig"]
    assert st == {"current": False, "pending": False, "after_reset": False}  # the pending enable was withdrawn
    assert m("apply", str(PROFILES / "day.yaml")).code == 0


def _init(m: Migctl) -> StateStore:
    m("status")
    return StateStore(m.state)


def test_1000_scrapes_from_50_clients_during_an_apply(tmp_path: Path) -> None:
    migd = MigdProcess(tmp_path, fleet="dgx-h100", reconcile_interval="1h")
    try:
        migd.start(now="2026-11-23T10:00:00")
        migd.wait_ready()
        world.set_mutation_delay(StateStore(migd.migctl.state), 0.01)
        url = f"http://127.0.0.1:{migd.port}/metrics"
        failures: list[str] = []
        latencies: list[float] = []
        lock = threading.Lock()

        def client() -> None:
            for _ in range(20):
                t0 = time.monotonic()
                try:
                    with urllib.request.urlopen(url, timeout=30) as r:
                        ok = r.status == 200 and b"migd_instance_info" in r.read()
                except OSError as e:
                    ok, msg = False, str(e)
                else:
                    msg = "bad response"
                with lock:
                    latencies.append(time.monotonic() - t0)
                    if not ok:
                        failures.append(msg)
        apply_result: dict[str, object] = {}

        def apply() -> None:
            apply_result["r"] = migd.migctl("apply", str(PROFILES / "night.yaml"))
        threads = [threading.Thread(target=client) for _ in range(50)] + [threading.Thread(target=apply)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert len(latencies) == 1000 and failures == []
        r = apply_result["r"]
        assert r.code == 0, r.err  # type: ignore[attr-defined]
        assert time.monotonic() - t0 < 120
    finally:
        migd.close()


def test_files_others_can_rewrite_are_refused(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    prof = tmp_path / "p.yaml"
    prof.write_text((PROFILES / "day.yaml").read_text())
    os.chmod(prof, 0o666)
    if os.geteuid() != 0:
        pytest.skip("StrictModes applies to root")
    r = m("apply", str(prof))
    assert r.code == 2 and "writable by group or others" in r.err
    os.chmod(prof, 0o644)
    hook = tmp_path / "hook.sh"
    hook.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(hook, 0o777)
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(f"hooks:\n  apply-start:\n    - command: [{hook}]\n")
    os.chmod(hooks, 0o666)
    r = m("apply", str(prof), "--hooks", str(hooks))
    assert r.code == 2 and "hooks file is writable by group or others" in r.err
    os.chmod(hooks, 0o644)
    r = m("apply", str(prof), "--hooks", str(hooks))
    assert r.code == 2 and "hook program" in r.err and "writable" in r.err
    os.chmod(hook, 0o755)
    assert m("apply", str(prof), "--hooks", str(hooks)).code == 0
    assert stat.S_IMODE(os.stat(prof).st_mode) == 0o644


def test_files_others_own_are_refused(tmp_path: Path) -> None:
    """StrictModes checks the owner, and the directories above, not only the mode bits: a hook or
    profile owned by an unprivileged user would otherwise run or apply as root."""
    if os.geteuid() != 0:
        pytest.skip("StrictModes applies to root (and chown needs root)")
    nobody = 65534
    m = Migctl(tmp_path, "single-a100")
    prof = tmp_path / "p.yaml"
    prof.write_text((PROFILES / "day.yaml").read_text())
    os.chown(prof, nobody, nobody)
    r = m("apply", str(prof))
    assert r.code == 2 and "profile is owned by uid 65534" in r.err, r.err
    os.chown(prof, 0, 0)
    hook = tmp_path / "hook.sh"
    hook.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(hook, 0o755)
    os.chown(hook, nobody, nobody)
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(f"hooks:\n  apply-start:\n    - command: [{hook}]\n")
    r = m("apply", str(prof), "--hooks", str(hooks))
    assert r.code == 2 and "hook program is owned by uid 65534" in r.err, r.err
    os.chown(hook, 0, 0)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # world-writable, not sticky: anyone could swap the file
    (shared / "p.yaml").write_text(prof.read_text())
    r = m("apply", str(shared / "p.yaml"))
    assert r.code == 2 and f"directory {shared} above the profile is writable" in r.err, r.err
    assert m("apply", str(prof), "--hooks", str(hooks)).code == 0


def test_a_config_cannot_switch_off_the_check_of_itself(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("StrictModes applies to root")
    from migd.config.migdyaml import load_config
    from migd.errors import ValidationError
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "day.yaml").write_text((PROFILES / "day.yaml").read_text())
    cfg = tmp_path / "migd.yaml"
    cfg.write_text("strict_permissions: false\nschedule:\n  - {profile: day, at: '08:30'}\n")
    os.chmod(cfg, 0o666)
    with pytest.raises(ValidationError, match="config file is writable by group or others"):
        load_config(cfg)
    os.chmod(cfg, 0o644)
    os.chmod(tmp_path / "profiles" / "day.yaml", 0o666)  # the trusted config may relax its profiles
    assert "day" in load_config(cfg).profiles


def test_forty_concurrent_migctl_clients_all_get_an_answer(tmp_path: Path) -> None:
    import threading as th

    from migd.ctl.client import request
    from migd.daemon.server import ControlServer, Handlers

    def slow_status() -> dict[str, object]:
        time.sleep(0.2)
        return {"schema": "migd.daemon/v1"}

    def unused(*args: object) -> Any:
        raise AssertionError("not asked")

    server = ControlServer(tmp_path / "ctl.sock", Handlers(slow_status, unused, unused, unused, unused, unused, unused))
    server.start()
    replies: list[object] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            replies.append(request(server.path, {"cmd": "status"}, timeout_s=30))
        except BaseException as e:  # noqa: BLE001 - every failure is the finding
            errors.append(e)
    try:
        clients = [th.Thread(target=ask) for _ in range(40)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(60)
    finally:
        server.close()
    assert errors == [] and len(replies) == 40


def test_force_never_signals_a_reused_pid(tmp_path: Path) -> None:
    """A busy process exits on SIGTERM and an unrelated process gets its PID before the SIGKILL
    round: that process must live (the PID is made to be reused through ns_last_pid, as CRIU does)."""
    import subprocess
    import threading as th

    from migd.apply.result import OnBusy
    from migd.sim.backend import sim_backend
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("cannot steer PID allocation here (needs root in the PID namespace)")
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    store = StateStore(m.state)
    stubborn = subprocess.Popen(["sh", "-c", 'trap "" TERM; exec sleep 300'])
    polite = subprocess.Popen(["sleep", "300"])
    gis = [g.id for g in store.read().gpus[0].gis]
    time.sleep(0.2)  # let sh set its trap before it execs sleep
    world.start_process(store, 0, gis[0], 0, pid=stubborn.pid)
    world.start_process(store, 0, gis[1], 0, pid=polite.pid)
    backend = sim_backend(m.state, "single-a100")
    outcome: list[object] = []
    opts = ApplyOptions(on_busy=OnBusy.FORCE, busy_timeout_s=0, kill_grace_s=2.0)  # force at once
    worker = th.Thread(target=lambda: outcome.append(Applier(backend, m.state_dir).apply(
        load_profile(PROFILES / "night.yaml"), opts)))
    bystander = None
    try:
        worker.start()
        assert polite.wait(timeout=20) == -signal.SIGTERM
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(polite.pid - 1))
        bystander = subprocess.Popen(["sleep", "300"])
        if bystander.pid != polite.pid:
            pytest.skip("another process took the PID first")
        worker.join(60)
        assert outcome and bystander.poll() is None, "the SIGKILL round hit an unrelated process"
        assert stubborn.wait(timeout=10) == -signal.SIGKILL
    finally:
        for p in (stubborn, polite, bystander):
            if p is not None and p.poll() is None:
                p.kill()
        worker.join(30)
        backend.close()

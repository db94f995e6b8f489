"""A GPU whose change fails is tried again after a growing backoff, not at the next pass.

The real migd against the simulator, at 20 times real speed (the backoff counts in the daemon's clock,
as reconcile_interval does): a full state directory, an NVML error that persists and a hook that always
fails each make a handful of attempts in the window, with no GPU change between them, and once the cause
is gone the next attempt succeeds without a restart.  A manual apply tries at once, backoff or not.
Counts are over windows with generous bounds; every wait is for a state, never a fixed sleep."""

from __future__ import annotations

import logging
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from migd.api.daemon import Progress
from migd.apply.executor import Applier
from migd.apply.result import ApplyResult, GpuResult, GpuStatus
from migd.config.migdyaml import load_config
from migd.daemon.clock import Clock
from migd.daemon.retry import Retries
from migd.daemon.service import Daemon
from migd.plan.planner import GpuPlan
from migd.profiles.loader import load_profile
from migd.sim import world
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES

SCALE = 20.0  # 10 s of backoff is half a real second; a 6 s window is two minutes of the daemon's clock
WINDOW_S = 6.0  # real seconds watched after the first failure: attempts at 0, 10, 30, 70 (daemon's seconds)
MOST = 5  # attempts allowed in the window (4 expected; before the backoff it was hundreds)
NIGHT_NOW = "2026-11-23T19:00:30"  # night is active (Asia/Seoul): migd's first pass applies it
E_UNKNOWN = 999


@dataclass
class Sample:
    """One look at the node: mutations read before and after migd's status of GPU 0."""

    before: int
    after: int
    began: float  # time.time() before the first read
    at: float  # time.time() after the second read
    gpu: dict[str, Any]
    attempts: int


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, reconcile_interval="5s")  # a pass every quarter second: none may re-enter the GPU
    yield m
    m.close()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs for migd's state dir, so a disk can really run full (needs root)."""
    where = tmp_path / "fs"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _daemon(migd: MigdProcess) -> dict[str, Any]:
    doc: dict[str, Any] = migd.control({"cmd": "status"})["daemon"]
    return doc


def _attempts(doc: dict[str, Any]) -> int:
    """Apply attempts that failed (rolled back, failed, or refused with an error)."""
    return sum(doc["apply_count"].get(k, 0) for k in ("rolled_back", "failed", "error"))


def _sample(migd: MigdProcess, store: StateStore) -> Sample:
    began = time.time()
    before = store.read().mutations
    doc = _daemon(migd)
    after = store.read().mutations
    return Sample(before, after, began, time.time(), doc["gpus"].get("0", {}), _attempts(doc))


def _between_tries(s: Sample) -> bool:
    """Both reads after the failed attempt the status names ended and before its next try began.  (A look
    that began during the attempt can read its last mutations first and its end in the status: under
    load the status took long enough to straddle it.)"""
    failed_at, next_try = s.gpu.get("failed_at"), s.gpu.get("next_try")
    return failed_at is not None and next_try is not None and failed_at <= s.began and s.at < next_try


def _start_failing(migd: MigdProcess) -> StateStore:
    """day on the GPU, then migd started where night is active; returns once its first attempt failed."""
    migd.start(now=NIGHT_NOW, time_scale=SCALE)
    migd.wait_ready()
    migd.wait_until(lambda: _attempts(_daemon(migd)) >= 1, timeout=60)
    return StateStore(migd.migctl.state)


def _watch(migd: MigdProcess, store: StateStore, seconds: float = WINDOW_S) -> list[Sample]:
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(_sample(migd, store))
        time.sleep(0.05)
    return samples


def _check_window(samples: list[Sample]) -> None:
    """A handful of attempts, the GPU "failed" (never "drifted") with its next try, and no mutation while
    it waits: two looks at the same failed attempt, both after it and before its next try, saw the same count."""
    attempts = samples[-1].attempts - samples[0].attempts + 1
    assert 2 <= attempts <= MOST, f"{attempts} attempts in {WINDOW_S}s at {SCALE}x"
    assert {s.gpu["state"] for s in samples} == {"failed"}, {s.gpu["state"] for s in samples}
    waiting: dict[int, set[int]] = {}
    for s in samples:
        if _between_tries(s):
            waiting.setdefault(s.gpu["failures"], set()).update((s.before, s.after))
    assert len(waiting) >= 2 and all(len(seen) == 1 for seen in waiting.values()), waiting
    first, last = samples[0], samples[-1]  # each attempt counted once, in the GPU's state as in apply_count
    assert last.gpu["failures"] - first.gpu["failures"] == last.attempts - first.attempts


def _metric(migd: MigdProcess, name: str) -> float | None:
    body = urllib.request.urlopen(f"http://127.0.0.1:{migd.port}/metrics", timeout=10).read().decode()
    m = re.search(rf'^{name}\{{gpu="0"\}} (\S+)$', body, re.M)
    return float(m.group(1)) if m else None


def _metrics_say(migd: MigdProcess, gpu: dict[str, Any]) -> bool:
    """/metrics says what the status says of GPU 0: its failed attempts in a row and its next try."""
    return (_metric(migd, "migd_gpu_apply_failures") == gpu.get("failures", 0)
            and _metric(migd, "migd_gpu_apply_retry_timestamp_seconds") == gpu.get("next_try"))


def _converged(migd: MigdProcess) -> bool:
    doc = _daemon(migd)
    return bool(doc["applied_profile"] == "night" and doc["gpus"]["0"]["state"] == "converged")


@pytest.mark.integration
def test_a_full_state_directory_backs_off(migd: MigdProcess, small_fs: Path) -> None:
    """The issue's node: the disk fills after the apply's third NVML call and stays full; each attempt
    destroys the GPU's instances, cannot write, and puts them back."""
    migd.migctl.state_dir = small_fs / "state"
    assert migd.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    world.fill_disk_after_mutations(StateStore(migd.migctl.state), 3, small_fs / "filler")
    store = _start_failing(migd)
    samples = _watch(migd, store)
    _check_window(samples)
    assert samples[0].after > 0 and "No space left on device" in samples[-1].gpu["reason"]
    migd.wait_until(lambda: _metrics_say(migd, _daemon(migd)["gpus"]["0"]), timeout=30)  # (at most 1 s old)
    log = migd.log.read_text()
    tries = re.findall(r"GPU 0: change to night .*", log)
    assert len(tries) == samples[-1].gpu["failures"] and "drift" not in log, log[-3000:]  # one line per attempt
    assert len(re.findall(r"No space left on device", log)) < len(tries), log[-3000:]  # the same cause: counted
    (small_fs / "filler").unlink()
    migd.wait_until(lambda: _converged(migd), timeout=60)
    assert migd.assert_profile("night")
    migd.wait_until(lambda: _metrics_say(migd, {}), timeout=30)


@pytest.mark.integration
def test_an_nvml_error_that_persists_backs_off(migd: MigdProcess) -> None:
    """Every GPU-instance destroy fails: each attempt destroys the compute instances first, then fails and
    re-creates them.  Armed for far more attempts than the window allows, then disarmed."""
    assert migd.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    store = StateStore(migd.migctl.state)
    for _ in range(300):
        world.fail_call(store, "nvmlGpuInstanceDestroy", E_UNKNOWN)
    store = _start_failing(migd)
    samples = _watch(migd, store)
    _check_window(samples)
    assert "nvmlGpuInstanceDestroy failed: NVML_ERROR_UNKNOWN" in samples[-1].gpu["reason"]
    with store.transaction() as s:  # the cause goes away
        s.faults.clear()
    migd.wait_until(lambda: _converged(migd), timeout=60)
    assert migd.assert_profile("night")


@pytest.mark.integration
def test_a_hook_that_always_fails_backs_off(migd: MigdProcess) -> None:
    """pre-apply-config fails while a file exists: nothing on the GPU changes, and the apply is refused
    a handful of times, not at every pass."""
    flag = migd.tmp / "fail-the-hook"
    flag.touch()
    migd.config.write_text(migd.config.read_text() + "hooks:\n  pre-apply-config:\n"
                           f"    - {{command: [/bin/sh, -c, 'test ! -e {flag}'], timeout: 10s}}\n")
    assert migd.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    store = _start_failing(migd)
    samples = _watch(migd, store)
    _check_window(samples)
    assert len({s.before for s in samples} | {s.after for s in samples}) == 1  # refused before any change
    assert "hook /bin/sh exited 1" in samples[-1].gpu["reason"]
    flag.unlink()
    migd.wait_until(lambda: _converged(migd), timeout=60)
    assert migd.assert_profile("night")


@pytest.mark.integration
def test_a_manual_apply_does_not_wait_for_the_backoff(migd: MigdProcess) -> None:
    """An operator's migctl apply is tried at once, and its success ends the backoff (the daemon's clock
    at real speed here: the next scheduled try is 10 s away)."""
    assert migd.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    store = StateStore(migd.migctl.state)
    world.fail_call(store, "nvmlGpuInstanceDestroy", E_UNKNOWN)
    migd.start(now=NIGHT_NOW)
    migd.wait_ready()
    migd.wait_until(lambda: _daemon(migd)["gpus"].get("0", {}).get("state") == "failed", timeout=60)
    gpu = _daemon(migd)["gpus"]["0"]
    assert gpu["failures"] == 1 and gpu["next_try"] - gpu["failed_at"] == pytest.approx(10, abs=0.5)
    r = migd.migctl("apply", str(PROFILES / "night.yaml"))
    assert r.code == 0, r.out + r.err
    assert time.time() < gpu["next_try"], "the manual apply came only after the backoff"
    gpu = _daemon(migd)["gpus"]["0"]
    assert gpu["state"] == "converged" and "failures" not in gpu and "next_try" not in gpu, gpu
    migd.wait_until(lambda: _metrics_say(migd, gpu), timeout=30)


# -- the same rules, in process: the backoff's steps, a changed layout, report mode, a busy wait ------------
def _plan(tmp_path: Path) -> GpuPlan:
    backend = sim_backend(tmp_path / "plan.json", "single-a100")
    try:
        (plan,) = Applier(backend, tmp_path / "plan.d").plan(load_profile(PROFILES / "night.yaml"))
    finally:
        backend.close()
    return plan


def test_the_backoff_doubles_to_ten_minutes_and_a_success_ends_it(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    plan = _plan(tmp_path)
    retries = Retries(lambda s: s / 1000)  # the daemon's clock at 1000x: the delays are its seconds
    steps = []
    with caplog.at_level(logging.INFO, logger="migd"):
        for _ in range(9):
            retries.refused("night", [plan], "pre-apply-config: hook /bin/false exited 1: no output")
            f = retries.failure(plan)
            assert f is not None and retries.held(plan) and 0 < (retries.due_in_s() or 0) <= 0.6
            steps.append(round((f.next_try - f.last) * 1000))
        assert steps == [10, 20, 40, 80, 160, 320, 600, 600, 600] and f.count == 9
        retries.done("night", ApplyResult("night", [plan], [GpuResult(0, plan.gpu.uuid, GpuStatus.APPLIED)]))
    assert retries.failure(plan) is None and not retries.held(plan) and retries.due_in_s() is None
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "change to night refused" in m]) == 9  # one line per attempt
    assert len([m for m in said if "hook /bin/false" in m]) == 1  # the cause once, then counted
    assert "GPU 0: change to night refused again, same cause (9 attempts in a row); next try in 600s" in said
    assert "GPU 0: night applied after 9 failed attempt(s)" in said


def _in_process(tmp_path: Path, reconcile: str = "correct") -> tuple[Daemon, StateStore, Any]:
    """migd's decisions without its process, on a GPU holding day, at 19:00:30 (night active)."""
    m = MigdProcess(tmp_path, reconcile=reconcile)
    m.notify.close()
    assert m.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    backend = sim_backend(m.migctl.state, m.fleet)
    d = Daemon(load_config(m.config), backend, m.migctl.state_dir,
               Clock(datetime.fromisoformat(NIGHT_NOW + "+09:00")), reload_config=lambda: load_config(m.config))
    return d, StateStore(m.migctl.state), backend


def _gpu0(d: Daemon) -> Any:
    return d.status.gpus[0]


def test_a_changed_layout_is_tried_at_once(tmp_path: Path) -> None:
    """A reload that makes night another layout is not held back by the old layout's backoff."""
    d, store, backend = _in_process(tmp_path)
    try:
        for _ in range(50):
            world.fail_call(store, "nvmlGpuInstanceDestroy", E_UNKNOWN)
        d.reconcile("start")
        n = store.read().mutations
        for _ in range(3):
            d.reconcile("reconcile")  # the events of its own rollback: nothing is tried, nothing is drift
        assert store.read().mutations == n and _gpu0(d).progress is Progress.FAILED and _gpu0(d).failures == 1
        night = tmp_path / "profiles" / "night.yaml"
        night.write_text((PROFILES / "night-two.yaml").read_text().replace("name: night-two", "name: night"))
        assert d.reload().error is None
        d.reconcile("reload")
        assert store.read().mutations > n and _gpu0(d).failures == 1  # tried at once, counted afresh
        with store.transaction() as s:
            s.faults.clear()
        for f in d.retries.failures.values():
            f.due = 0.0  # (its backoff over)
        d.reconcile("reconcile")
        assert _gpu0(d).progress is Progress.CONVERGED and d.status.applied_profile == "night"
        assert not d.retries.failures
    finally:
        backend.close()


def test_report_mode_tries_a_failed_gpu_again_and_never_calls_it_drift(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """reconcile: report leaves drift alone; a GPU migd itself rolled back is not drift: it is failed,
    and tried again when its backoff ends."""
    d, store, backend = _in_process(tmp_path, reconcile="report")
    try:
        world.fail_call(store, "nvmlGpuInstanceDestroy", E_UNKNOWN)
        with caplog.at_level(logging.INFO, logger="migd"):
            d.reconcile("start")
            d.reconcile("reconcile")
            assert _gpu0(d).progress is Progress.FAILED and d.status.to_json()["gpus"]["0"]["failures"] == 1
            for f in d.retries.failures.values():
                f.due = 0.0
            d.reconcile("reconcile")
        assert _gpu0(d).progress is Progress.CONVERGED and d.status.applied_profile == "night"
        assert not [r for r in caplog.records if "drift" in r.getMessage()], caplog.text
    finally:
        backend.close()


def test_a_busy_wait_is_not_called_drift(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A GPU waiting for busy instances is looked at again by the passes that follow, as before, and
    none of them calls it drift."""
    d, store, backend = _in_process(tmp_path)
    try:
        world.start_process(store, 0, store.read().gpus[0].gis[0].id, 0)
        with caplog.at_level(logging.INFO, logger="migd"):
            d.reconcile("start")
            for _ in range(3):
                d.reconcile("reconcile")
        assert not [r for r in caplog.records if "drift" in r.getMessage()], caplog.text
        assert _gpu0(d).progress is Progress.WAITING and not d.retries.failures
    finally:
        backend.close()


def test_a_reload_whose_reading_fails_unexpectedly_is_rejected_and_migd_serves_on(tmp_path: Path) -> None:
    """A reader's fault (an exception no check foresaw) ended the running migd at a reload, twice this
    year from values PyYAML read; it is a rejected reload like any bad file, the configuration kept."""
    d, _, backend = _in_process(tmp_path)
    try:
        before = d.config

        def broken() -> Any:
            raise IndexError("string index out of range")
        d._reload_config = broken
        done = d.reload()
        assert done.error == "migd could not read it (IndexError: string index out of range; a fault of migd's " \
                             "reader, worth a report)"
        assert d.config is before and d.status.last_reload_error == done.error
    finally:
        backend.close()

"""Issue 39, second pass, item 3: ``migctl apply --on-busy force`` through migd killed processes and
the terminal was never told which; migd's log said "waiting up to 300s" and sent SIGTERM 3 ms later.
Now force has one meaning (after the busy timeout; migctl's is 0 unless given) and every PID signalled,
and when, reaches migctl's output and the apply document.  Through the real migd and migctl."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.sim import world
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES

pytestmark = pytest.mark.integration  # a real migd


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


# -- 3: force says whom it stopped, and when; one meaning of force ---------------------------------------------
def _sleeper(m: MigdProcess, gpu: int = 0) -> subprocess.Popen[bytes]:
    """A real process on GPU ``gpu``'s first instance (the simulated driver lists it until it exits)."""
    proc = subprocess.Popen(["sleep", "300"])
    store = StateStore(m.migctl.state)
    world.start_process(store, gpu, store.read().gpus[gpu].gis[0].id, 0, pid=proc.pid)
    return proc


def test_on_busy_force_through_migd_says_every_pid_it_signalled(migd: MigdProcess) -> None:
    """It printed only "applied" while migd's log said "waiting up to 300s" and sent SIGTERM 3 ms later.
    Now the terminal (table and -o json) names each PID, the signal and when; the log says it stops
    them now (``--on-busy force`` alone: at once)."""
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    proc = _sleeper(migd)
    try:
        r = migd.migctl.process("apply", str(PROFILES / "night.yaml"), "--on-busy", "force")
        assert r.returncode == 0, r
        assert proc.wait(timeout=10) == -signal.SIGTERM
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith("on-busy force:"))
        assert re.fullmatch(rf"on-busy force: PID {proc.pid} on GPU 0: SIGTERM at \d{{4}}-\d\d-\d\d "
                            r"\d\d:\d\d:\d\d UTC", line), r.stdout
    finally:
        proc.kill()
    log = migd.log.read_text()
    assert "waiting up to" not in log and "on-busy force: stopping the processes on busy instances now" in log, log
    assert f"GPU 0: on-busy force: sending SIGTERM to PID {proc.pid}" in log
    migd.migctl.process("resume")
    migd.wait_until(lambda: migd.assert_profile("day"), timeout=30)
    proc = _sleeper(migd)
    try:
        t0 = time.time()
        r = migd.migctl.process("apply", str(PROFILES / "night.yaml"), "--on-busy", "force", "--busy-timeout",
                                "2s", "-o", "json")
        assert r.returncode == 0, r
        doc = json.loads(r.stdout)
        sent = doc["signalled"]
        assert [(s["pid"], s["signal"], s["gpu"]) for s in sent] == [(proc.pid, "SIGTERM", 0)], sent
        assert sent[0]["at"] - t0 >= 2.0  # force waited busy_timeout first, as on_busy: force does
    finally:
        proc.kill()
    assert "on-busy force: waiting up to 2s for busy instances to end" in migd.log.read_text()
    migd.assert_no_traceback()



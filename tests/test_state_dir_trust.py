"""Every file in the state dir is opened without following symlinks, and the state dir itself must be
root's (or migd's own user's) and 0700, the simulator's default included, which lives in a fresh
private directory, never under a shared name in /tmp."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.helpers import MIGCTL, PROFILES

pytestmark = pytest.mark.integration  # migctl as a program


def _migctl(env_tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(env_tmp)}
    for k in ("MIGD_SIM_STATE", "MIGD_STATE_DIR", "MIGD_SIM"):
        env.pop(k, None)
    return subprocess.run([*MIGCTL, *args], capture_output=True, text=True, timeout=60,
                          env=env)


def test_the_simulators_default_lives_in_a_private_directory(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    r = _migctl(shared, "--sim", "single-a100", "status")
    assert r.returncode == 0, r.stderr
    private = shared / f"migd-sim-{os.geteuid()}"
    st = os.lstat(private)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert (private / "single-a100.json").exists()
    assert not list(shared.glob("migd-sim-single-a100*"))  # no shared name in the world-writable directory


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's directory needs root")
def test_a_planted_simulator_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = shared / "migd-sim-0"
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)  # a local user made it first
    r = _migctl(shared, "--sim", "single-a100", "apply", "--local", str(PROFILES / "day.yaml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line, = r.stderr.splitlines()
    assert f"{planted}: the simulator's directory is owned by uid 65534" in line, line
    assert list(planted.iterdir()) == []  # nothing written into it


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o711])
def test_a_state_dir_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    r = _migctl(tmp_path, "--sim", "single-a100", "--sim-state", str(tmp_path / "sim.json"), "--state-dir",
                str(state), "apply", "--local", str(PROFILES / "day.yaml"))
    assert r.returncode == 2, r
    assert f"{state}: state dir is open to group or others (mode {mode:04o})" in r.stderr, r.stderr
    assert list(state.iterdir()) == [] and "Traceback" not in r.stderr


def test_a_state_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    link = tmp_path / "state"
    link.symlink_to(real)
    r = _migctl(tmp_path, "--sim", "single-a100", "--sim-state", str(tmp_path / "sim.json"), "--state-dir",
                str(link), "apply", "--local", str(PROFILES / "day.yaml"))
    assert r.returncode == 2 and "state dir is not a directory (a symlink?)" in r.stderr, r.stderr
    assert list(real.iterdir()) == []

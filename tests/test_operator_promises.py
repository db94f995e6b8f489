"""What migctl and migd tell the operator is what they did: each message, exit code and override
checked from the user's side, through the real daemon where one is involved."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.cli import main
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, Migctl

TYPOS = {
    "index": "select: {index: [9]}",
    "model": "select: {model: [A10O*]}",
}
PROFILE = """\
apiVersion: migd/v1
kind: Profile
name: typo
gpus:
  - {select}
    instances:
      - {{profile: 7g, count: 1}}
"""


def _typo(tmp: Path, kind: str) -> Path:
    path = tmp / f"typo-{kind}.yaml"
    path.write_text(PROFILE.format(select=TYPOS[kind]))
    path.chmod(0o644)
    return path


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="dgx-a100")
    yield m
    m.close()


def migctl(migd: MigdProcess, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """migctl as the user runs it: its own process, bound to the daemon's simulated node."""
    return subprocess.run([sys.executable, "-m", "migd.cli", "--sim", migd.fleet, "--sim-state", str(migd.migctl.state),
                           "--state-dir", str(migd.migctl.state_dir), *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("kind", sorted(TYPOS))
def test_a_profile_that_selects_no_gpu_is_refused_locally(tmp_path: Path, kind: str) -> None:
    """It used to plan a blank line, assert "applied on 0 GPU(s)" and apply "applied": exit 0 each."""
    m = Migctl(tmp_path, "dgx-a100")
    path = _typo(tmp_path, kind)
    before = m.layout()
    for cmd in (("plan",), ("assert",), ("apply", "--local"), ("apply", "--dry-run", "--local")):
        r = m(cmd[0], str(path), *cmd[1:])
        assert r.code == 2, (cmd, r)
        assert r.out == "", (cmd, r.out)
        line, = r.err.splitlines()
        assert line.startswith(f"error: {path}:5:5: ") and "matches no GPU of this node" in line, line
        assert TYPOS[kind].split("{")[1].split(":")[0] in line and "GPU 0-7 (A100-SXM4-80GB)" in line, line
    assert m.layout() == before
    assert StateStore(m.state).read().mutations == 0


def test_a_profile_that_selects_no_gpu_is_not_held_by_the_daemon(migd: MigdProcess) -> None:
    migd.start(now="2026-11-23T10:00:00")  # Monday 10:00 KST: day
    migd.wait_ready()
    store = StateStore(migd.migctl.state)
    before = store.read().mutations
    r = migctl(migd, "apply", str(_typo(migd.tmp, "index")))
    assert r.returncode == 2 and "matches no GPU of this node" in r.stderr, r
    doc = migd.control({"cmd": "status"})["daemon"]
    assert doc["override"] is None and doc["active"]["reason"] == "schedule", doc["active"]
    assert not (migd.migctl.state_dir / "override.json").exists()
    assert store.read().mutations == before
    assert "applied" not in r.stdout


def test_validate_catches_an_index_beyond_the_node(tmp_path: Path) -> None:
    path = str(_typo(tmp_path, "index"))
    m = Migctl(tmp_path, "dgx-a100")
    known = m("validate", path)  # the fleet is known (--sim dgx-a100): index 9 cannot exist there
    assert known.code == 2 and "index 9 is beyond this node's GPUs (0-7)" in known.err, known
    sized = m("validate", "--gpus", "16", path)  # told the node is larger: fine
    assert sized.code == 0, sized
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["validate", path])  # nothing known about the node: a warning, not an error
    assert code == 0 and "warning: " in err.getvalue() and "index 9" in err.getvalue(), err.getvalue()


def test_validate_notes_unconfirmed_facts_once_for_all_files() -> None:
    files = [str(p) for p in sorted(PROFILES.glob("*.yaml"))]
    r = subprocess.run([sys.executable, "-m", "migd.cli", "validate", *files], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == len(files)
    notes = r.stderr.splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: ") and "-v" in notes[0], notes


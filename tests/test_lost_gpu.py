"""One GPU of eight falls off the bus (Xid 79, NVML_ERROR_GPU_IS_LOST): the node stays managed.

Every reader serves the seven GPUs it can read and reports the lost one, left alone; the exit code
is 5 (partly) where the request touched the lost GPU, 0 where it did not, 4 where it touched only
that GPU.  Each case runs migctl or migd as its own process, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.sim import world
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, Migctl

pytestmark = pytest.mark.integration  # real migd daemons

LOST = 3
ONLY = """\
apiVersion: migd/v1
kind: Profile
name: only{index}
gpus:
  - select: {{index: [{index}]}}
    mig: enabled
    instances:
      - {{profile: 3g, count: 2}}
"""


def _only(tmp: Path, index: int) -> Path:
    path = tmp / f"only{index}.yaml"
    path.write_text(ONLY.format(index=index))
    path.chmod(0o644)
    return path


def run(m: Migctl, *args: str) -> subprocess.CompletedProcess[str]:
    r = m.process(*args)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    return r


@pytest.fixture
def node(tmp_path: Path) -> Migctl:
    m = Migctl(tmp_path, "dgx-a100")
    assert m("status").code == 0  # the node exists
    world.set_lost(StateStore(m.state), LOST)
    return m


def test_status_reports_the_lost_gpu_and_serves_the_other_seven(node: Migctl) -> None:
    r = run(node, "status", "-v")
    assert r.returncode == 5, r
    assert r.stdout.splitlines()[1].startswith(f"GPU {LOST}: LOST (fallen off the bus; left alone until a GPU reset")
    assert sum(line.startswith("GPU ") and "MIG disabled" in line for line in r.stdout.splitlines()) == 7
    doc = json.loads(run(node, "status", "-o", "json").stdout)
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2, 4, 5, 6, 7]
    assert doc["unreadable"] == [{"index": LOST, "state": "lost",
                                  "error": "nvmlDeviceGetName failed: NVML_ERROR_GPU_IS_LOST"}]


def test_a_profile_that_leaves_the_lost_gpu_alone_succeeds(node: Migctl, tmp_path: Path) -> None:
    path = _only(tmp_path, 0)
    for cmd in (("plan",), ("apply", "--local"), ("assert",)):
        r = run(node, cmd[0], str(path), *cmd[1:])
        assert r.returncode == 0, (cmd, r)
        assert "LOST" not in r.stdout + r.stderr, (cmd, r)
    assert StateStore(node.state).read().gpus[0].mig_current


def test_a_profile_for_every_gpu_is_applied_to_the_seven_and_says_partly(node: Migctl) -> None:
    day = str(PROFILES / "day.yaml")
    plan = run(node, "plan", day)
    assert plan.returncode == 5 and f"GPU {LOST}: LOST" in plan.stdout, plan
    r = run(node, "apply", "--local", day)
    assert r.returncode == 5, r
    assert r.stdout.startswith("day: partly applied") and f"GPU {LOST}: LOST" in r.stdout, r.stdout
    doc = json.loads(run(node, "apply", "--local", day, "-o", "json").stdout)
    assert doc["ok"] and [u["index"] for u in doc["unreadable"]] == [LOST]
    state = StateStore(node.state).read()
    assert [g.mig_current for g in state.gpus] == [i != LOST for i in range(8)]
    a = run(node, "assert", day)
    assert a.returncode == 5 and "could not be read" in a.stdout, a


def test_a_profile_for_the_lost_gpu_alone_is_a_hardware_error(node: Migctl, tmp_path: Path) -> None:
    r = run(node, "apply", "--local", str(_only(tmp_path, LOST)))
    assert r.returncode == 4, r
    assert r.stdout.startswith(f"only{LOST}: NOT applied") and f"GPU {LOST}: LOST" in r.stdout, r.stdout
    assert StateStore(node.state).read().mutations == 0


def test_export_doctor_and_isolation_cover_the_others(node: Migctl) -> None:
    exp = run(node, "export")
    assert exp.returncode == 5 and f"not exported: GPU {LOST}: LOST" in exp.stderr, exp
    assert "index: [0, 1, 2, 4, 5, 6, 7]" in exp.stdout.replace("\n  ", " ").replace("- ", ""), exp.stdout
    doc = run(node, "doctor")
    assert doc.returncode == 5, doc
    assert doc.stdout.startswith(f"doctor: no differences from the catalog; GPU {LOST} cannot be read"), doc.stdout
    iso = run(node, "isolation")
    assert iso.returncode == 5 and iso.stdout.splitlines()[1].startswith(f"GPU {LOST}: LOST"), iso


def test_a_gpu_lost_between_listing_and_reading_is_reported_too(tmp_path: Path) -> None:
    """NVML answered for the GPU's name, then lost it while its instances were read."""
    m = Migctl(tmp_path, "dgx-a100")
    assert run(m, "apply", "--local", str(PROFILES / "day.yaml")).returncode == 0
    world.fail_call(StateStore(m.state), "nvmlDeviceGetGpuInstances", 15, gpu=2)  # 15: GPU_IS_LOST
    r = run(m, "status", "-o", "json")
    assert r.returncode == 5, r
    doc = json.loads(r.stdout)
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 3, 4, 5, 6, 7] and doc["unreadable"][0]["index"] == 2


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="dgx-a100")
    assert m.migctl("status").code == 0
    world.set_lost(StateStore(m.migctl.state), LOST)
    yield m
    m.close()


def test_migd_starts_with_a_lost_gpu_and_manages_the_other_seven(migd: MigdProcess, tmp_path: Path) -> None:
    migd.start(now="2026-11-23T18:59:58")  # day until 19:00, then night
    migd.wait_ready()
    migd.wait_until(lambda: all(len(g.gis) == 1 for i, g in enumerate(StateStore(migd.migctl.state).read().gpus)
                                if i != LOST))  # night: one 7g on each of the seven
    body = urllib.request.urlopen(f"http://127.0.0.1:{migd.port}/metrics", timeout=10).read().decode()
    assert f'migd_gpu_lost{{gpu="{LOST}"}} 1.0' in body and 'migd_gpu_up{gpu="0"} 1.0' in body
    daemon = run(migd.migctl, "--control-socket", str(migd.socket_path), "daemon")
    assert "GPUs: 7 converged, 1 lost" in daemon.stdout, daemon
    assert f"GPU {LOST}: lost since" in daemon.stdout, daemon
    via = run(migd.migctl, "--control-socket", str(migd.socket_path), "apply", str(_only(tmp_path, 0)))
    assert via.returncode == 0 and "(by migd)" in via.stdout, via
    every = run(migd.migctl, "--control-socket", str(migd.socket_path), "apply", str(PROFILES / "night.yaml"))
    assert every.returncode == 5 and f"GPU {LOST}: LOST" in every.stdout, every
    log = migd.log.read_text()
    assert "Traceback" not in log and "migd starting: 8 GPU(s)" in log
    assert f"GPU {LOST}: lost (fallen off the bus" in log

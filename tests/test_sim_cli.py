"""``migd-sim process|xid|lose|return|slow``: an operator rehearsing day one acts on
the simulated node from a shell.  Every test runs the real ``migd-sim`` process; bad input is one line,
exit 2, and the state file (and its generation) stay as they were; a running migd sees each change."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import MIGCTL, PROFILES, REPO, Migctl, migctl_as, need_root

NOBODY = 65534

pytestmark = pytest.mark.integration  # migd-sim as a program, real migd daemons


def sim(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("MIGD_SIM", "MIGD_SIM_STATE")}
    return subprocess.run([sys.executable, "-m", "migd.sim.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=60, env={**clean, **(env or {})})


def on(m: Migctl, *args: str) -> subprocess.CompletedProcess[str]:
    return sim(*args, "--sim-state", str(m.state))


def snapshot(m: Migctl) -> tuple[bytes, bytes]:
    """The state file and its lock file (whose first 8 bytes are the write generation)."""
    return m.state.read_bytes(), m.state.with_name(m.state.name + ".lock").read_bytes()[:8]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Migctl:
    """A single A100 in the day layout (7 x 1g.10gb, GI 7..13), made once for the bad-input cases."""
    m = Migctl(tmp_path_factory.mktemp("node"), "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    return m


def test_each_subcommand_acts_on_the_node(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    store = StateStore(m.state)
    gis = store.read().gpus[0].gis
    r = on(m, "process", "start", "--gpu", "0", "--gi", str(gis[0].id), "--memory", "2048")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    pid = int(r.stdout)
    mig = store.read().gpus[0].mig_uuid(gis[1], gis[1].cis[0])
    other = int(on(m, "process", "start", "--device", mig, "--memory", "unknown").stdout)
    procs = {(p.pid, p.gi, p.ci, p.used_mib) for p in store.read().gpus[0].processes}
    assert procs == {(pid, gis[0].id, 0, 2048), (other, gis[1].id, 0, None)}
    assert re.search(rf"@0:1 .* 2048/\d+ MiB  pids {pid}\n", m("status", "-v").out)
    assert on(m, "process", "stop", str(pid)).stdout == f"process {pid} stopped\n"
    assert [p.pid for p in store.read().gpus[0].processes] == [other]

    r = on(m, "xid", "31", "--device", mig, "--leak-to", str(gis[2].id))
    assert r.returncode == 0 and r.stdout == f"Xid 31 on GPU 0 GI {gis[1].id} CI 0; it also broke GI {gis[2].id}\n"
    s = store.read()
    assert s.gpus[0].processes == [] and s.gpus[0].gis[2].faulted  # the hit instance's process died
    assert (s.events[-1]["data"], s.events[-1]["gi"], s.events[-1]["ci"]) == (31, gis[1].id, 0)
    assert on(m, "xid", "79", "--gpu", "0").stdout == "Xid 79 on GPU 0 (GPU-wide)\n"
    assert (store.read().events[-1]["data"], store.read().events[-1]["gi"]) == (79, 0xFFFFFFFF)

    assert on(m, "lose", "--gpu", "0").returncode == 0 and store.read().gpus[0].lost
    assert on(m, "lose", "--gpu", "0").stdout == "GPU 0 was already lost\n"
    assert on(m, "return", "--gpu", "0").returncode == 0 and not store.read().gpus[0].lost
    assert on(m, "slow", "0.5").stdout == "every mutating NVML call now takes 0.5 s\n"
    assert store.read().mutation_delay_s == 0.5
    assert on(m, "slow", "0").returncode == 0 and store.read().mutation_delay_s == 0


def test_sim_fleet_finds_the_node_migctl_made(tmp_path: Path) -> None:
    """``--sim FLEET`` is the node migd and migctl call by that name (under $TMPDIR/migd-sim-UID/)."""
    env = {"TMPDIR": str(tmp_path)}
    made = subprocess.run([*MIGCTL, "--sim", "single-h100", "status"], capture_output=True,
                          text=True, cwd=REPO, timeout=60, env={**os.environ, **env})
    assert made.returncode == 0, made.stderr
    assert sim("lose", "--sim", "single-h100", "--gpu", "0", env=env).returncode == 0
    assert StateStore(tmp_path / f"migd-sim-{os.geteuid()}" / "single-h100.json").read().gpus[0].lost
    r = sim("slow", "1", env={**env, "MIGD_SIM": "single-h100"})  # as migctl, $MIGD_SIM names it too
    assert r.returncode == 0, r.stderr


BAD = [
    (["process", "start", "--gpu", "0"], "GPU 0 is in MIG mode: name a MIG device"),
    (["process", "start", "--gpu", "4", "--gi", "7"], "no simulated GPU 4"),
    (["process", "start", "--gpu", "0", "--gi", "1"], "GPU 0 has no MIG device"),
    (["process", "start", "--gpu", "0", "--ci", "0"], "give --gi too"),
    (["process", "start", "--gpu", "0", "--gi", "7", "--memory", "999999"], "999999 MiB does not fit"),
    (["process", "start", "--gpu", "0", "--gi", "7", "--memory", "-1"], "-1 MiB does not fit"),
    (["process", "start", "--gpu", "0", "--gi", "7", "--memory", "lots"], "not a number of MiB or 'unknown'"),
    (["process", "start", "--gpu", "0", "--gi", "7", "--pid", "999999999"], "no running process 999999999"),
    (["process", "start", "--device", "MIG-00000000-0000-0000-0000-000000000000"], "no MIG device MIG-0000"),
    (["process", "start", "--device", "{mig}", "--gpu", "0"], "not both"),
    (["process", "start"], "which GPU?"),
    (["process", "stop", "4242"], "no simulated process 4242"),
    (["process", "stop", "x"], "must be a whole number of at most 9 digits, not 'x'"),
    (["process"], "start|stop"),
    (["xid", "79"], "which GPU?"),
    (["xid", "0", "--gpu", "0"], "an Xid is a positive number"),
    (["xid", "seventy-nine", "--gpu", "0"], "must be a whole number of at most 9 digits, not 'seventy-nine'"),
    (["xid", "31", "--gpu", "0", "--gi", "1"], "GPU 0 has no GPU instance 1"),
    (["xid", "31", "--gpu", "0", "--gi", "7", "--ci", "5"], "GI 7 has no compute instance 5"),
    (["xid", "31", "--gpu", "0", "--gi", "7", "--leak-to", "1"], "no other GPU instance 1"),
    (["xid", "31", "--gpu", "0", "--gi", "7", "--leak-to", "7"], "no other GPU instance 7"),
    (["xid", "31", "--gpu", "0", "--leak-to", "8"], "give the GI"),
    (["xid", "79", "--gpu", "1"], "no simulated GPU 1"),
    (["lose", "--gpu", "1"], "no simulated GPU 1"),
    (["lose"], "required: --gpu"),
    (["return", "--gpu", "-1"], "must be a whole number of at most 9 digits, not '-1'"),
    (["slow", "-1"], "-1 is not between 0 and 60 seconds"),
    (["slow", "61"], "61 is not between 0 and 60 seconds"),
    (["slow", "nan"], "nan is not between 0 and 60 seconds"),
    (["slow", "soon"], "'soon' is not a number of seconds"),
]


@pytest.mark.parametrize("args,says", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(node: Migctl, args: list[str], says: str) -> None:
    s = StateStore(node.state).read().gpus[0]
    mig = s.mig_uuid(s.gis[0], s.gis[0].cis[0])
    before = snapshot(node)
    r = on(node, *(a.replace("{mig}", mig) for a in args))
    assert (r.returncode, r.stdout) == (2, ""), r
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("migd-sim ") and says in r.stderr, r.stderr
    assert snapshot(node) == before


def test_a_node_that_is_not_there_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "junk.json").write_text("{}")
    (tmp_path / "text.json").write_text("not json")
    cases = [(["slow", "1"], "which simulated node? give --sim FLEET"),
             (["slow", "1", "--sim", "dgx-z9"], "unknown fleet 'dgx-z9'"),
             (["slow", "1", "--sim", "dgx-h100"], "no simulated node at "),
             (["slow", "1", "--sim-state", str(tmp_path / "none.json")], "no simulated node at "),
             (["slow", "1", "--sim-state", str(tmp_path / "junk.json")], "is not a simulator state file"),
             (["slow", "1", "--sim-state", str(tmp_path / "text.json")], "is not a simulator state file")]
    for args, says in cases:
        r = sim(*args, env={"TMPDIR": str(tmp_path)})
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and says in r.stderr, (args, r.stderr)
    assert not (tmp_path / "none.json").exists() and (tmp_path / "junk.json").read_text() == "{}"
    assert not (tmp_path / f"migd-sim-{os.geteuid()}").exists()  # a failed look made no node either


def scrape(m: MigdProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=10) as r:
        return r.read().decode()


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, "single-a100", reconcile_interval="1s")
    m.start(now="2026-11-23T10:00:00")  # Monday morning: day, 7 x 1g.10gb
    m.wait_ready()
    m.wait_until(lambda: m.assert_profile("day"))
    yield m
    m.close()


def test_a_running_migd_sees_each(migd: MigdProcess) -> None:
    m = migd.migctl
    gi = StateStore(m.state).read().gpus[0].gis[0].id
    pid = on(m, "process", "start", "--gpu", "0", "--gi", str(gi)).stdout.strip()
    assert f"pids {pid}\n" in m.process("status", "-v").stdout  # migctl, in a process of its own
    migd.wait_until(lambda: re.search(rf'migd_compute_instance_processes{{[^}}]*gi="{gi}"[^}}]*}} 1\.0',
                                      scrape(migd)) is not None)
    assert on(m, "process", "stop", pid).returncode == 0
    assert "pids -" in m.process("status", "-v").stdout and pid not in m.process("status", "-v").stdout

    assert on(m, "slow", "0.2").returncode == 0  # day -> night: 7 CI and 7 GI destroyed, 1 GI and 1 CI made
    t0 = time.monotonic()
    r = m.process("apply", str(PROFILES / "night.yaml"))  # through migd
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 >= 16 * 0.2  # slower, and it completed
    last = json.loads(m.process("daemon", "-o", "json").stdout)["last_apply"]
    assert last["profile"] == "night" and last["seconds"] >= 16 * 0.2, last  # as migd timed it
    assert on(m, "slow", "0").returncode == 0

    def daemon() -> dict[str, Any]:
        return dict(json.loads(m.process("daemon", "-o", "json").stdout))

    assert on(m, "lose", "--gpu", "0").returncode == 0
    migd.wait_until(lambda: daemon()["gpus"]["0"]["state"] == "lost")
    assert on(m, "return", "--gpu", "0").returncode == 0
    migd.wait_until(lambda: daemon()["gpus"]["0"]["state"] == "converged")

    uuid = StateStore(m.state).read().gpus[0].uuid
    assert on(m, "xid", "79", "--gpu", "0").returncode == 0
    migd.wait_until(lambda: daemon()["unhealthy"].get(uuid, "").startswith("Xid 79 (GPU-wide)"))


def test_driver_boots_the_files_access_by_owner_and_status_mine_read(tmp_path: Path) -> None:
    """`migd-sim driver` loads the simulated driver with its /proc and /dev under a directory, so access
    by owner and `migctl status --mine` can be tried from a shell (only a test could boot them).  A boot
    clears its proc, dev and run there: a directory holding anything else is refused, untouched."""
    need_root("mknod, as the driver's nodes are made")
    root = Path(tempfile.mkdtemp(prefix="migd-caps-", dir="/tmp"))  # (a directory every user may enter)
    root.chmod(0o755)
    m = MigdProcess(tmp_path, "single-a100")
    try:
        assert m.migctl("status").code == 0  # makes the node
        (root / "run").mkdir()
        r = on(m.migctl, "driver", "--caps-root", str(root))
        assert (r.returncode, r.stdout) == (2, "") and r.stderr == (
            f"migd-sim driver: {root} holds run: give a new or empty directory (a boot clears its proc, dev and "
            "run)\n"), r.stderr
        assert os.listdir(root) == ["run"]
        (root / "run").rmdir()
        for _ in range(2):  # (a boot's own directory boots again)
            r = on(m.migctl, "driver", "--caps-root", str(root))
            assert r.returncode == 0 and r.stdout.startswith(f"the simulated driver's files are under {root}: "), r
        assert (root / "proc/driver/nvidia-caps/mig-minors").is_file() and (root / "dev/nvidia-caps").is_dir()
        (root / "run/migd").mkdir(mode=0o700)
        with m.config.open("a") as f:
            f.write(f"control_socket: {root / 'run/migd/control.sock'}\n"
                    f"access:\n  root: {root}\n  owners:\n    notebooks: {{group: nogroup}}\n")
        m.start(now="2026-11-23T10:00:00")  # Monday morning: day, 7 x 1g.10gb for notebooks
        m.wait_ready()
        argv = ["--sim", m.fleet, "--sim-state", str(m.migctl.state), "--state-dir", str(m.migctl.state_dir),
                "--control-socket", str(root / "run/migd/control.sock"), "status", "--mine"]
        m.wait_until(lambda: len(migctl_as(NOBODY, NOBODY, argv)[1].splitlines()) == 7)
        code, out, err = migctl_as(NOBODY, NOBODY, argv)
        assert code == 0 and all("(owner notebooks): CUDA_VISIBLE_DEVICES=MIG-" in ln for ln in out.splitlines()), \
            (out, err)
        code, out, err = migctl_as(NOBODY, 100, argv)  # (another group: none of them)
        assert code == 1 and out.startswith(f"no MIG device of this node is open to you (uid {NOBODY}, "), out
        assert m.stop() == 0
        m.assert_no_traceback()
    finally:
        m.close()
        shutil.rmtree(root, ignore_errors=True)

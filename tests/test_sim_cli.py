"""``migd-sim process|xid|lose|return|slow|driver``: an operator rehearsing day one acts on
the simulated node from a shell.  Every test runs the real ``migd-sim`` process; bad input is one line,
exit 2, and the state file (and its generation) stay as they were; a running migd sees each change."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migd.sim.cli_control import BOOTED
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import MIGCTL, PROFILES, REPO, Migctl, migctl_as, need_root
from tests.test_fresh_clone import section

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



def test_driver_refuses_a_directory_it_could_wipe_or_another_user_could_steer(tmp_path: Path) -> None:
    """`migd-sim driver` boots as root and clears its proc, dev and run/nvidia-sim under the directory
    given: one holding anything else, one another user owns (with a boot's marker and symlinks that led
    root's writes and chmods elsewhere), a symlink, or one under a directory others may write is refused
    in one line, exit 2, and nothing is touched."""
    need_root("a boot makes device nodes; other users' directories")
    m = Migctl(tmp_path, "single-a100")
    assert m("status").code == 0
    base = Path(tempfile.mkdtemp(prefix="migd-drv-", dir="/tmp"))
    try:
        base.chmod(0o755)
        victim = base / "victim"
        victim.mkdir(mode=0o700)
        full = base / "full"
        full.mkdir()
        (full / "run").mkdir()
        theirs = base / "theirs"
        theirs.mkdir()
        (theirs / BOOTED).write_text("")
        (theirs / "dev").symlink_to(victim)
        os.chown(theirs, NOBODY, NOBODY)
        open_dir = base / "open"
        open_dir.mkdir()
        open_dir.chmod(0o777)  # (not sticky: anyone may swap what is in it)
        (base / "link").symlink_to(full)
        mine = base / "mine"  # root's, with a boot's marker, and a run/ anyone may write (to swap nvidia-sim)
        (mine / "run").mkdir(parents=True)
        (mine / BOOTED).write_text("")
        (mine / "run").chmod(0o777)
        nb = base / "nb"  # another user's directory on the way, holding a link to a root-owned one
        nb.mkdir()
        (nb / "link").symlink_to(victim)
        os.chown(nb, NOBODY, NOBODY)
        cases = [(full, f"{full} holds run: give a new or empty directory"),
                 (theirs, f"{theirs} is a directory, uid {NOBODY}'s, mode 0755: a boot writes there as root"),
                 (base / "link", f"{base / 'link'} passes through a symbolic link"),
                 (nb / "link" / "caps", "passes through a symbolic link"),
                 (open_dir / "caps", "writable by group or others"),
                 (mine, f"{mine / 'run'} is a directory, uid 0's, mode 0777: not what a boot made"),
                 (Path("/"), "the root directory is no place for a simulated driver")]
        for where, says in cases:
            r = on(m, "driver", "--caps-root", str(where))
            assert (r.returncode, r.stdout) == (2, "") and says in r.stderr and len(r.stderr.splitlines()) == 1, \
                (where, r.stderr)
        assert stat.S_IMODE(victim.stat().st_mode) == 0o700 and os.listdir(victim) == []
        assert os.listdir(full) == ["run"] and sorted(os.listdir(theirs)) == [BOOTED, "dev"]
        assert os.listdir(open_dir) == [] and os.listdir(mine / "run") == []  # (refused: nothing made)
        booted = base / "booted"  # root's umask 000 (what root's shell may have): the boot's run/ is 0755 all
        r = subprocess.run(["bash", "-c", 'umask 000; exec "$@"', "sh", sys.executable, "-m", "migd.sim.cli", "driver",
                            "--sim-state", str(m.state), "--caps-root", str(booted)], capture_output=True, text=True,
                           cwd=REPO, timeout=60)
        assert r.returncode == 0, r.stderr
        assert {str(p.relative_to(booted / "run")): stat.S_IMODE(p.stat().st_mode) for p in (booted / "run").rglob("*")
                if p.is_dir()} == {"nvidia-sim": 0o755, "nvidia-sim/claims": 0o1733}
        assert stat.S_IMODE((booted / "run").stat().st_mode) == 0o755
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_users_md_tries_access_by_owner_on_the_simulator_as_written() -> None:
    """users.md's lines, run as written by root from the checkout, then its user's line as `nobody` (in
    `nogroup`: the seven instances of `day`, each with its CUDA_VISIBLE_DEVICES line) and as `nobody` in
    another group (none, exit 1); a boot over its own directory boots again.  (The Python that runs migctl
    as the user is this one, forked: the venv the README installs is tested by test_fresh_clone.py.)"""
    need_root("a boot makes device nodes; other users")
    lines = section(REPO / "docs" / "users.md", "### On the simulator")
    root_lines, user_line = lines[:-1], lines[-1]
    assert user_line.startswith("migctl ") and "status --mine" in user_line, lines
    fd, name = tempfile.mkstemp(prefix="migd-users-md-")
    out, d = Path(name), None
    with os.fdopen(fd, "w") as f:
        demo = subprocess.Popen(["bash", "-c", "set -e\n" + "\n".join(root_lines)], cwd=REPO, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert demo.wait(timeout=120) == 0, out.read_text()
        d = Path(out.read_text().splitlines()[0])
        assert d.parent == Path(tempfile.gettempdir()) and (d / "caps" / BOOTED).is_file(), out.read_text()
        argv = shlex.split(user_line.replace("$D", str(d)))[1:]
        mine: list[str] = []

        def listed() -> bool:
            code, text, _ = migctl_as(NOBODY, NOBODY, argv)
            mine[:] = text.splitlines() if code == 0 else []
            return len(mine) == 7
        deadline = time.monotonic() + 60
        while not listed() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(mine) == 7 and all("(owner notebooks): CUDA_VISIBLE_DEVICES=MIG-" in ln for ln in mine), \
            (mine, out.read_text()[-2000:])
        code, text, err = migctl_as(NOBODY, 100, argv)
        assert code == 1 and text.startswith(f"no MIG device of this node is open to you (uid {NOBODY}, "), (text, err)
        again = sim("driver", "--sim-state", str(d / "node.json"), "--caps-root", str(d / "caps"))
        assert again.returncode == 0 and again.stdout.startswith("the simulated driver's files are under "), again
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGTERM)  # (migd, started in the background by the lines)
        deadline = time.monotonic() + 30
        with contextlib.suppress(ProcessLookupError):
            while time.monotonic() < deadline:
                os.killpg(demo.pid, 0)
                time.sleep(0.1)
        log = out.read_text()
        out.unlink()
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)
    assert "Traceback" not in log and "applied profile day" in log, log[-2000:]

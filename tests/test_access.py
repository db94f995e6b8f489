"""Access by owner: each team's Unix group reaches its own MIG instances and no
other's, through the driver's capability nodes as migd sets them, checked by the kernel: simulated
CUDA programs (migd.sim.cuda) run as real non-root users (uids without root's powers, in one team's
group) against a real migd over a simulated node whose capability tree is real files and real
character devices.  Needs root (mknod, setuid)."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import stat
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migd.ctl.client import request
from migd.hardware.caps import CapsPaths, read_minors
from migd.sim import caps, caps_tree
from migd.sim.cuda import main as cuda_main
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, migctl_as, need_root

# real migd daemons, forked users; the group "caps": tests/conftest.py
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("caps")]

USER_A, USER_B = 61001, 61002  # no passwd entry needed: the kernel checks numbers


def two_groups() -> tuple[grp.struct_group, grp.struct_group]:
    """Two groups this machine has (Debian's audio and video, or any two others): the teams."""
    pool = [g for g in grp.getgrall() if 0 < g.gr_gid < 1000]
    by_name = {g.gr_name: g for g in pool}
    if "audio" in by_name and "video" in by_name:
        return by_name["audio"], by_name["video"]
    return pool[0], pool[1]


def run_cuda(root: Path, uid: int, gid: int, device: str, seconds: float = 0.0) -> tuple[int, int, str]:
    """A simulated CUDA program as ``uid`` (in group ``gid`` only): (its pid, exit code or -1 if it
    still runs, its stderr).  In a forked child, not exec'd: the interpreter may sit where that user
    cannot reach it; the program then becomes ``sleep``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(r)
            os.dup2(w, 2)
            sys.stderr = open(w, "w")  # noqa: SIM115 (pytest's own stderr is not fd 2)
            os.setgroups([gid] if uid else [])
            os.setgid(gid)
            os.setuid(uid)
            code = cuda_main(["--caps-root", str(root), "--device", device, "--mib", "300", "--",
                              "sleep", str(seconds)])
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            with os.fdopen(r) as f:
                return pid, os.waitstatus_to_exitcode(status), f.read()
        if seconds and _became_sleep(pid):
            os.close(r)
            return pid, -1, ""
        time.sleep(0.02)
    raise AssertionError("the simulated CUDA program neither ran nor failed")


def _became_sleep(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"
    except OSError:
        return False


def through_migd(m: MigdProcess, root: Path, *args: str) -> int:
    """migctl as root, handing the command to this node's migd (its control socket is under ``root``)."""
    return m.migctl.process("--control-socket", str(root / "run/migd/control.sock"), *args).returncode


def daemon(root: Path) -> dict[str, Any]:
    """The running migd's migd.daemon/v1 document (its control socket is under ``root``)."""
    reply = request(root / "run/migd/control.sock", {"cmd": "status"}, timeout_s=30)
    assert reply is not None
    doc: dict[str, Any] = reply["daemon"]
    return doc


def reap(pid: int) -> None:
    os.kill(pid, 9)
    os.waitpid(pid, 0)


@pytest.fixture
def teams() -> tuple[grp.struct_group, grp.struct_group]:
    need_root("real character devices (mknod) and other users (setuid)")
    return two_groups()


@pytest.fixture
def node(tmp_path: Path, teams: tuple[grp.struct_group, grp.struct_group]) -> Iterator[tuple[MigdProcess, Path]]:
    with caps_node(tmp_path, teams) as made:
        yield made


@contextlib.contextmanager
def caps_node(tmp_path: Path, teams: tuple[grp.struct_group, grp.struct_group]) -> Iterator[tuple[MigdProcess, Path]]:
    """A single-A100 node with its capability tree in a directory every user may look into (as /dev
    and /proc), and migd configured with notebooks -> team A's group, training and inference -> B's."""
    root = Path(tempfile.mkdtemp(prefix="migd-caps-", dir="/tmp"))
    root.chmod(0o755)
    (root / "run/migd").mkdir(parents=True, mode=0o700)  # like /run/migd; its -view sibling is everyone's
    m = MigdProcess(tmp_path, "single-a100")
    assert m.migctl("status").code == 0  # makes the simulated node
    caps.enable(StateStore(m.migctl.state), root)
    a, b = teams
    with m.config.open("a") as f:
        f.write(f"control_socket: {root / 'run/migd/control.sock'}\n"
                f"access:\n  root: {root}\n  owners:\n    notebooks: {{group: {a.gr_name}}}\n"
                f"    training: {{group: {b.gr_name}}}\n    inference: {{group: {b.gr_name}}}\n")
    yield m, root
    m.close()
    shutil.rmtree(root, ignore_errors=True)


def devices(root: Path) -> list[tuple[str, int, int, int]]:
    """(MIG UUID, GPU minor, GI, CI) of every MIG device, as the simulated driver lists them."""
    out = []
    for line in (root / caps_tree.DEVICES).read_text().splitlines():
        mig, gpu, gi, ci = line.split()
        out.append((mig, int(gpu), int(gi), int(ci)))
    return out


def node_modes(root: Path) -> dict[str, tuple[int, int, int] | None]:
    """Every GI/CI capability of GPU 0: its node's (uid, gid, mode), None if there is no node."""
    paths = CapsPaths(root)
    out: dict[str, tuple[int, int, int] | None] = {}
    for name, minor in read_minors(paths.mig_minors).items():
        if name.startswith("gpu0/"):
            try:
                st = os.lstat(paths.node(minor))
            except FileNotFoundError:
                out[name] = None
                continue
            out[name] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    return out


def existing(root: Path) -> set[str]:
    return {f"gpu{g}/gi{gi}/access" for _, g, gi, _ in devices(root)} | \
        {f"gpu{g}/gi{gi}/ci{ci}/access" for _, g, gi, ci in devices(root)}


def assert_only(root: Path, gid: int) -> None:
    """Every existing instance's capabilities are root:gid 0440; every other capability is root's alone."""
    live = existing(root)
    for name, got in node_modes(root).items():
        if name in live:
            assert got == (0, gid, 0o440), (name, got)
        else:
            assert got is None or got[2] & 0o077 == 0 and got[0] == 0, (name, got)


def start_day(m: MigdProcess, root: Path, team: grp.struct_group) -> None:
    """migd started on Monday morning: day's seven 1g instances, open to notebooks (``team``)."""
    m.start(now="2026-11-23T10:00:00")
    m.wait_ready()
    m.wait_until(lambda: len(devices(root)) == 7 and node_modes(root)[f"gpu0/gi{devices(root)[0][2]}/access"]
                 == (0, team.gr_gid, 0o440))


def test_each_team_reaches_only_its_own_instances(node: tuple[MigdProcess, Path],
                                                  teams: tuple[grp.struct_group, grp.struct_group]) -> None:
    m, root = node
    a, b = teams
    start_day(m, root, a)
    assert_only(root, a.gr_gid)
    mig = devices(root)[0][0]
    pid, code, err = run_cuda(root, USER_A, a.gr_gid, mig, seconds=30)
    try:
        assert code == -1, err  # runs
        m.wait_until(lambda: str(pid) in m.migctl("status").out)  # the driver counts it on its MIG device
        _, refused, why = run_cuda(root, USER_B, b.gr_gid, mig)
        assert refused == 100 and "no CUDA-capable device is detected" in why and "Permission denied" in why, why
        root_pid, root_code, err = run_cuda(root, 0, 0, mig, seconds=30)  # root is unaffected
        assert root_code == -1, err
        reap(root_pid)
    finally:
        reap(pid)
    # a manual apply of balanced: inference (team B) gets 3g and 2g, notebooks (team A) two 1g
    assert through_migd(m, root, "apply", str(PROFILES / "balanced.yaml")) == 0
    m.wait_until(lambda: len(devices(root)) == 4)
    owners = {inst["gi_id"]: inst["owner"] for inst in m.migctl("status", "-o", "json").json()["gpus"][0]["instances"]}
    for mig, _, gi, _ in devices(root):
        mine, other = (a, b) if owners[gi] == "notebooks" else (b, a)
        ok_pid, ok, err = run_cuda(root, USER_A if mine is a else USER_B, mine.gr_gid, mig, seconds=30)
        assert ok == -1, (owners[gi], err)
        reap(ok_pid)
        _, no, _ = run_cuda(root, USER_B if mine is a else USER_A, other.gr_gid, mig)
        assert no == 100, owners[gi]


def test_a_day_to_night_switch_regrants_and_closes_what_was_destroyed(
        node: tuple[MigdProcess, Path], teams: tuple[grp.struct_group, grp.struct_group]) -> None:
    m, root = node
    a, b = teams
    m.start(now="2026-11-23T18:59:57")  # day now, night at 19:00
    m.wait_ready()
    day = devices(root)
    assert len(day) == 7
    m.wait_until(lambda: node_modes(root)[f"gpu0/gi{day[0][2]}/access"] == (0, a.gr_gid, 0o440))
    m.wait_until(lambda: len(devices(root)) == 1, timeout=60)  # night: one 7g for training (team B)
    m.wait_until(lambda: daemon(root)["applied_profile"] == "night", timeout=60)
    assert_only(root, b.gr_gid)
    for _, _, gi, ci in day:  # every node of a destroyed day instance: root's alone
        for name in (f"gpu0/gi{gi}/access", f"gpu0/gi{gi}/ci{ci}/access"):
            got = node_modes(root)[name]
            if name not in existing(root):
                assert got is not None and got == (0, 0, 0o400), (name, got)
    night = devices(root)[0][0]
    assert run_cuda(root, USER_A, a.gr_gid, night)[1] == 100
    pid, code, err = run_cuda(root, USER_B, b.gr_gid, night, seconds=30)
    assert code == -1, err
    reap(pid)
    doc = daemon(root)["access"]
    assert doc["owners"]["training"] == f"group {b.gr_name}" and doc["errors"] == [] and doc["interface"] == "dev"
    shown = m.migctl.process("--control-socket", str(root / "run/migd/control.sock"), "daemon").stdout
    assert f"access by owner (dev interface): inference: group {b.gr_name}; notebooks: group {a.gr_name}; " \
        f"training: group {b.gr_name}; unowned: root; " in shown, shown


def test_a_crash_mid_apply_leaves_nothing_open(node: tuple[MigdProcess, Path],
                                               teams: tuple[grp.struct_group, grp.struct_group]) -> None:
    """migd is killed in the middle of day -> night: the GPU's capabilities were closed before its first
    change, so nothing is open to anyone until the restarted migd has recovered the journal; then the
    layout the journal restored is open to its owners again."""
    m, root = node
    a, _ = teams
    start_day(m, root, a)
    store = StateStore(m.migctl.state)
    with store.transaction() as s:
        s.crash_after_mutations = 3  # two day instances gone, then migd dies
    assert through_migd(m, root, "apply", str(PROFILES / "night.yaml")) != 0
    m.wait_until(lambda: m.proc is not None and m.proc.poll() is not None)
    left = devices(root)
    assert 0 < len(left) < 7  # half-way: some day instances are still there
    for name, got in node_modes(root).items():  # and not one of them is open
        assert got is None or (got[0], got[2] & 0o077) == (0, 0), (name, got)
    assert run_cuda(root, USER_A, a.gr_gid, left[0][0])[1] == 100
    m.proc = None
    m.start(now="2026-11-23T10:00:00")  # recovers the journal: day again, and open to notebooks
    m.wait_ready()
    m.wait_until(lambda: len(devices(root)) == 7)
    m.wait_until(lambda: node_modes(root)[f"gpu0/gi{devices(root)[0][2]}/access"] == (0, a.gr_gid, 0o440))
    assert_only(root, a.gr_gid)


def test_status_mine_lists_what_this_user_may_use(node: tuple[MigdProcess, Path],
                                                  teams: tuple[grp.struct_group, grp.struct_group]) -> None:
    """`migctl status --mine` as an ordinary user: the instances the kernel will let that user open,
    each with the CUDA_VISIBLE_DEVICES line that selects it (and that line works); exit 1 with one
    line when there is none."""
    m, root = node
    a, b = teams
    start_day(m, root, a)
    argv = ["--sim", m.fleet, "--sim-state", str(m.migctl.state), "--state-dir", str(m.migctl.state_dir),
            "--control-socket", str(root / "run/migd/control.sock"), "status", "--mine"]
    code, text, err = migctl_as(USER_A, a.gr_gid, argv)
    assert code == 0, err
    lines = text.splitlines()
    assert len(lines) == 7 and all("(owner notebooks): CUDA_VISIBLE_DEVICES=MIG-" in ln for ln in lines), text
    first = lines[0].split("CUDA_VISIBLE_DEVICES=")[1]
    pid, ran, err = run_cuda(root, USER_A, a.gr_gid, first, seconds=30)
    assert ran == -1, err
    reap(pid)
    code, text, err = migctl_as(USER_B, b.gr_gid, argv)
    assert code == 1 and text.startswith(f"no MIG device of this node is open to you (uid {USER_B}, groups "), text
    assert through_migd(m, root, "apply", str(PROFILES / "balanced.yaml")) == 0
    m.wait_until(lambda: len(devices(root)) == 4)
    m.wait_until(lambda: migctl_as(USER_B, b.gr_gid, argv)[0] == 0)
    code, text, err = migctl_as(USER_B, b.gr_gid, [*argv, "-o", "json"])
    doc = json.loads(text)
    assert doc["schema"] == "migd.status/v1" and {i["owner"] for i in doc["gpus"][0]["instances"]} == {"inference"}
    assert len(doc["gpus"][0]["instances"]) == 2


def test_an_owner_only_change_moves_the_instances_to_the_new_team(
        node: tuple[MigdProcess, Path], teams: tuple[grp.struct_group, grp.struct_group]) -> None:
    """The day profile edited so that training (team B) owns its seven 1g instances, and reloaded: the
    layout holds, so no NVML call is made, but the owners change: migd closes, relabels and opens
    them for team B, says so, and team A no longer reaches any of them."""
    m, root = node
    a, b = teams
    start_day(m, root, a)
    mig = devices(root)[0][0]
    assert run_cuda(root, USER_B, b.gr_gid, mig)[1] == 100
    day = m.config.parent / "profiles" / "day.yaml"
    day.write_text(day.read_text().replace("owner: notebooks", "owner: training"))
    mutations = StateStore(m.migctl.state).read().mutations
    assert through_migd(m, root, "reload") == 0
    m.wait_until(lambda: node_modes(root)[f"gpu0/gi{devices(root)[-1][2]}/access"] == (0, b.gr_gid, 0o440))
    assert_only(root, b.gr_gid)
    assert StateStore(m.migctl.state).read().mutations == mutations  # the layout was never touched
    assert run_cuda(root, USER_A, a.gr_gid, mig)[1] == 100
    pid, code, err = run_cuda(root, USER_B, b.gr_gid, mig, seconds=30)
    assert code == -1, err
    reap(pid)
    log = m.log.read_text()
    assert "GPU 0: owners changed (GI at slice 0: notebooks -> training, " in log, log[-2000:]
    owners = {i["owner"] for i in m.migctl("status", "-o", "json").json()["gpus"][0]["instances"]}
    assert owners == {"training"}


def test_a_planted_symlink_is_said_at_once_and_refuses_the_change(
        node: tuple[MigdProcess, Path], teams: tuple[grp.struct_group, grp.struct_group]) -> None:
    """A symlink at the node of the instance night would create: migd cannot close that capability,
    so the GPU is not changed (a new instance with those ids would be reached through whatever the
    link names); the day instances stay notebooks' and every other node is still set; migctl daemon
    and /metrics name the refused node as soon as the apply returns, not at the next reconcile pass
    (an hour away here)."""
    m, root = node
    a, b = teams
    m.write_config(reconcile_interval="3600s")
    with m.config.open("a") as f:
        f.write(f"control_socket: {root / 'run/migd/control.sock'}\n"
                f"access:\n  root: {root}\n  owners:\n    notebooks: {{group: {a.gr_name}}}\n"
                f"    training: {{group: {b.gr_name}}}\n")
    start_day(m, root, a)
    paths = CapsPaths(root)
    minors = read_minors(paths.mig_minors)
    planted = paths.node(minors["gpu0/gi0/ci0/access"])  # night's 7g is GI 0, CI 0
    planted.unlink(missing_ok=True)
    planted.symlink_to("/dev/null")
    assert through_migd(m, root, "apply", str(PROFILES / "night.yaml")) == 1
    assert len(devices(root)) == 7
    live = existing(root)  # the GPU's other nodes: as the day layout's owners say
    assert all(got == (0, a.gr_gid, 0o440) for name, got in node_modes(root).items() if name in live)
    doc = daemon(root)["access"]
    assert len(doc["errors"]) == 1 and "capability gpu0/gi0/ci0/access" in doc["errors"][0] \
        and doc["errors"][0].endswith("left as it was"), doc
    assert os.path.islink(planted) and os.readlink(planted) == "/dev/null"
    with urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=10) as r:
        body = r.read().decode()
    assert "\nmigd_access_errors 1.0\n" in body, [ln for ln in body.splitlines() if "access" in ln]
    shown = m.migctl.process("--control-socket", str(root / "run/migd/control.sock"), "daemon").stdout
    assert "  access NOT set: GPU 0: capability gpu0/gi0/ci0/access: " in shown, shown


def test_a_held_back_instance_goes_to_its_owner_within_seconds_of_being_let_go(
        node: tuple[MigdProcess, Path], teams: tuple[grp.struct_group, grp.struct_group]) -> None:
    """A reload gives notebooks to team B's group while team A's CUDA program runs on one instance: that
    instance stays closed (its program keeps its handle, said with the pid), the other six go to B
    at once; when the program ends, B gets the seventh within seconds, not at the next reconcile pass
    (an hour away here)."""
    m, root = node
    a, b = teams
    m.write_config(reconcile_interval="3600s")
    def access(group: str) -> str:
        return (f"control_socket: {root / 'run/migd/control.sock'}\naccess:\n  root: {root}\n  owners:\n"
                f"    notebooks: {{group: {group}}}\n")
    with m.config.open("a") as f:
        f.write(access(a.gr_name))
    start_day(m, root, a)
    mig, _, gi, _ = devices(root)[0]
    pid, code, err = run_cuda(root, USER_A, a.gr_gid, mig, seconds=60)
    assert code == -1, err
    try:
        m.config.write_text(m.config.read_text().replace(access(a.gr_name), access(b.gr_name)))
        assert through_migd(m, root, "reload") == 0
        m.wait_until(lambda: sum(node_modes(root)[f"gpu0/gi{g}/access"] == (0, b.gr_gid, 0o440)
                                 for _, _, g, _ in devices(root)) == 6)
        assert node_modes(root)[f"gpu0/gi{gi}/access"] == (0, 0, 0o400)
        said = daemon(root)["access"]["errors"]
        assert said == [f"GPU 0: GI {gi}: pids {pid} hold its capability nodes but are not among its owner's "
                        "accounts: closed to all but root until they let go"], said
    finally:
        reap(pid)
    m.wait_until(lambda: node_modes(root)[f"gpu0/gi{gi}/access"] == (0, b.gr_gid, 0o440), timeout=20)
    m.wait_until(lambda: daemon(root)["access"]["errors"] == [], timeout=10)

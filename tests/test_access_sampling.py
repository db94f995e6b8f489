"""Never a moment where a user reaches another team's instance: real non-root users sample every MIG
instance of a real migd about a hundred times a second while its owners move.

Four samplers, each a process with one user's credentials (team A's, team B's, and two outsiders
with no team), try to open both capability nodes of every instance the simulated driver lists, as
the kernel decides; the second outsider runs a simulated CUDA program on each instance instead,
which has nvidia-modprobe make or reset the nodes first, as libcuda does.  An open refused with
EACCES is "not reached"; one that passes the permission check ends in ENXIO, the node having no
driver behind it, and counts as reached.  Each reach is kept with its monotonic start and end.

The test moves the instances between the teams in the ways an owner changes: a day -> night switch
(other instances, other owner), a reload that gives an owner's instances to another group, and an
owner-only change.  Between the moves, only the owning team may reach anything; across each move,
per instance, every reach by the team giving it up ends before the first reach by the team receiving
it; the outsider never reaches anything.  The CUDA-running outsider never gets in with the driver
loaded with ``NVreg_ModifyDeviceFiles=0``; with the default 1 it can only in the moment between the
driver making an instance and migd closing it (docs/users.md), never once an owner has it.  Needs
root (mknod, setuid).
"""

from __future__ import annotations

import errno
import grp
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from migd.hardware.caps import CapsPaths, ci_cap, gi_cap, read_minors
from migd.sim import caps_tree
from migd.sim.cuda import main as cuda_main
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, need_root
from tests.test_access import USER_A, USER_B, caps_node, devices, node_modes, start_day, through_migd, two_groups

# a real migd, forked users; the group "caps": tests/conftest.py
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("caps")]

OUTSIDER, SNEAKER = 61003, 61004  # no team: one opens the nodes, the other runs CUDA programs (nvidia-modprobe)
PERIOD_S = 0.01  # one round of every instance per user, about a hundred a second


@dataclass(frozen=True)
class Reach:
    user: int
    instance: tuple[int, int, int]  # GPU minor, GI id, CI id
    t0: float
    t1: float


def _reached(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
    except OSError as e:
        return e.errno in (errno.ENXIO, errno.ENODEV)  # the kernel let it through to a driver
    return True


def _attached(root: Path, mig: str) -> bool:
    """A simulated CUDA program on ``mig`` (nvidia-modprobe first, as libcuda runs it), as this user:
    whether it got the device (it then runs ``true`` and ends)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            cuda_main(["--caps-root", str(root), "--device", mig, "--", "true"])
        finally:
            os._exit(100)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _sample(root: Path, uid: int, gids: list[int], w: int, cuda: bool) -> None:
    """The sampler's body, in a forked child: drop to ``uid``/``gids``, then report every reach (by
    opening the nodes, or with ``cuda`` by running a CUDA program on each device)."""
    os.setgroups(gids)
    os.setgid(gids[0] if gids else 65534)
    os.setuid(uid)
    paths = CapsPaths(root)
    minors = read_minors(paths.mig_minors)
    with os.fdopen(w, "w", buffering=1) as out:
        while True:
            try:
                table = (root / caps_tree.DEVICES).read_text().split("\n")
            except OSError:
                table = []
            for line in table:
                parts = line.split()
                if len(parts) != 4:
                    continue
                g, gi, ci = int(parts[1]), int(parts[2]), int(parts[3])
                t0 = time.monotonic()
                if _attached(root, parts[0]) if cuda else \
                        _reached(paths.node(minors[gi_cap(g, gi)])) and _reached(paths.node(minors[ci_cap(g, gi, ci)])):
                    out.write(f"{t0} {time.monotonic()} {g} {gi} {ci}\n")
            time.sleep(PERIOD_S)


class Samplers:
    """One sampler process per user, and a thread per sampler collecting its reaches."""

    def __init__(self, root: Path, users: dict[int, list[int]], cuda: frozenset[int] = frozenset()) -> None:
        self.reaches: list[Reach] = []
        self._lock = threading.Lock()
        self._pids: list[int] = []
        self._threads: list[threading.Thread] = []
        for uid, gids in users.items():
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    _sample(root, uid, gids, w, uid in cuda)
                finally:
                    os._exit(0)
            os.close(w)
            self._pids.append(pid)
            t = threading.Thread(target=self._collect, args=(uid, r), daemon=True)
            t.start()
            self._threads.append(t)

    def _collect(self, uid: int, r: int) -> None:
        with os.fdopen(r) as f:
            for line in f:
                t0, t1, g, gi, ci = line.split()
                with self._lock:
                    self.reaches.append(Reach(uid, (int(g), int(gi), int(ci)), float(t0), float(t1)))

    def seen(self, user: int, since: float) -> bool:
        """Whether ``user`` reached an instance in a look that began at ``since`` or later."""
        with self._lock:
            return any(r.user == user and r.t0 >= since for r in self.reaches)

    def look_settled(self, m: MigdProcess, owner: int, since: float) -> None:
        """The samplers' look at a settled state: the owner's reach after ``since`` (on a loaded machine
        half a second could pass without one), and half a second more of everyone's tries."""
        m.wait_until(lambda: self.seen(owner, since), timeout=60)
        time.sleep(0.5)

    def stop(self) -> list[Reach]:
        for pid in self._pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        self._pids = []
        for t in self._threads:
            t.join(timeout=10)
        return sorted(self.reaches, key=lambda r: r.t0)


@pytest.fixture
def teams() -> tuple[grp.struct_group, grp.struct_group]:
    need_root("real character devices (mknod) and other users (setuid)")
    return two_groups()


@pytest.fixture(params=[1, 0], ids=["ModifyDeviceFiles=1", "ModifyDeviceFiles=0"])
def sampled(request: pytest.FixtureRequest, tmp_path: Path, teams: tuple[grp.struct_group, grp.struct_group]) \
        -> Iterator[tuple[MigdProcess, Path, Samplers]]:
    """The node at day, sampled; the driver loaded with ``NVreg_ModifyDeviceFiles`` as the param says
    (1, the default: a new capability's node is nvidia-modprobe's until migd closes it)."""
    a, b = teams
    with caps_node(tmp_path, teams) as (m, root):
        params = CapsPaths(root).params
        params.write_text(params.read_text().replace("ModifyDeviceFiles: 1", f"ModifyDeviceFiles: {request.param}"))
        start_day(m, root, a)
        s = Samplers(root, {USER_A: [a.gr_gid], USER_B: [b.gr_gid], OUTSIDER: [], SNEAKER: []},
                     cuda=frozenset({SNEAKER}))
        try:
            yield m, root, s
        finally:
            s.stop()


def _settled(root: Path, gid: int, count: int) -> bool:
    """``count`` instances, each with both nodes root:gid 0440."""
    devs = devices(root)
    modes = node_modes(root)
    return len(devs) == count and all(modes.get(f"gpu0/gi{gi}/access") == (0, gid, 0o440)
                                      and modes.get(f"gpu0/gi{gi}/ci{ci}/access") == (0, gid, 0o440)
                                      for _, _, gi, ci in devs)


def test_no_user_ever_reaches_another_teams_instance(
        sampled: tuple[MigdProcess, Path, Samplers], teams: tuple[grp.struct_group, grp.struct_group]) -> None:
    (m, root, samplers), (a, b) = sampled, teams
    marks = [("A", time.monotonic())]  # (the team that owns everything from here on, since when)
    users = {"A": USER_A, "B": USER_B}

    def move(to: str, gid: int, count: int, *request: str) -> None:
        marks.append(("moving", time.monotonic()))
        assert through_migd(m, root, *request) == 0
        m.wait_until(lambda: _settled(root, gid, count), timeout=60)
        marks.append((to, time.monotonic()))
        samplers.look_settled(m, users[to], marks[-1][1])

    samplers.look_settled(m, USER_A, marks[0][1])
    # 1. day (notebooks: A) -> night (training: B): other instances, another team
    move("B", b.gr_gid, 1, "apply", str(PROFILES / "night.yaml"))
    # 2. a reload gives training's instances to A's group
    text = m.config.read_text()
    m.config.write_text(text.replace(f"training: {{group: {b.gr_name}}}", f"training: {{group: {a.gr_name}}}"))
    move("A", a.gr_gid, 1, "reload")
    # 3. an owner-only change: night's instance relabelled to inference (B's group), held by the apply
    relabelled = m.config.parent / "night-inference.yaml"
    relabelled.write_text((PROFILES / "night.yaml").read_text().replace("owner: training", "owner: inference")
                          .replace("name: night", "name: night-inference"))
    move("B", b.gr_gid, 1, "apply", str(relabelled))
    reaches = samplers.stop()

    def phase(t: float) -> str:  # (before the first mark: day, settled as A's before the samplers began)
        return ([who for who, since in marks if since <= t] or ["A"])[-1]

    assert not [r for r in reaches if r.user == OUTSIDER], "the outsider reached an instance"
    sneaked = [r for r in reaches if r.user == SNEAKER]
    if "ModifyDeviceFiles: 0" in CapsPaths(root).params.read_text():
        assert not sneaked, "nvidia-modprobe let a stranger in although no new capability may be modified"
    else:  # only in the moment after the driver made an instance, never once the owner has it
        assert all(phase(r.t0) == phase(r.t1) == "moving" for r in sneaked), (sneaked, marks)
    reaches = [r for r in reaches if r.user != SNEAKER]
    for r in reaches:  # between moves: only the owning team (a reach overlapping a move: judged below)
        during = phase(r.t0)
        assert during != phase(r.t1) or during == "moving" or users[during] == r.user, (r, marks)
    for k in range(1, len(marks) - 1, 2):  # across each move, per instance: the giver's reaches end first
        start, end = marks[k][1], marks[k + 1][1]
        giver, taker = users[marks[k - 1][0]], users[marks[k + 1][0]]
        window = [r for r in reaches if r.t1 >= start and r.t0 <= end]
        for inst in {r.instance for r in window}:
            last_given = max((r.t1 for r in window if r.instance == inst and r.user == giver), default=-1.0)
            first_taken = min((r.t0 for r in window if r.instance == inst and r.user == taker), default=1e18)
            assert last_given < first_taken, (inst, marks[k - 1][0], marks[k + 1][0])
    for who, since in marks[::2]:  # and the samplers did see each owner reach its instances
        assert any(r.user == users[who] and r.t0 >= since for r in reaches), (who, marks)

"""Access control's parts without a daemon: the configuration section, both driver interfaces (/dev
nodes and the deprecated /proc files), what it refuses to touch, and a hand-made change put back.
Over the production NVML adapter and a simulated node with a real capability tree (needs root)."""

from __future__ import annotations

import contextlib
import grp
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from migd.access.accessconf import parse_access
from migd.access.enforce import AccessControl
from migd.access.policy import AccessPolicy, Grant, Unowned
from migd.apply.executor import Applier
from migd.apply.result import GpuStatus
from migd.config.migdyaml import load_config
from migd.daemon.accesspass import access_control
from migd.errors import ValidationError
from migd.hardware.caps import CapsPaths, read_minors
from migd.hardware.ports import GpuBackend
from migd.sim import caps, caps_tree
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore
from migd.slurm.slurmconf import SlurmSettings
from migd.yamlsrc import load
from tests.helpers import PROFILES, Migctl, need_root
from tests.test_access import two_groups

# forked users, nvidia-modprobe's helper; the group "caps": tests/conftest.py
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("caps")]


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Migctl, Path]]:
    need_root("real character devices (mknod)")
    root = Path(tempfile.mkdtemp(prefix="migd-caps-", dir="/tmp"))
    m = Migctl(tmp_path, "single-h100")
    assert m("status").code == 0
    yield m, root
    for backend in OPENED:
        backend.close()
    OPENED.clear()
    shutil.rmtree(root, ignore_errors=True)


OPENED: list[GpuBackend] = []  # closed by the fixture (a test leaves no NVML session open)


def control(m: Migctl, root: Path, unowned: Unowned = Unowned.ROOT) -> tuple[AccessControl, GpuBackend, int]:
    team = two_groups()[0]
    backend = sim_backend(m.state, m.fleet)
    OPENED.append(backend)
    applier = Applier(backend, m.state_dir)
    policy = AccessPolicy({"notebooks": Grant(team.gr_name, None)}, unowned, CapsPaths(root))
    return AccessControl(policy, backend, applier.owners.load), backend, team.gr_gid


def modes(path_of: dict[str, Path]) -> dict[str, tuple[int, int, int]]:
    out = {}
    for name, p in path_of.items():
        st = os.lstat(p)
        out[name] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    return out


def test_the_dev_interface_grants_owners_and_keeps_nvidia_modprobe_off(tree: tuple[Migctl, Path]) -> None:
    m, root = tree
    caps.enable(StateStore(m.state), root)
    assert m("apply", str(PROFILES / "day.yaml")).code == 0  # 7 x 1g for notebooks
    ac, _, gid = control(m, root)
    assert ac.reconcile() == []
    paths = CapsPaths(root)
    minors = read_minors(paths.mig_minors)
    gi_files = sorted(paths.proc_caps.glob("gpu0/mig/gi*/access"))
    assert len(gi_files) == 7
    for f in gi_files:
        name = f"gpu0/{f.parent.name}/access"
        assert modes({name: paths.node(minors[name])})[name] == (0, gid, 0o440)
        assert "DeviceFileModify: 0" in f.read_text()  # the MIG guide's procedure: nvidia-modprobe keeps off
    untouched = paths.node(minors["gpu0/gi0/access"])  # a GI id nothing uses: no node, or root's alone
    assert not untouched.exists() or modes({"x": untouched})["x"] == (0, 0, 0o400)
    config = paths.node(minors["config"])  # config is never opened up
    assert not config.exists() or modes({"c": config})["c"] == (0, 0, 0o400)
    changed = ac.changes
    assert ac.reconcile() == [] and ac.changes == changed  # a second pass has nothing to do


def test_a_hand_made_change_is_put_back_and_an_odd_node_left_alone(tree: tuple[Migctl, Path]) -> None:
    m, root = tree
    caps.enable(StateStore(m.state), root)
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    ac, _, gid = control(m, root)
    ac.reconcile()
    paths = CapsPaths(root)
    minors = read_minors(paths.mig_minors)
    names = sorted(f"gpu0/{f.parent.name}/access" for f in paths.proc_caps.glob("gpu0/mig/gi*/access"))
    name, other = names[0], names[-1]
    node = paths.node(minors[name])
    os.chmod(node, 0o444)  # someone opened it to all
    assert ac.reconcile() == [] and modes({name: node})[name] == (0, gid, 0o440)
    spare = paths.node(minors["gpu0/gi1/access"])  # an instance that does not exist
    spare.unlink(missing_ok=True)
    spare.symlink_to("/etc/passwd")  # never followed, never "fixed"
    os.chmod(paths.node(minors[other]), 0o666)  # and at the same time a live node opened to all
    errors = ac.reconcile()
    assert len(errors) == 1 and "gpu0/gi1/access" in errors[0] and "is not the driver's capability node" in errors[0]
    assert errors[0].endswith("left as it was")  # said as it is: not "closed"
    assert modes({other: paths.node(minors[other])})[other] == (0, gid, 0o440)  # the odd node stopped nothing
    assert stat.S_IMODE(os.stat("/etc/passwd").st_mode) == 0o644 and os.lstat(spare).st_mode & stat.S_IFLNK
    assert ac.errors == errors  # what migctl daemon and /metrics show


def test_the_proc_interface_is_refused_with_one_line(tree: tuple[Migctl, Path], tmp_path: Path) -> None:
    """nv_cap_enable_devfs=0 (deprecated): each new instance's /proc file is the capability and is
    created world-readable, so another team could open it before migd closes it: access by owner
    refuses to start there (one line naming why), and sets nothing."""
    m, root = tree
    caps.enable(StateStore(m.state), root, devfs=False)
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    files = sorted(CapsPaths(root).proc_caps.glob("gpu0/mig/gi*/**/access"))
    before = modes({str(f): f for f in files})
    cfg = tmp_path / "migd.yaml"
    shutil.copytree(PROFILES, tmp_path / "profiles")
    cfg.write_text(f"schedule:\n  - {{profile: day, at: '08:30'}}\naccess:\n  root: {root}\n"
                   f"  owners: {{notebooks: {{group: {two_groups()[0].gr_name}}}}}\n")
    backend = sim_backend(m.state, m.fleet)
    OPENED.append(backend)
    applier = Applier(backend, m.state_dir)
    with pytest.raises(ValidationError) as e:
        access_control(load_config(cfg), backend, applier)
    assert "nv_cap_enable_devfs=0" in str(e.value) and "\n" not in str(e.value) and "access" in str(e.value)
    assert applier.access is None and modes({str(f): f for f in files}) == before
    ac, _, _ = control(m, root)
    said = ac.reconcile()
    assert len(said) == 1 and said[0].startswith("GPU 0: access control: the driver offers only the deprecated /proc")


def test_a_gpu_whose_capabilities_cannot_be_closed_is_not_changed(tree: tuple[Migctl, Path]) -> None:
    """Before a change the GPU's capabilities are closed; when that fails, the GPU keeps its layout
    (the old grants would otherwise reach new instances that reuse an id)."""
    m, root = tree
    caps.enable(StateStore(m.state), root)
    ac, backend, _ = control(m, root)
    applier = Applier(backend, m.state_dir)
    applier.access = ac
    os.chmod(root / "dev/nvidia-caps", 0o777)  # anyone could swap nodes: access control refuses to work there
    from migd.profiles.loader import load_profile
    result = applier.apply(load_profile(PROFILES / "day.yaml"))
    assert [r.status.value for r in result.results] == ["rolled_back"]
    assert "access control: cannot close" in (result.results[0].error or "")
    assert m("status", "-o", "json").json()["gpus"][0]["mig"]["current"] is False  # untouched


@pytest.mark.parametrize(("text", "said"), [
    ("owners: {team: {group: no-such-group-here}}", "2:26: access.owners.team.group: no group named"),
    ("owners: {team: {group: '99999999999999999999'}}", "access.owners.team.group: no group named"),  # (chown
    ("owners: {team: {user: '4294967295'}}", "access.owners.team.user: no user named"),  # overflowed, or
    ("owners: {team: {group: '²'}}", "access.owners.team.group: no group named"),  # int() refused)
    ("owners: {team: {}}", "names no group and no user"),
    ("owners: {team: {group: root}}\nunowned: everyone", "access.unowned"),
    ("owners: {}\nroot: relative/dir", "must be an absolute path"),
])
def test_a_bad_access_section_is_one_line_with_its_place(tmp_path: Path, text: str, said: str) -> None:
    cfg = tmp_path / "migd.yaml"
    cfg.write_text("access:\n" + "".join("  " + line + "\n" for line in text.splitlines()))
    with pytest.raises(ValidationError) as e:
        parse_access(load(cfg).mapping()["access"])
    assert said in str(e.value) and "\n" not in str(e.value)


def test_groups_and_users_resolve_by_name_or_number() -> None:
    team = two_groups()[0]
    assert Grant(team.gr_name, None).resolve().gid == team.gr_gid
    assert Grant(str(team.gr_gid), "0").resolve().mode == 0o440
    assert Grant(None, "root").resolve().mode == 0o400  # a user alone: owner-readable only
    with pytest.raises(KeyError, match="user 'no-such-user-here' does not exist"):
        Grant(None, "no-such-user-here").resolve()
    assert grp.getgrgid(team.gr_gid).gr_name == team.gr_name


@pytest.mark.parametrize("with_slurm", [False, True])
def test_in_slurm_mode_access_stays_off_unless_asked(tree: tuple[Migctl, Path], tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture, with_slurm: bool) -> None:
    """Slurm's cgroups own device access on a Slurm node: migd sets no node there unless
    ``access.with_slurm: true``, and says so."""
    m, root = tree
    shutil.copytree(PROFILES, tmp_path / "profiles")
    cfg = tmp_path / "migd.yaml"
    team = two_groups()[0].gr_name
    cfg.write_text(f"schedule:\n  - {{profile: day, at: '08:30'}}\naccess:\n  root: {root}\n"
                   f"  with_slurm: {str(with_slurm).lower()}\n  owners: {{notebooks: {{group: {team}}}}}\n")
    config = replace(load_config(cfg), slurm=SlurmSettings("gpu1", tmp_path / "slurm.conf", tmp_path / "gres.conf"))
    backend = sim_backend(m.state, m.fleet)
    OPENED.append(backend)
    applier = Applier(backend, m.state_dir)
    got = access_control(config, backend, applier)
    assert (got is not None) == with_slurm and (applier.access is not None) == with_slurm
    said = "access by owner is off in Slurm mode" in caplog.text
    assert said != with_slurm


def test_a_deleted_group_closes_its_instances_and_its_gid_goes_to_nobody(tree: tuple[Migctl, Path]) -> None:
    """Groups are looked up at every pass: after `groupdel`, the next `groupadd` may hand the old gid to
    another team; migd then grants nothing by that gid, closes the owner's instances and says why."""
    m, root = tree
    if shutil.which("groupadd") is None:
        pytest.skip("needs groupadd/groupdel (Debian's passwd)")
    name, gid = "migd-test-team", 64321
    subprocess.run(["groupdel", name], capture_output=True)
    subprocess.run(["groupadd", "-g", str(gid), name], check=True)
    try:
        caps.enable(StateStore(m.state), root)
        assert m("apply", str(PROFILES / "day.yaml")).code == 0
        backend = sim_backend(m.state, m.fleet)
        OPENED.append(backend)
        ac = AccessControl(AccessPolicy({"notebooks": Grant(name, None)}, Unowned.ROOT, CapsPaths(root)), backend,
                           Applier(backend, m.state_dir).owners.load)
        paths = CapsPaths(root)
        minors = read_minors(paths.mig_minors)
        nodes = {n: paths.node(minors[n]) for n in (f"gpu0/{f.parent.name}/access"
                                                   for f in paths.proc_caps.glob("gpu0/mig/gi*/access"))}
        assert ac.reconcile() == [] and set(modes(nodes).values()) == {(0, gid, 0o440)}
        subprocess.run(["groupdel", name], check=True)
        subprocess.run(["groupadd", "-g", str(gid), "migd-test-other"], check=True)  # the old gid, another team
        errors = ac.reconcile()
        assert errors == [f"owner notebooks: group {name!r} does not exist: its instances are closed to all but root"]
        assert set(modes(nodes).values()) == {(0, 0, 0o400)} and ac.missing == {"notebooks": f"group {name!r} does "
                                                                                "not exist"}
        subprocess.run(["groupdel", "migd-test-other"], check=True)
        subprocess.run(["groupadd", "-g", str(gid + 1), name], check=True)  # the team's group is back, a new gid
        assert ac.reconcile() == [] and set(modes(nodes).values()) == {(0, gid + 1, 0o440)}
    finally:
        for g in (name, "migd-test-other"):
            subprocess.run(["groupdel", g], capture_output=True)


def _hold(path: Path, uid: int = 61001, gid: int | None = None) -> int:
    """A child process of team A's user (in group ``gid``, A's by default) holding ``path`` open until
    killed: a CUDA program's handle on a capability node.  O_PATH, opened before it drops root: the
    simulated node has no driver behind it, and the kernel's stat of the fd names the node's device
    either way (root's own holders cross no team and are not counted)."""
    gid = two_groups()[0].gr_gid if gid is None else gid
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.open(path, os.O_PATH)
        os.setgroups([gid])
        os.setgid(gid)
        os.setuid(uid)
        os.write(w, b"x")
        signal.pause()
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"x"
    os.close(r)
    return pid


def _relabel_setup(m: Migctl, root: Path, tmp_path: Path) -> tuple[Applier, Path, Path]:
    caps.enable(StateStore(m.state), root)
    a, b = two_groups()
    backend = sim_backend(m.state, m.fleet)
    OPENED.append(backend)
    applier = Applier(backend, m.state_dir)
    applier.access = AccessControl(AccessPolicy({"notebooks": Grant(a.gr_name), "training": Grant(b.gr_name)},
                                                Unowned.ROOT, CapsPaths(root)), backend, applier.owners.load)
    from migd.profiles.loader import load_profile
    assert applier.apply(load_profile(PROFILES / "day.yaml")).ok
    moved = tmp_path / "day-training.yaml"
    moved.write_text((PROFILES / "day.yaml").read_text().replace("owner: notebooks", "owner: training"))
    paths = CapsPaths(root)
    gi = min(g.id for g in backend.list_gpu_instances(0))
    return applier, moved, paths.node(read_minors(paths.mig_minors)[f"gpu0/gi{gi}/access"])


def test_a_held_handle_keeps_its_instance_from_another_team(tree: tuple[Migctl, Path], tmp_path: Path) -> None:
    """A process that holds an instance's capability node open keeps a working handle whatever the
    node's mode becomes (nv-caps.c checks only at open): the owner change is refused while it holds
    it (named by pid), goes ahead once it is gone, and --on-busy force stops it first."""
    from migd.apply.result import ApplyOptions, BusyError, OnBusy
    from migd.profiles.loader import load_profile
    m, root = tree
    applier, moved, node = _relabel_setup(m, root, tmp_path)
    holder = _hold(node)
    try:
        with pytest.raises(BusyError, match=f"its owners change .* in use \\[busy: pids {holder}\\]"):
            applier.apply(load_profile(moved))
        assert set(applier.owners.load()[applier.backend.gpu(0).uuid].values()) == {"notebooks"}
        result = applier.apply(load_profile(moved), ApplyOptions(on_busy=OnBusy.FORCE, busy_timeout_s=0,
                                                                 kill_grace_s=5))
        assert result.ok and set(applier.owners.load()[applier.backend.gpu(0).uuid].values()) == {"training"}
        assert os.waitpid(holder, os.WNOHANG)[0] == holder  # stopped (SIGTERM), and only then relabelled
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(holder, 9)
            os.waitpid(holder, 0)


def test_a_held_handle_makes_its_instance_busy_for_a_destroy(tree: tuple[Migctl, Path], tmp_path: Path) -> None:
    """The instance's ids may be reused by the next layout's instance, which the held fd would then
    reach: a destroy waits for its holders as for its running processes (refused here, by pid)."""
    from migd.apply.result import BusyError
    from migd.profiles.loader import load_profile
    m, root = tree
    applier, _, node = _relabel_setup(m, root, tmp_path)
    holder = _hold(node)
    try:
        with pytest.raises(BusyError, match=f"busy: pids {holder}"):
            applier.apply(load_profile(PROFILES / "night.yaml"))
    finally:
        os.kill(holder, 9)
        os.waitpid(holder, 0)
    assert applier.apply(load_profile(PROFILES / "night.yaml")).ok  # let go: the change goes ahead


def test_a_group_change_waits_for_the_handles_the_old_group_holds(tree: tuple[Migctl, Path], tmp_path: Path) -> None:
    """A reload gives notebooks' instances to another group while a process of the old group holds
    one's node: that instance stays closed to all but root (said, with the pid) until the process lets
    go, then the new group gets it; the instances nobody holds move at once."""
    m, root = tree
    applier, _, node = _relabel_setup(m, root, tmp_path)
    ac = applier.access
    assert isinstance(ac, AccessControl)
    a, b = two_groups()
    st = os.lstat(node)
    assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (a.gr_gid, 0o440)
    holder = _hold(node)
    try:
        ac.policy = replace(ac.policy, owners={"notebooks": Grant(b.gr_name)})
        errors = ac.reconcile()
        assert len(errors) == 1 and f"pids {holder} hold its capability nodes but are not among its owner's " \
            "accounts: closed to all but root until they let go" in errors[0], errors
        assert modes({"n": node})["n"] == (0, 0, 0o400)
        others = [CapsPaths(root).node(read_minors(CapsPaths(root).mig_minors)[f"gpu0/gi{g.id}/access"])
                  for g in applier.backend.list_gpu_instances(0)]
        assert sorted(modes({str(p): p for p in others}).values()).count((0, b.gr_gid, 0o440)) == len(others) - 1
        assert ac.reconcile() == errors and modes({"n": node})["n"] == (0, 0, 0o400)  # still held: still closed
    finally:
        os.kill(holder, 9)
        os.waitpid(holder, 0)
    assert ac.reconcile() == [] and modes({"n": node})["n"] == (0, b.gr_gid, 0o440)


def test_a_handle_taken_before_migd_closed_a_new_instance_keeps_it_from_its_owner(tree: tuple[Migctl, Path]) -> None:
    """The moment after the driver makes an instance, while its capability still says
    DeviceFileModify: 1, a CUDA program of another team can have nvidia-modprobe make the node 0444
    and open it (here: night applied with no access control at all, and team A's user runs first).
    migd cannot take that handle back, so it does not open the instance to its owner while a
    process outside the owner's accounts holds it: closed to all but root, said with the pid, and
    opened to the owner once the process has let go.  Root's own holders are not strangers."""
    from tests.test_access import USER_A, USER_B, reap, run_cuda
    m, root = tree
    a, b = two_groups()
    caps.enable(StateStore(m.state), root)
    assert m("apply", str(PROFILES / "night.yaml")).code == 0  # one 7g for training, no access control yet
    mig = next(iter(caps_tree.mig_devices(root)))
    sneaker, code, err = run_cuda(root, USER_A, a.gr_gid, mig, seconds=60)
    assert code == -1, err  # nvidia-modprobe made the node world-readable, and team A got in
    root_pid, code, err = run_cuda(root, 0, 0, mig, seconds=60)
    assert code == -1, err
    backend = sim_backend(m.state, m.fleet)
    OPENED.append(backend)
    ac = AccessControl(AccessPolicy({"training": Grant(b.gr_name)}, Unowned.ROOT, CapsPaths(root)), backend,
                       Applier(backend, m.state_dir).owners.load)
    try:
        errors = ac.reconcile()
        assert errors == [f"GPU 0: GI 0: pids {sneaker} hold its capability nodes but are not among its owner's "
                          "accounts: closed to all but root until they let go"], errors
        assert run_cuda(root, USER_B, b.gr_gid, mig)[1] == 100  # the owner waits, the stranger cannot be stopped
    finally:
        reap(sneaker)
    assert ac.reconcile() == []  # root's program still holds the node: no stranger
    pid, code, err = run_cuda(root, USER_B, b.gr_gid, mig, seconds=30)
    assert code == -1, err
    reap(pid)
    reap(root_pid)


def test_a_node_directory_others_can_write_refuses_a_relabel_as_a_recut(tree: tuple[Migctl, Path],
                                                                        tmp_path: Path) -> None:
    """Anyone who can write /dev/nvidia-caps can swap nodes: an owner change there is refused, as a
    layout change is, and the instances keep their owners and labels."""
    from migd.profiles.loader import load_profile
    m, root = tree
    applier, moved, node = _relabel_setup(m, root, tmp_path)
    os.chmod(CapsPaths(root).dev, 0o777)
    result = applier.apply(load_profile(moved))
    assert [r.status for r in result.results] == [GpuStatus.ROLLED_BACK]
    assert "is not a directory that only root can write" in (result.results[0].error or "")
    assert set(applier.owners.load()[applier.backend.gpu(0).uuid].values()) == {"notebooks"}
    assert modes({"n": node})["n"][1] == two_groups()[0].gr_gid  # still notebooks'

"""``migctl status --mine`` (migd/ctl/status_out.py): the four files a CUDA process opens, what nvidia-modprobe
will make of them (the pure model, against nvidia-modprobe-utils.c), and what an ordinary user is told,
over small fake driver trees: the recorded H100's registry and mig-minors table, real character
devices (mknod: root) and real other users (a forked child that changed its ids), as the kernel checks
them.  The /proc interface is the one place regular files stand in: there the capability *is* a file."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from migd.api.status import StatusDoc
from migd.ctl.status_out import (
    CTL_MINOR,
    DEFAULTS,
    NV_MAJOR,
    Fate,
    Found,
    Node,
    Outcome,
    Owner,
    Recipe,
    Who,
    cap_recipe,
    mine_out,
    permits,
    predict,
    recipe,
)
from migd.hardware.caps import CapsPaths, read_minors
from migd.hardware.caps import modprobe_fields as fields
from migd.wire import from_json
from tests.helpers import GOLDEN, Migctl, need_root

pytestmark = pytest.mark.xdist_group("caps")  # its users open simulated capability nodes: conftest.py

FIXTURES = Path(__file__).parent / "fixtures"
USER_A, USER_B = 61001, 61002  # no passwd entry needed: the kernel checks numbers
TEAM_A, TEAM_B, VIDEO = 61101, 61102, 61103  # groups by number (the notes print them as numbers)
CAPS_MAJOR = 509  # any: nothing here opens a node
GPU_MINOR = 2  # the GPU's device minor (its NVML index is 0): /dev/nvidia2, gpu2/...


def recorded(section: str) -> str:
    """One ``### <section>`` of the driver files recorded on a real H100 (driver 580.159.04)."""
    text = (FIXTURES / "h100-sxm5-580.159.04-driver-files.txt").read_text()
    return text.split(f"### {section}\n", 1)[1].split("\n### ", 1)[0].strip() + "\n"


PARAMS = recorded("/proc/driver/nvidia/params")  # ModifyDeviceFiles: 1, DeviceFileMode: 438


# --- the model, pure ----------------------------------------------------------------------------------

def test_the_recorded_registry_reads_as_nvidia_modprobe_reads_it() -> None:
    """The scan ends at the first name over 31 characters, ``InitializeSystemMemoryAllocations``: right
    after the four fields it needs (the driver lists them first)."""
    assert [name for name, _ in fields(PARAMS)] == ["ResmanDebugLevel", "RmLogonRC", "ModifyDeviceFiles",
                                                    "DeviceFileUID", "DeviceFileGID", "DeviceFileMode"]
    assert recipe(PARAMS, "params") == Recipe(Owner(0, 0, 0o666), True, "ModifyDeviceFiles 1 in params")


def test_the_scan_stops_where_fscanf_stops() -> None:
    assert fields("A: 1\nB: x\nC: 3\n") == [("A", 1)]  # %u fails on x: the loop ends
    assert fields("A: 1\n" + "N" * 32 + ": 2\nC: 3\n") == [("A", 1)]  # %31[^:] then ':' fails
    assert fields("A:5\n\n  B :  7") == [("A", 5), ("B ", 7)]  # "\n" eats the blank; "B " is no field B


def test_the_registry_and_its_defaults() -> None:
    assert recipe(None, "params") == Recipe(DEFAULTS, True, "params is absent: nvidia-modprobe's defaults")
    assert recipe("ModifyDeviceFiles: 0\n", "p").modify is False
    assert recipe("ModifyDeviceFiles: 2\n", "p").modify is False  # only 1 is "on"
    assert recipe("ModifyDeviceFiles: 0\nDeviceFileModify: 1\n", "p").modify is True  # the last one read
    assert recipe("DeviceFileUID: 7\nDeviceFileGID: 44\nDeviceFileMode: 432\n", "p") == \
        Recipe(Owner(7, 44, 0o660), True, "p names no ModifyDeviceFiles: on by default")


def test_a_capability_is_made_only_for_a_real_uid_that_may_read_its_proc_file() -> None:
    text = "DeviceFileMinor: 300\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    assert cap_recipe(text, True) == Recipe(Owner(0, 0, 0o444), True, "DeviceFileModify 1 in its /proc file")
    assert cap_recipe(text, False).modify is False
    assert cap_recipe("DeviceFileModify: 1\n", True).modify is False  # no DeviceFileMinor: no node
    assert cap_recipe("DeviceFileMinor: -1\nDeviceFileModify: 1\n", True).modify is False
    assert cap_recipe(text.replace("Modify: 1", "Modify: 0"), True).modify is False


ON, OFF = Recipe(Owner(0, 0, 0o444), True, "on"), Recipe(Owner(0, 0, 0o444), False, "off")
GRANT = Owner(0, TEAM_A, 0o440)


@pytest.mark.parametrize(("found", "now", "r", "want"), [
    (Found.ABSENT, None, ON, Outcome(Fate.MADE, ON.owner)),
    (Found.ABSENT, None, OFF, Outcome(Fate.NONE, None)),
    (Found.DEVICE, GRANT, OFF, Outcome(Fate.KEPT, GRANT)),
    (Found.DEVICE, GRANT, ON, Outcome(Fate.RESET, ON.owner)),  # set back at the next CUDA start
    (Found.DEVICE, Owner(0, 0, 0o444), ON, Outcome(Fate.KEPT, Owner(0, 0, 0o444))),
    (Found.OTHER, None, ON, Outcome(Fate.RESET, ON.owner)),  # removed and made again
    (Found.OTHER, None, OFF, Outcome(Fate.FOREIGN, None)),
    (Found.SYMLINK, None, ON, Outcome(Fate.FOREIGN, None)),  # never followed
    (Found.SYMLINK, None, OFF, Outcome(Fate.FOREIGN, None)),
])
def test_what_nvidia_modprobe_leaves(found: Found, now: Owner | None, r: Recipe, want: Outcome) -> None:
    assert predict(found, now, r) == want


def test_the_kernels_mode_check() -> None:
    a, b, root = Who(USER_A, frozenset({TEAM_A})), Who(USER_B, frozenset({TEAM_B})), Who(0, frozenset({0}))
    assert permits(GRANT, a, os.R_OK) and not permits(GRANT, b, os.R_OK) and permits(Owner(0, 0, 0), root, 6)
    assert not permits(GRANT, a, os.R_OK | os.W_OK) and permits(Owner(0, TEAM_A, 0o660), a, 6)
    assert not permits(Owner(USER_A, TEAM_A, 0o044), a, os.R_OK)  # the owner's bits, not the group's


# --- a fake driver tree, and its users ----------------------------------------------------------------

def one_gpu() -> StatusDoc:
    """GPU 0 (bus 07:00.0) of the balanced golden layout, holding GI 3 (CI 0) and GI 9 (CI 0)."""
    doc = from_json(StatusDoc, json.loads((GOLDEN / "status-balanced.json").read_text()))
    g = doc.gpus[0]
    return replace(doc, gpus=(replace(g, instances=g.instances[:2]),), unreadable=())


@dataclass
class Tree:
    """A driver's files under ``root``: GPU 0 has device minor 2; GI 3 is team A's, GI 9 team B's."""

    root: Path

    @property
    def paths(self) -> CapsPaths:
        return CapsPaths(self.root)

    def minor(self, name: str) -> int:
        return read_minors(self.paths.mig_minors)[name]

    def cap(self, name: str) -> Path:
        return self.paths.node(self.minor(name))

    def write(self, path: Path, text: str, mode: int = 0o444, uid: int = 0) -> None:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        path.write_text(text)
        os.chown(path, uid, 0)
        os.chmod(path, mode)

    def node(self, path: Path, rdev: tuple[int, int], gid: int = 0, mode: int = 0o666) -> None:
        if os.path.lexists(path):
            path.unlink()
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(*rdev))
        os.chown(path, 0, gid, follow_symlinks=False)
        os.chmod(path, mode)

    def cap_node(self, name: str, gid: int = 0, mode: int = 0o444) -> None:
        self.node(self.cap(name), (CAPS_MAJOR, self.minor(name)), gid, mode)

    def proc(self, name: str, modify: int, mode: int = 0o444, file_mode: int = 0o444) -> None:
        self.write(self.paths.proc_file(name),
                   f"DeviceFileMinor: {self.minor(name)}\nDeviceFileMode: {mode}\nDeviceFileModify: {modify}\n",
                   file_mode)

    def params(self, modify: int) -> None:
        self.write(self.paths.params, PARAMS.replace("ModifyDeviceFiles: 1", f"ModifyDeviceFiles: {modify}"))


GI_A, CI_A, GI_B, CI_B = "gpu2/gi3/access", "gpu2/gi3/ci0/access", "gpu2/gi9/access", "gpu2/gi9/ci0/access"


@pytest.fixture
def tree() -> Iterator[Tree]:
    """Every file present and set as access by owner sets it (``DeviceFileModify`` 0, nodes root:team
    0440), the registry as recorded but ``ModifyDeviceFiles`` 0, so each test changes one thing."""
    need_root("real character devices (mknod) and other users (setuid)")
    root = Path(tempfile.mkdtemp(prefix="migd-mine-", dir="/tmp"))  # every user may look in, as /dev and /proc
    root.chmod(0o755)
    t = Tree(root)
    p = t.paths
    t.write(p.mig_minors, (FIXTURES / "h100-sxm5-580.159.04-mig-minors.txt").read_text())
    t.write(p.devices, f"Character devices:\n195 nvidia\n195 nvidiactl\n{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n")
    t.write(p.devfs_param, "1\n")
    t.params(0)
    t.write(p.gpu_information("00000000:07:00.0"), recorded("/proc/driver/nvidia/gpus/*/information")
            .split("\n", 1)[1].replace("Device Minor: \t 0", f"Device Minor: \t {GPU_MINOR}"))
    p.dev.mkdir(mode=0o755, parents=True)
    t.node(p.ctl_node, (NV_MAJOR, CTL_MINOR))
    t.node(p.gpu_node(GPU_MINOR), (NV_MAJOR, GPU_MINOR))
    t.node(p.gpu_node(0), (NV_MAJOR, 0), mode=0o600)  # the NVML index's node: not the one that counts
    for name, team in ((GI_A, TEAM_A), (CI_A, TEAM_A), (GI_B, TEAM_B), (CI_B, TEAM_B)):
        t.proc(name, 0)
        t.cap_node(name, team, 0o440)
    yield t
    shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Said:
    code: int
    out: str
    err: str

    @property
    def devices(self) -> list[str]:
        return [ln.split(" (owner")[0] for ln in self.out.splitlines() if "CUDA_VISIBLE_DEVICES=" in ln]


def as_user(uid: int, gid: int, fn: Callable[[], int], real_uid: int | None = None) -> Said:
    """``fn`` in a forked child with this uid (``real_uid``: another real uid) and group only, its stdout
    and stderr captured (not exec'd: the interpreter may sit where that user cannot reach it)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
            os.setgroups([gid] if uid else [])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid if real_uid is None else real_uid, uid, uid)
            code = fn()
            text = json.dumps([code, sys.stdout.getvalue(), sys.stderr.getvalue()])
        except BaseException as e:
            text = json.dumps([99, "", repr(e)])
        with os.fdopen(w, "w") as f:
            f.write(text)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        code, out, err = json.loads(f.read())
    os.waitpid(pid, 0)
    return Said(code, out, err)


def mine(t: Tree, uid: int, gid: int, fmt: str = "table", real_uid: int | None = None) -> Said:
    """``migctl status --mine`` over the one-GPU document, as ``uid``; the same exit in every format."""
    doc = one_gpu()  # (read here: the checkout may be closed to that user)
    said = as_user(uid, gid, lambda: mine_out(argparse.Namespace(output=fmt), doc, t.paths), real_uid)
    if fmt == "table":
        for other in ("json", "yaml"):
            assert as_user(uid, gid, lambda f=other: mine_out(argparse.Namespace(output=f), doc, t.paths),
                           real_uid).code == said.code, other
    return said


A, B = "GPU 0 GI 3 CI 0 2g.10gb", "GPU 0 GI 9 CI 0 1g.5gb"


@pytest.mark.integration
def test_all_four_present_and_permitted(tree: Tree) -> None:
    a, b, root = mine(tree, USER_A, TEAM_A), mine(tree, USER_B, TEAM_B), mine(tree, 0, 0)
    assert (a.code, a.devices, a.err) == (0, [A], ""), a
    assert (b.code, b.devices, b.err) == (0, [B], ""), b
    assert (root.code, root.devices) == (0, [A, B]), root
    nobody = mine(tree, 65534, 65534)
    assert nobody.code == 1 and nobody.out.startswith("no MIG device of this node is open to you (uid 65534"), nobody
    doc = json.loads(mine(tree, USER_A, TEAM_A, "json").out)
    assert [i["gi_id"] for i in doc["gpus"][0]["instances"]] == [3]


@pytest.mark.integration
def test_the_gpus_node_is_its_device_minors_and_refuses(tree: Tree) -> None:
    tree.node(tree.paths.gpu_node(GPU_MINOR), (NV_MAJOR, GPU_MINOR), VIDEO, 0o660)
    a = mine(tree, USER_A, TEAM_A)
    assert a.code == 1 and a.devices == [], a
    assert f"note: GPU 0: {tree.root}/dev/nvidia2: root:{VIDEO} 0660: not open to you\n" == a.err, a.err
    assert mine(tree, USER_A, VIDEO).code == 1  # in video, but not in team A: still nothing
    tree.params(1)  # nvidia-modprobe sets it back to the registry's 0666 root:root first
    a = mine(tree, USER_A, TEAM_A)
    assert (a.code, a.devices) == (0, [A]) and "nvidia-modprobe sets it back to root:root 0666 (ModifyDeviceFiles " \
        "1 in /proc/driver/nvidia/params): open to you" in a.err, a


@pytest.mark.integration
def test_nvidiactl_absent(tree: Tree) -> None:
    tree.paths.ctl_node.unlink()
    tree.params(1)
    a = mine(tree, USER_A, TEAM_A)
    assert (a.code, a.devices) == (0, [A]), a
    assert a.err == f"note: all GPUs: {tree.root}/dev/nvidiactl: absent; nvidia-modprobe (run by CUDA) will make it " \
        "root:root 0666 (ModifyDeviceFiles 1 in /proc/driver/nvidia/params): open to you\n", a.err
    tree.params(0)
    for uid, gid in ((USER_A, TEAM_A), (0, 0)):  # no node: not even root
        said = mine(tree, uid, gid)
        assert said.code == 1 and said.devices == [] and "nobody can open it, not even root" in said.err, said


@pytest.mark.integration
def test_a_capability_node_absent(tree: Tree) -> None:
    for name in (GI_A, CI_A):
        tree.cap(name).unlink()
        tree.proc(name, 1, 0o444)  # DeviceFileModify 1, DeviceFileMode 0444: made root 0444, everyone's
    a, b = mine(tree, USER_A, TEAM_A), mine(tree, USER_B, TEAM_B)
    assert (a.code, a.devices, b.code, b.devices) == (0, [A], 0, [A, B]), (a, b)
    assert f"note: GPU 0 GI 3: {tree.cap(GI_A)}: absent; nvidia-modprobe (run by CUDA) will make it root:root 0444 " \
        "(DeviceFileModify 1 in its /proc file): open to you\n" in b.err, b.err
    for name in (GI_A, CI_A):
        tree.proc(name, 0)
    for uid, gid in ((USER_A, TEAM_A), (0, 0)):
        said = mine(tree, uid, gid)
        assert A not in said.devices and f"GPU 0 GI 3: {tree.cap(GI_A)}: absent; nothing will make it " \
            "(DeviceFileModify 0 in its /proc file): nobody can open it, not even root" in said.err, said


@pytest.mark.integration
def test_an_existing_node_is_judged_as_nvidia_modprobe_will_leave_it(tree: Tree) -> None:
    """``DeviceFileModify`` 1: the node's mode now is not what the next CUDA program meets."""
    tree.proc(GI_B, 1, 0o400)  # B's GI is open to team B now; nvidia-modprobe will make it root's alone
    b = mine(tree, USER_B, TEAM_B)
    assert b.code == 1 and f"GPU 0 GI 9: {tree.cap(GI_B)}: root:{TEAM_B} 0440; at the next CUDA start " \
        "nvidia-modprobe sets it back to root:root 0400 (DeviceFileModify 1 in its /proc file): not open to you" \
        in b.err, b


@pytest.mark.integration
def test_nvidia_modprobe_acts_only_for_a_real_uid_that_may_read_the_proc_file(tree: Tree) -> None:
    tree.cap(GI_A).unlink()
    tree.proc(GI_A, 1, file_mode=0o400)
    os.chown(tree.paths.proc_file(GI_A), USER_A, 0)  # A may read it; a process whose real uid is B's may not
    assert mine(tree, USER_A, TEAM_A).devices == [A]
    said = mine(tree, USER_A, TEAM_A, real_uid=USER_B)
    assert said.code == 1 and "your real uid may not read its /proc file" in said.err, said


@pytest.mark.integration
def test_a_symlink_or_a_file_at_a_capability_node(tree: Tree) -> None:
    tree.cap(GI_A).unlink()
    tree.cap(GI_A).symlink_to(tree.cap(GI_B).name)  # to a node B may open, and A may not: never followed
    tree.cap_node(GI_B, 0, 0o444)
    for uid, gid in ((USER_A, TEAM_A), (USER_B, TEAM_B), (0, 0)):
        said = mine(tree, uid, gid)
        assert A not in said.devices and f"note: GPU 0 GI 3: {tree.cap(GI_A)}: a symbolic link, not the driver's " \
            "node (not followed): not counted\n" in said.err, said
    tree.proc(GI_A, 1, 0o444)
    assert A not in mine(tree, 0, 0).devices  # DeviceFileModify 1 or not
    tree.cap(GI_A).unlink()
    tree.write(tree.cap(GI_A), "", 0o444)  # a file: nvidia-modprobe replaces it while DeviceFileModify is 1
    said = mine(tree, USER_A, TEAM_A)
    assert said.devices == [A] and "replaces it with the driver's device root:root 0444" in said.err, said
    tree.proc(GI_A, 0)
    said = mine(tree, USER_A, TEAM_A)
    assert said.code == 1 and "not the driver's node (another file or device): not counted" in said.err, said


@pytest.mark.parametrize("unreadable", ["information", "mig-minors", "proc-cap", "params", "no-driver"])
@pytest.mark.integration
def test_the_drivers_files_unreadable(tree: Tree, unreadable: str) -> None:
    p = tree.paths
    path = {"information": p.gpu_information("00000000:07:00.0"), "mig-minors": p.mig_minors,
            "proc-cap": p.proc_file(CI_A), "params": p.params, "no-driver": p.mig_minors}[unreadable]
    if unreadable == "no-driver":
        shutil.rmtree(p.root / "proc")
        why = "No such file or directory"
    else:
        os.chmod(path, 0o400)
        why = "Permission denied"
    for fmt in ("table", "json", "yaml"):
        a = mine(tree, USER_A, TEAM_A, fmt)
        assert (a.code, a.out) == (4, ""), a
        assert a.err == f"cannot read the driver's files ({path}: {why}): which MIG devices are yours cannot be " \
            "told\n", a.err
    assert mine(tree, 0, 0).code == (4 if unreadable == "no-driver" else 0)  # root reads them


@pytest.mark.integration
def test_the_proc_interface_where_the_capability_is_the_file(tree: Tree) -> None:
    """``nv_cap_enable_devfs`` 0: the /proc file is opened as it stands (regular files, as the driver's)."""
    tree.write(tree.paths.devfs_param, "0\n")
    shutil.rmtree(tree.paths.dev)
    for name, team in ((GI_A, TEAM_A), (CI_A, TEAM_A), (GI_B, TEAM_B), (CI_B, TEAM_B)):
        tree.write(tree.paths.proc_file(name), "", 0o440)
        os.chown(tree.paths.proc_file(name), 0, team)
    a, b = mine(tree, USER_A, TEAM_A), mine(tree, USER_B, TEAM_B)
    assert (a.code, a.devices, a.err, b.devices) == (0, [A], "", [B]), (a, b)
    os.chmod(tree.paths.proc_file(CI_B), 0o400)
    assert mine(tree, USER_B, TEAM_B).code == 1


def test_migctl_on_a_machine_without_the_driver(tmp_path: Path) -> None:
    """The command as typed, here (no migd: the driver's files at /): unknown, not "none"."""
    if os.path.exists("/proc/driver/nvidia-caps/mig-minors"):
        pytest.skip("this machine has the NVIDIA driver")
    m = Migctl(tmp_path, "single-a100")
    for fmt in ("table", "json", "yaml"):
        r = m("status", "--mine", "-o", fmt)
        assert (r.code, r.out) == (4, ""), r
        assert r.err.startswith("cannot read the driver's files (/proc/driver/nvidia-caps/mig-minors: "), r.err


def test_what_is_noted() -> None:
    """Notes: every GPU-wide refusal or prediction, a capability not there for anyone or not the driver's,
    and a capability whose prediction changes this caller's answer; silence for the rest."""
    def n(fate: Fate, yours: bool, gate: bool, device: bool = False) -> bool:
        return Node("x", Path("/x"), Found.DEVICE, None, ON, Outcome(fate, None), yours, yours, gate).noted(device)
    assert not n(Fate.KEPT, True, True) and n(Fate.KEPT, False, True) and n(Fate.MADE, True, True)
    assert not n(Fate.KEPT, False, False, True)  # a capability as it stands: the answer says it all
    assert n(Fate.MADE, True, False, True) and n(Fate.RESET, False, False, True)  # the caller's device, now or then
    assert not n(Fate.MADE, True, False, False)  # another's device (its other capability refuses the caller)
    assert n(Fate.NONE, False, False) and n(Fate.FOREIGN, False, False)


def test_the_notes_users_md_quotes_are_the_ones_printed() -> None:
    """docs/users.md quotes `--mine`'s notes as tests/golden/status-mine-notes.txt pins them."""
    quoted = [ln for ln in (Path(__file__).parents[1] / "docs/users.md").read_text().splitlines()
              if ln.startswith(("note: ", "cannot read the driver's files"))]
    assert len(quoted) >= 3 and set(quoted) <= set((GOLDEN / "status-mine-notes.txt").read_text().splitlines())

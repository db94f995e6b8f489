"""The simulated driver, nvidia-modprobe and CUDA program (migd.sim.caps, .modprobe, .cuda) behave as
the real ones, including where that weakens access control: the recorded mig-minors table, a boot
that makes no device node, nvidia-modprobe's rules, handles a CUDA process keeps after its node is
closed, and device minors that are not NVML indices.  All but the first need root (mknod, setuid)."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from migd.hardware.caps import CapsPaths, caps_major, read_minors
from migd.sim import caps, caps_claims, caps_tree, modprobe
from migd.sim.backend import sim_backend
from migd.sim.cuda import main as cuda_main
from migd.sim.devnodes import capability_minors, mig_minors_text, sys_minors_text
from migd.sim.fleets import FLEET_MINORS
from migd.sim.state import StateStore
from tests.helpers import PROFILES, Migctl, need_root

# nvidia-modprobe's helper, forked users; the group "caps": tests/conftest.py
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("caps")]

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RECORDED = FIXTURES / "h100-sxm5-580.159.04-driver-files.txt"
USER, GROUP = 61011, 61011  # an ordinary user (no passwd entry needed: the kernel checks numbers)


def recorded(section: str) -> str:
    """One ``### section`` (or ``== file``) of the driver-files recording, its lines up to the next."""
    lines = RECORDED.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line in (f"### {section}", f"== {section}")) + 1
    out: list[str] = []
    for line in lines[start:]:
        if line.startswith(("###", "==")) or (not line and out and section.startswith("/proc/driver/nvidia/params")):
            break
        out.append(line)
    return "".join(line + "\n" for line in out if line)


def test_the_mig_minors_table_is_the_recorded_one() -> None:
    """All 32 GPU minors, whatever the node has, byte for byte as driver 580.159.04 wrote it; the
    imex capability is in sys-minors (its DeviceFileMinor 4323 as recorded), not in mig-minors."""
    assert mig_minors_text() == (FIXTURES / "h100-sxm5-580.159.04-mig-minors.txt").read_text()
    assert mig_minors_text(1) == mig_minors_text()  # the GPU count callers pass changes nothing
    assert sys_minors_text() == "fabric-imex-mgmt 4323\n"
    assert recorded("/proc/driver/nvidia/capabilities/fabric-imex-mgmt").startswith("DeviceFileMinor: 4323\n")
    assert capability_minors()["gpu31/gi14/ci7/access"] == 4322


# -- a node ---------------------------------------------------------------------------------------
@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Migctl, Path]]:
    """A single H100 with day's seven 1g instances, and a directory for its driver's files."""
    need_root("real character devices (mknod) and another user (setuid)")
    root = Path(tempfile.mkdtemp(prefix="migd-drv-", dir="/tmp"))
    root.chmod(0o755)
    m = Migctl(tmp_path, "single-h100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    yield m, root
    shutil.rmtree(root, ignore_errors=True)


def first_device(root: Path) -> tuple[str, int, int, int]:
    mig, (gpu, gi, ci) = next(iter(caps_tree.mig_devices(root).items()))
    return mig, gpu, gi, ci


def caps_of(root: Path, gpu: int, gi: int, ci: int) -> list[tuple[Path, Path]]:
    """(the /proc file, the node) of the GI and the CI capability."""
    paths = CapsPaths(root)
    minors = read_minors(paths.mig_minors)
    names = (f"gpu{gpu}/gi{gi}/access", f"gpu{gpu}/gi{gi}/ci{ci}/access")
    return [(paths.proc_file(n), paths.node(minors[n])) for n in names]


def mode_of(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def as_user(fn: Callable[[], int | None]) -> int | None:
    """``fn()`` in a forked child as USER (group GROUP alone): its result (None: 99)."""
    pid = os.fork()
    if pid == 0:
        code = 98
        try:
            os.setgroups([GROUP])
            os.setgid(GROUP)
            os.setuid(USER)
            got = fn()
            code = 99 if got is None else got
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return None if code == 99 else code


def run_cuda(root: Path, device: str, uid: int = USER) -> tuple[int, int, str]:
    """The simulated CUDA program as ``uid`` on ``device``, becoming ``sleep 30``: (pid, exit code or -1
    while it runs, stderr)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 98
        try:
            os.close(r)
            os.dup2(w, 2)
            sys.stderr = open(w, "w")  # noqa: SIM115 (pytest's own stderr is not fd 2)
            os.setgroups([GROUP] if uid else [])
            os.setgid(GROUP if uid else 0)
            os.setuid(uid)
            code = cuda_main(["--caps-root", str(root), "--device", device, "--", "sleep", "30"])
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            with os.fdopen(r) as f:
                return pid, os.waitstatus_to_exitcode(status), f.read()
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                os.close(r)
                return pid, -1, ""
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("the simulated CUDA program neither ran nor failed")


def reap(pid: int) -> None:
    os.kill(pid, 9)
    os.waitpid(pid, 0)


def counted(m: Migctl) -> dict[int, tuple[int | None, int | None]]:
    """The processes the simulated driver counts on GPU 0 (pid -> GI, CI), after an NVML call (which
    adopts the CUDA processes' claims)."""
    assert m("status").code == 0
    return {p.pid: (p.gi, p.ci) for p in StateStore(m.state).read().gpus[0].processes}


def write_modify_off(proc: Path) -> None:
    """As the MIG guide (and migd) do it: ``chmod u+w``, write ``DeviceFileModify: 0``."""
    os.chmod(proc, 0o644)
    with open(proc, "w") as f:
        f.write("DeviceFileModify: 0\n")


# -- a boot ---------------------------------------------------------------------------------------
def test_a_boot_makes_the_drivers_files_and_no_device_node(node: tuple[Migctl, Path]) -> None:
    m, root = node
    caps.enable(StateStore(m.state), root)
    paths = CapsPaths(root)
    assert list(paths.dev.iterdir()) == [] and mode_of(paths.dev) == (0, 0, 0o755)
    assert not os.path.lexists(paths.ctl_node) and not os.path.lexists(paths.gpu_node(0))
    assert paths.params.read_text() == recorded("/proc/driver/nvidia/params")  # every line, as recorded
    assert {"ModifyDeviceFiles: 1", "DeviceFileUID: 0", "DeviceFileGID: 0", "DeviceFileMode: 438"} \
        <= set(paths.params.read_text().splitlines())
    assert mode_of(paths.params) == (0, 0, 0o444)
    assert paths.mig_minors.read_bytes() == (FIXTURES / "h100-sxm5-580.159.04-mig-minors.txt").read_bytes()
    for rel in ("mig/config", "mig/monitor", "fabric-imex-mgmt"):
        assert (paths.proc_caps / rel).read_text() == recorded(f"/proc/driver/nvidia/capabilities/{rel}")
    assert stat.S_IMODE(os.stat(paths.proc_caps / "gpu0/mig").st_mode) == 0o555
    devices = paths.devices.read_text()
    assert f"{caps.nvidia_major()} nvidia\n{caps.nvidia_major()} nvidiactl\n" in devices
    assert caps_major(paths.devices) != caps.nvidia_major()
    _, gpu, gi, ci = first_device(root)
    for proc, _ in caps_of(root, gpu, gi, ci):  # a new capability: DeviceFileModify = ModifyDeviceFiles
        assert proc.read_text().endswith("DeviceFileMode: 292\nDeviceFileModify: 1\n")


# -- nvidia-modprobe --------------------------------------------------------------------------------
def test_nvidia_modprobe_makes_the_nodes_the_registry_and_the_capability_file_say(node: tuple[Migctl, Path]) -> None:
    m, root = node
    caps.enable(StateStore(m.state), root)
    paths = CapsPaths(root)
    nv = caps.nvidia_major()
    assert modprobe.run(root, ["-c", "255", "-c", "0"]) == 0  # as root
    for path, minor in ((paths.ctl_node, 255), (paths.gpu_node(0), 0)):
        st = os.lstat(path)
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(nv, minor) and mode_of(path) == (0, 0, 0o666)
    assert os.readlink(root / f"dev/char/{nv}:255") == "../nvidiactl"
    _, gpu, gi, ci = first_device(root)
    (proc, gi_node), _ = caps_of(root, gpu, gi, ci)
    assert modprobe.run(root, ["-f", str(proc)]) == 0
    st = os.lstat(gi_node)
    minor = read_minors(paths.mig_minors)[f"gpu{gpu}/gi{gi}/access"]
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(caps_major(paths.devices), minor)
    assert mode_of(gi_node) == (0, 0, 0o444)  # DeviceFileMode 292, uid and gid 0
    assert modprobe.run(root, ["-f", str(root / "proc/driver/nvidia/../../../etc/passwd")]) == 1  # "./"


def test_a_user_gets_a_node_only_for_a_proc_file_the_user_may_read(node: tuple[Migctl, Path]) -> None:
    """nvidia-modprobe checks access(R_OK) with the caller's real uid; it makes the node as root."""
    m, root = node
    caps.enable(StateStore(m.state), root)
    _, gpu, gi, ci = first_device(root)
    (proc, gi_node), _ = caps_of(root, gpu, gi, ci)
    os.chmod(proc, 0o400)
    assert as_user(lambda: modprobe.request(root, ["-f", str(proc)])) == 1 and not os.path.lexists(gi_node)
    os.chmod(proc, 0o444)
    assert as_user(lambda: modprobe.request(root, ["-f", str(proc)])) == 0 and mode_of(gi_node) == (0, 0, 0o444)


def test_device_file_modify_0_leaves_a_node_alone_even_an_absent_one(node: tuple[Migctl, Path]) -> None:
    m, root = node
    caps.enable(StateStore(m.state), root)
    paths = CapsPaths(root)
    _, gpu, gi, ci = first_device(root)
    (proc, gi_node), (ci_proc, ci_node) = caps_of(root, gpu, gi, ci)
    write_modify_off(proc)
    assert modprobe.run(root, ["-f", str(proc)]) == 1 and not os.path.lexists(gi_node)  # nobody can make it now
    minor = read_minors(paths.mig_minors)[f"gpu{gpu}/gi{gi}/access"]
    assert proc.read_text() == f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 0\n"  # the driver's
    assert mode_of(proc) == (0, 0, 0o644)  # (put back in place: its mode stays)
    os.mknod(gi_node, stat.S_IFCHR | 0o440, os.makedev(caps_major(paths.devices), minor))
    os.chown(gi_node, 0, GROUP)
    assert modprobe.run(root, ["-f", str(proc)]) == 0 and mode_of(gi_node) == (0, GROUP, 0o440)
    # while DeviceFileModify is 1, a node set by hand is put back to DeviceFileMode, root's: open to all
    assert modprobe.run(root, ["-f", str(ci_proc)]) == 0
    os.chmod(ci_node, 0o440)
    os.chown(ci_node, 0, GROUP)
    assert as_user(lambda: modprobe.request(root, ["-f", str(ci_proc)])) == 0 and mode_of(ci_node) == (0, 0, 0o444)


def test_a_wrong_node_is_made_again_and_a_link_removed_not_followed(node: tuple[Migctl, Path]) -> None:
    m, root = node
    caps.enable(StateStore(m.state), root)
    paths = CapsPaths(root)
    _, gpu, gi, ci = first_device(root)
    (proc, gi_node), (ci_proc, ci_node) = caps_of(root, gpu, gi, ci)
    target = root / "precious"
    target.write_text("keep\n")
    gi_node.symlink_to(target)
    assert modprobe.run(root, ["-f", str(proc)]) == 0
    assert stat.S_ISCHR(os.lstat(gi_node).st_mode) and target.read_text() == "keep\n"
    assert mode_of(target)[2] == 0o644
    minor = read_minors(paths.mig_minors)[f"gpu{gpu}/gi{gi}/ci{ci}/access"]
    os.mknod(ci_node, stat.S_IFCHR | 0o444, os.makedev(caps_major(paths.devices), minor + 1))  # the wrong minor
    assert modprobe.run(root, ["-f", str(ci_proc)]) == 0
    assert os.lstat(ci_node).st_rdev == os.makedev(caps_major(paths.devices), minor)


def test_without_setuid_nvidia_modprobe_or_with_modify_off_nothing_is_made(node: tuple[Migctl, Path]) -> None:
    m, root = node
    caps.enable(StateStore(m.state), root, setuid_modprobe=False, modify_device_files=0)
    paths = CapsPaths(root)
    _, gpu, gi, ci = first_device(root)
    (proc, gi_node), _ = caps_of(root, gpu, gi, ci)
    assert proc.read_text().endswith("DeviceFileModify: 0\n")  # nv_cap_alloc: NVreg_ModifyDeviceFiles
    assert as_user(lambda: modprobe.request(root, ["-c", "0"])) is None  # no helper: an ordinary user cannot
    assert modprobe.run(root, ["-c", "0"]) == 1  # root: the registry says hands off
    assert modprobe.run(root, ["-f", str(proc)]) == 1  # and so does the new capability's file
    assert not os.path.lexists(paths.gpu_node(0)) and not os.path.lexists(gi_node)


# -- CUDA -------------------------------------------------------------------------------------------
def test_a_cuda_program_has_its_nodes_made_and_keeps_them_open(node: tuple[Migctl, Path]) -> None:
    m, root = node
    caps.enable(StateStore(m.state), root)
    paths = CapsPaths(root)
    mig, gpu, gi, ci = first_device(root)
    pid, code, err = run_cuda(root, mig)
    try:
        assert code == -1, err
        assert mode_of(paths.ctl_node) == mode_of(paths.gpu_node(gpu)) == (0, 0, 0o666)
        assert [mode_of(n) for _, n in caps_of(root, gpu, gi, ci)] == [(0, 0, 0o444)] * 2
        held = {}  # what the exec'd program holds (no close-on-exec): the nodes themselves, as lsof shows them
        for fd in os.listdir(f"/proc/{pid}/fd"):
            st = os.stat(f"/proc/{pid}/fd/{fd}")
            if stat.S_ISCHR(st.st_mode):
                held[st.st_rdev] = fd
        rdevs, _ = caps_claims.held_devices(root, gpu, gi, ci)
        assert rdevs <= set(held) and len(rdevs) == 4
        nodes = {os.lstat(n).st_rdev: n for n in (paths.ctl_node, paths.gpu_node(gpu),
                                                   *(n for _, n in caps_of(root, gpu, gi, ci)))}
        for rdev in rdevs:
            fd = held[rdev]
            assert os.readlink(f"/proc/{pid}/fd/{fd}") == str(nodes[rdev])
            flags = int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
            assert not flags & os.O_CLOEXEC
        assert counted(m)[pid] == (gi, ci)
    finally:
        reap(pid)
    assert pid not in counted(m)  # its context died with it


def test_a_held_handle_outlives_the_closing_of_its_node(node: tuple[Migctl, Path]) -> None:
    """nv_cap_validate_and_dup_fd checks the descriptor, never the node's mode: closing the node does
    not take the instance from a process that opened it; a new open is refused."""
    m, root = node
    caps.enable(StateStore(m.state), root)
    mig, gpu, gi, ci = first_device(root)
    pid, code, err = run_cuda(root, mig)
    try:
        assert code == -1, err
        for proc, n in caps_of(root, gpu, gi, ci):  # closed as migd closes a node: root's alone, hands off
            write_modify_off(proc)
            os.chmod(n, 0o400)
        assert counted(m)[pid] == (gi, ci)  # adopted after the close: the handle is what counts
        assert counted(m)[pid] == (gi, ci)  # and it stays
        _, refused, why = run_cuda(root, mig)
        assert refused == 100 and "Permission denied" in why, why
    finally:
        reap(pid)


def test_cuda_opens_no_link_and_no_other_device(node: tuple[Migctl, Path]) -> None:
    m, root = node
    caps.enable(StateStore(m.state), root)
    paths = CapsPaths(root)
    mig, gpu, gi, ci = first_device(root)
    (proc, gi_node), _ = caps_of(root, gpu, gi, ci)
    write_modify_off(proc)  # nvidia-modprobe leaves the node as it is
    minor = read_minors(paths.mig_minors)[f"gpu{gpu}/gi{gi}/access"]
    elsewhere = root / "elsewhere"
    os.mknod(elsewhere, stat.S_IFCHR | 0o444, os.makedev(caps_major(paths.devices), minor))  # the right device
    gi_node.symlink_to(elsewhere)
    _, code, why = run_cuda(root, mig)
    assert code == 100 and "Too many levels of symbolic links" in why, why
    gi_node.unlink()
    os.mknod(gi_node, stat.S_IFCHR | 0o444, os.makedev(caps_major(paths.devices), minor + 1))
    _, code, why = run_cuda(root, mig)
    assert code == 100 and "not the driver's character device" in why, why


def test_a_claim_without_the_devices_held_is_not_counted(node: tuple[Migctl, Path]) -> None:
    m, root = node
    caps.enable(StateStore(m.state), root)
    mig, _, _, _ = first_device(root)
    pid = os.fork()
    if pid == 0:  # a process of USER that claims the device without having opened anything
        try:
            os.setgroups([GROUP])
            os.setgid(GROUP)
            os.setuid(USER)
            (root / caps_claims.CLAIMS / str(os.getpid())).write_text(f"{mig} 100\n")
            os.execvp("sleep", ["sleep", "30"])
        finally:
            os._exit(1)
    try:
        deadline = time.monotonic() + 10
        while not (root / caps_claims.CLAIMS / str(pid)).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pid not in counted(m)
        assert not (root / caps_claims.CLAIMS / str(pid)).exists()  # the claim is dropped
    finally:
        reap(pid)


# -- device minors ----------------------------------------------------------------------------------
ONE_7G = """apiVersion: migd/v1
kind: Profile
name: one
gpus:
  - select: {index: [0]}
    mig: enabled
    instances:
      - {profile: 7g, count: 1}
"""


def test_device_minors_are_not_nvml_indices(tmp_path: Path) -> None:
    """dgx-a100: NVML index 0 is the driver's GPU minor 2; its information file, capabilities, MIG
    device table and device node all say 2, and a CUDA process on it is counted on index 0."""
    need_root("real character devices (mknod) and another user (setuid)")
    m = Migctl(tmp_path, "dgx-a100")
    profile = tmp_path / "one.yaml"
    profile.write_text(ONE_7G)
    assert m("apply", str(profile)).code == 0
    backend = sim_backend(m.state, "dgx-a100")
    try:
        minors = [backend.minor_number(i) for i in range(backend.gpu_count())]
    finally:
        backend.close()
    assert minors == FLEET_MINORS["dgx-a100"] and all(i != minor for i, minor in enumerate(minors))
    root = Path(tempfile.mkdtemp(prefix="migd-drv-", dir="/tmp"))
    try:
        root.chmod(0o755)
        caps.enable(StateStore(m.state), root)
        paths = CapsPaths(root)
        state = StateStore(m.state).read()
        gpu0 = state.gpus[0]
        assert paths.gpu_information(gpu0.bus_id).read_text().endswith("Device Minor: \t 2\n")
        assert {p.name for p in paths.proc_caps.iterdir()} >= {f"gpu{x}" for x in minors}
        gi = gpu0.gis[0].id
        assert paths.proc_file(f"gpu2/gi{gi}/access").exists() and not (paths.proc_caps / f"gpu0/mig/gi{gi}").exists()
        mig, (gpu, got_gi, ci) = next(iter(caps_tree.mig_devices(root).items()))
        assert (gpu, got_gi) == (2, gi)
        pid, code, err = run_cuda(root, mig)
        try:
            assert code == -1, err
            assert os.lstat(paths.gpu_node(2)).st_rdev == os.makedev(caps.nvidia_major(), 2)
            assert not os.path.lexists(paths.gpu_node(0))
            assert counted(m)[pid] == (gi, ci)  # on NVML's GPU 0
        finally:
            reap(pid)
    finally:
        shutil.rmtree(root, ignore_errors=True)

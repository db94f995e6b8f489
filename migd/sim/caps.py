"""The simulated driver's device files and nvidia-capabilities, kept beside the simulated node under a
root of its own (a directory every local user may look into, as /proc and /dev are), and the driver's
side of the CUDA processes that open them.

What the driver does, this does (sources: open-gpu-kernel-modules 580.95.05, the nearest published
580 release to the recorded 580.159.04, ``kernel-open/nvidia/nv-caps.c`` and
``src/nvidia/arch/nvalloc/unix/src/os.c``; the recording ``tests/fixtures/h100-sxm5-580.159.04-driver-files.txt``):

- At load (:func:`enable`, a boot): ``/proc/driver/nvidia/params`` as recorded (``ModifyDeviceFiles: 1``,
  ``DeviceFileUID: 0``, ``DeviceFileGID: 0``, ``DeviceFileMode: 438``), ``/proc/devices`` with the
  ``nvidia``/``nvidiactl`` and ``nvidia-caps`` majors, the three minor tables of ``/proc/driver/nvidia-caps``
  (``migd.sim.devnodes``), the /proc capability files of ``mig/config`` (mode 0400), ``mig/monitor``
  (0444) and ``fabric-imex-mgmt`` (0400) (os.c ``osRmCapRegisterSys``), a ``gpu<minor>/mig``
  directory per GPU (``osRmCapRegisterGpu``: its name is the GPU's device minor, ``nv_get_dev_minor``)
  and each GPU's ``information`` file.  The driver makes **no** device node: ``/dev/nvidiactl``,
  ``/dev/nvidia<N>`` and every ``/dev/nvidia-caps/nvidia-cap<M>`` are nvidia-modprobe's to make
  (``migd.sim.modprobe``), so after a boot ``dev/nvidia-caps`` is empty.
- With the instances (:func:`sync`): one /proc file per existing GI and CI capability, made and removed
  with the instance (``osRmCapRegisterSmcPartition``/``...ExecutionPartition``: "access", ``OS_RUGO``),
  reading ``DeviceFileMinor``/``DeviceFileMode``/``DeviceFileModify`` (``nv_cap_procfs_read``), its
  ``DeviceFileModify`` starting at the registry's ``ModifyDeviceFiles`` (``nv_cap_alloc``).  A write
  changes only ``DeviceFileModify`` (``nv_cap_procfs_release``: ``sscanf(buffer, "DeviceFileModify: %d")``):
  the simulated file is a regular file, so a write replaces its text; the driver's next read of it
  (:func:`proc_read`, as nvidia-modprobe reads it) puts the driver's three lines back, in place.
- A CUDA process's subscription (:func:`adopt_claims`): the driver validates the file descriptor the
  process passes for each capability, and only that: that it is the ``nvidia-caps`` device with the
  capability's minor (``nv_cap_validate_and_dup_fd``), then keeps a duplicate of it for as long as the
  process holds the instance (os.c ``osRmCapAcquire``: "to let administrators know about the capability
  users", lsof).  The node's owner and mode are the kernel's business at open time, never looked at
  again: a process that opened a node keeps using the instance after the node is closed.

The held handle.  A node here is a real character device (so the kernel checks owner, mode and the
O_NOFOLLOW of an open), but of a major no driver of this machine registered: once the kernel has allowed
an open, it ends in ENXIO (``chrdev_open`` finds no driver; the permission, nodev-mount and device-cgroup
checks all come before it), so no descriptor *opened for reading* can be held.  The simulated CUDA
program (``migd.sim.cuda``) therefore pins the node with ``O_PATH|O_NOFOLLOW``, has the kernel open that
very inode (through ``/proc/self/fd``: the whole permission check), and keeps the pinned descriptor
only when the kernel allowed it (refused: it closes it and fails as CUDA does).  What it keeps is what
the driver's duplicate is to everyone else: ``/proc/PID/fd`` links to the node, and ``stat`` of it is
the character device with its major and minor (lsof, fuser and migd's ``migd.access.holders`` see it),
which :func:`adopt_claims` checks as ``nv_cap_validate_and_dup_fd`` checks a descriptor.  (A process
that pinned a node without the open would be counted as well: an O_PATH descriptor needs no permission;
the simulator trusts its CUDA program's descriptors as the driver trusts those the kernel issued.)  A
stand-in (a FIFO, a regular file in place of the node) is not used: the node must stay the driver's
character device for migd's checks and nvidia-modprobe's.

The CUDA process tells the simulated driver of itself with a claim left in ``run/nvidia-sim/claims``
(which a root NVML caller adopts: only root may read another user's ``/proc/PID/fd``).

Not modelled: the driver's per-open write buffer (a write the driver would ignore leaves
``DeviceFileModify`` at the registry's value here, where the driver keeps the old value); ``nvidia-uvm``;
capabilities of NVLink and IMEX channels; the deprecated /proc interface (``nv_cap_enable_devfs=0``,
gone from the open driver) is kept as before: the /proc file is then what a process opens and holds.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from migd.hardware.caps import CapsPaths, caps_major, ci_cap, gi_cap, read_minors, registry_modify, uses_devfs
from migd.sim.devnodes import (
    CTL_MINOR,
    NVIDIA_MAJOR,
    capability_minors,
    mig_minors_text,
    nvlink_minors_text,
    sys_minors_text,
)
from migd.sim.entry import proc_start_time
from migd.sim.gpu import SimProcess
from migd.sim.state import SimState, StateStore

GI_CI_MODE = 0o444  # os.c: GI and CI "access" files are created OS_RUGO (DeviceFileMode 292)
# The capabilities the driver makes at load (os.c osRmCapRegisterSys): name -> (/proc path under
# capabilities/, DeviceFileMode); the recording reads 256, 292 and 256.
SYS_CAPS = {"config": ("mig/config", 0o400), "monitor": ("mig/monitor", 0o444),
            "fabric-imex-mgmt": ("fabric-imex-mgmt", 0o400)}
RUN = "run/nvidia-sim"
CLAIMS = "run/nvidia-sim/claims"
DEVICES = "run/nvidia-sim/mig-devices"  # MIG UUID -> gpu minor, GI, CI (what CUDA asks the driver)
PROC_DIR_MODE = 0o555  # the recording: /proc/driver/nvidia/capabilities and below are dr-xr-xr-x

# /proc/driver/nvidia/params as driver 580.159.04 wrote it on the recorded H100 (every line, in order:
# nvidia-modprobe's reader stops at the first line that is not "name: number").
PARAMS = """ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: {modify}
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
InitializeSystemMemoryAllocations: 1
UsePageAttributeTable: 4294967295
EnableMSI: 1
EnablePCIeGen3: 0
MemoryPoolSize: 0
KMallocHeapMaxSize: 0
VMallocHeapMaxSize: 0
IgnoreMMIOCheck: 0
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: 1
RmProfilingAdminOnly: 0
PreserveVideoMemoryAllocations: 0
EnableS0ixPowerManagement: 0
S0ixPowerManagementVideoMemoryThreshold: 256
DynamicPowerManagement: 3
DynamicPowerManagementVideoMemoryThreshold: 200
RegisterPCIDriver: 1
EnablePCIERelaxedOrderingMode: 0
EnableResizableBar: 0
EnableGpuFirmware: 18
EnableGpuFirmwareLogs: 2
RmNvlinkBandwidthLinkCount: 0
EnableDbgBreakpoint: 0
OpenRmEnableUnsupportedGpus: 1
DmaRemapPeerMmio: 1
ImexChannelCount: 2048
CreateImexChannel0: 0
GrdmaPciTopoCheckOverride: 0
CoherentGPUMemoryMode: ""
RegistryDwords: ""
RegistryDwordsPerDevice: ""
RmMsg: ""
GpuBlacklist: ""
TemporaryFilePath: ""
ExcludedGpus: ""
"""


def host_majors() -> set[int]:
    """The character majors the drivers of this machine registered (its /proc/devices)."""
    used = set()
    with open("/proc/devices") as f:
        for line in f:
            if line.startswith("Block"):
                break
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                used.add(int(parts[0]))
    return used


def free_major(exclude: frozenset[int] = frozenset()) -> int:
    """A character major no driver of this machine registered (so a node of it opens nothing), from
    the dynamic range's top (Documentation/admin-guide/devices.txt: 234-254 and 384-511)."""
    used = host_majors() | exclude
    return next(m for m in range(511, 233, -1) if m not in used)


def nvidia_major() -> int:
    """The major of /dev/nvidia<N> and /dev/nvidiactl: 195 as the driver registers it (and
    nvidia-modprobe-utils.c hard-codes, NV_MAJOR_DEVICE_NUMBER), unless a driver of this machine has
    195 (a real NVIDIA driver): then a free one, which the simulated /proc/devices names instead."""
    return NVIDIA_MAJOR if NVIDIA_MAJOR not in host_majors() else free_major()


def enable(store: StateStore, root: Path, devfs: bool = True, setuid_modprobe: bool = True,
           modify_device_files: int = 1) -> None:
    """Boot the simulated node's driver with its files under ``root`` (made; needs root: mknod).

    ``setuid_modprobe``: nvidia-modprobe is installed setuid root (as nvidia-installer installs it), so
    any user's CUDA program can have it make nodes (``migd.sim.modprobe.start_helper``: a helper
    process that runs it with the caller's real ids); False: a node without it (the recorded H100 had
    none), where only root's programs make nodes.  ``modify_device_files``: the registry's
    ``ModifyDeviceFiles`` (``NVreg_ModifyDeviceFiles``)."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    paths = CapsPaths(root)
    nv = nvidia_major()
    major = free_major(frozenset({nv}))
    with store.transaction() as s:
        shutil.rmtree(paths.devices.parent, ignore_errors=True)  # a boot: /proc afresh
        devices = sorted([(nv, "nvidia"), (nv, "nvidiactl"), (major, "nvidia-caps")])
        _proc(paths.devices, "Character devices:\n" + "".join(f"{m:3d} {n}\n" for m, n in devices)
               + "\nBlock devices:\n")
        _proc(paths.params, PARAMS.format(modify=modify_device_files))
        _write(paths.devfs_param, "1\n" if devfs else "0\n")
        _write(paths.devfs_param.parents[1] / "initstate", "live\n")  # the module is loaded
        _proc(paths.mig_minors, mig_minors_text())
        _proc(paths.mig_minors.with_name("sys-minors"), sys_minors_text())
        _proc(paths.mig_minors.with_name("nvlink-minors"), nvlink_minors_text())
        _dir(paths.proc_caps, PROC_DIR_MODE)
        for name, (rel, mode) in SYS_CAPS.items():
            _proc(paths.proc_caps / rel, _cap_text(capability_minors()[name], mode, modify_device_files)
                   if devfs else "")
        for g in s.gpus:  # the driver's per-GPU information file ("Device Minor": the gpu<N> of caps)
            info = paths.gpu_information(g.bus_id)
            _proc(info, f"Model: \t\t {g.model}\nGPU UUID: \t {g.uuid}\nBus Location: \t {info.parent.name}\n"
                         f"Device Minor: \t {g.minor}\n")
            _dir(paths.proc_caps / f"gpu{g.minor}" / "mig", PROC_DIR_MODE)
        # /dev after a boot: nothing of the driver's (a fresh devtmpfs; udev's /dev/char); nvidia-caps/ as
        # nvidia-modprobe makes it (0755 root:root), empty
        dev = paths.dev.parent
        shutil.rmtree(dev, ignore_errors=True)
        for d in (dev, dev / "char", paths.dev):
            d.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.chmod(d, 0o755)
        run = root / RUN
        shutil.rmtree(run, ignore_errors=True)
        claims = root / CLAIMS
        claims.mkdir(parents=True, exist_ok=True)
        os.chmod(run, 0o755)
        os.chmod(claims, 0o1733)  # anyone may leave a claim, nobody may list or touch another's
        _write(root / DEVICES, "")
        s.caps_root, s.caps_synced = str(root), []
        sync(s)
    if setuid_modprobe:
        from migd.sim.modprobe import start_helper  # (it reads the driver's files through this module)
        start_helper(root)


def _dir(path: Path, mode: int = 0o755) -> None:
    for d in (*reversed(path.parents), path):
        if not d.exists():
            d.mkdir(mode=mode)
            os.chmod(d, mode)


def _write(path: Path, text: str, mode: int = 0o444, dir_mode: int = 0o755) -> None:
    _dir(path.parent, dir_mode)
    path.write_text(text)
    os.chmod(path, mode)


def _proc(path: Path, text: str) -> None:
    """A /proc file of the driver's: world-readable, in directories all may read and search."""
    _write(path, text, 0o444, PROC_DIR_MODE)


def _cap_text(minor: int, mode: int, modify: int) -> str:
    """What reading a capability's /proc file gives (nv-caps.c nv_cap_procfs_read)."""
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: {modify}\n"


_DRIVER_FORM = re.compile(r"DeviceFileMinor: -?\d+\nDeviceFileMode: -?\d+\nDeviceFileModify: -?\d+\n")
_WRITTEN = re.compile(r"DeviceFileModify:\s*([+-]?\d+)")  # sscanf(buffer, "DeviceFileModify: %d")


def cap_name(paths: CapsPaths, proc_file: Path) -> str | None:
    """``.../capabilities/gpu0/mig/gi1/ci0/access`` -> ``gpu0/gi1/ci0/access`` (``mig/config`` ->
    ``config``); None for a path that is no capability file."""
    try:
        parts = proc_file.relative_to(paths.proc_caps).parts
    except ValueError:
        return None
    rel = "/".join(parts)
    for name, (where, _) in SYS_CAPS.items():
        if rel == where:
            return name
    if len(parts) >= 4 and parts[1] == "mig":
        return "/".join((parts[0], *parts[2:]))
    return None


def proc_read(paths: CapsPaths, proc_file: Path) -> str:
    """What reading a capability's /proc file gives: the driver's three lines, whatever a process wrote
    there (a write changes only ``DeviceFileModify``: the module docstring); the file is put back in
    that form in place (its owner and mode stay, as a /proc entry's do)."""
    text = proc_file.read_text()
    name = cap_name(paths, proc_file)
    if name is None or text == "" or _DRIVER_FORM.fullmatch(text):  # ("": the /proc interface)
        return text
    written = _WRITTEN.match(text)
    modify = int(written.group(1)) if written else registry_modify(paths)
    mode = SYS_CAPS[name][1] if name in SYS_CAPS else GI_CI_MODE
    text = _cap_text(capability_minors()[name], mode, modify)
    try:
        with open(proc_file, "r+") as f:
            f.write(text)
            f.truncate()
    except OSError:  # a reader without root's power: it reads what the driver would say all the same
        pass
    return text


def _caps_of(s: SimState) -> set[str]:
    """Every capability the driver has now: ``gpu2/gi7/access`` and ``gpu2/gi7/ci0/access`` (by the
    GPU's device minor, os.c osRmCapRegisterGpu)."""
    out = set()
    for g in s.gpus:
        for gi in g.gis if g.mig_current else ():
            out.add(gi_cap(g.minor, gi.id))
            out.update(ci_cap(g.minor, gi.id, ci.id) for ci in gi.cis)
    return out


def sync(s: SimState) -> None:
    """The /proc tree as the driver keeps it: a file per existing capability, none for the others;
    and the MIG device table.  Incremental: only what
    changed since the last sync is touched."""
    root = Path(s.caps_root or "")
    paths = CapsPaths(root)
    now = _caps_of(s)
    devfs = uses_devfs(paths)
    minors = capability_minors()
    for name in sorted(set(s.caps_synced) - now, key=len, reverse=True):  # CIs before their GI
        path = paths.proc_file(name)
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()  # its gi<G>/ or ci<C>/ directory goes with it
        except OSError:
            pass
    if now - set(s.caps_synced):
        modify = registry_modify(paths)
        for name in sorted(now - set(s.caps_synced)):
            _proc(paths.proc_file(name), _cap_text(minors[name], GI_CI_MODE, modify) if devfs else "")
    if now != set(s.caps_synced):
        lines = [f"{g.mig_uuid(gi, ci)} {g.minor} {gi.id} {ci.id}" for g in s.gpus if g.mig_current
                 for gi in g.gis for ci in gi.cis]
        _write(root / DEVICES, "".join(line + "\n" for line in lines), 0o444)
        s.caps_synced = sorted(now)


def mig_devices(root: Path) -> dict[str, tuple[int, int, int]]:
    """The simulated driver's MIG devices: MIG UUID -> (GPU minor, GI, CI), as CUDA learns them."""
    out = {}
    for line in (root / DEVICES).read_text().splitlines():
        mig, gpu, gi, ci = line.split()
        out[mig] = (int(gpu), int(gi), int(ci))
    return out


def held_devices(root: Path, gpu_minor: int, gi: int, ci: int) -> tuple[set[int], list[Path]]:
    """What a CUDA process on that MIG device holds open: the device numbers of /dev/nvidiactl,
    /dev/nvidia<minor> and (the /dev interface) its GI and CI capability nodes; with the /proc interface
    the two /proc files instead."""
    paths = CapsPaths(root)
    nv = _chardev_major(paths, "nvidia")
    rdevs = {os.makedev(nv, CTL_MINOR), os.makedev(nv, gpu_minor)}
    names = (gi_cap(gpu_minor, gi), ci_cap(gpu_minor, gi, ci))
    if not uses_devfs(paths):
        return rdevs, [paths.proc_file(n) for n in names]
    major, minors = caps_major(paths.devices), read_minors(paths.mig_minors)
    return rdevs | {os.makedev(major, minors[n]) for n in names}, []


def _chardev_major(paths: CapsPaths, name: str) -> int:
    for line in paths.devices.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
        if line.startswith("Block"):
            break
    raise FileNotFoundError(f"{paths.devices} lists no {name} character device")


def adopt_claims(s: SimState) -> bool:
    """Count the CUDA processes that left a claim and hold their MIG device's files open (checked in
    ``/proc/PID/fd``, as nv_cap_validate_and_dup_fd checks the descriptor a process passes: the device
    and its minor, never the node's mode); a claim that does not hold is dropped.  Only a root caller
    adopts (another user's descriptors are root's to see); True when the state changed."""
    if os.geteuid() != 0:
        return False
    root = Path(s.caps_root or "")
    claims = root / CLAIMS
    try:
        names = os.listdir(claims)
    except OSError:
        return False
    if not names:
        return False
    changed = False
    devices = mig_devices(root)
    by_minor = {g.minor: g for g in s.gpus}
    for name in names:
        path = claims / name
        proc = _claimant(path, name)
        path.unlink(missing_ok=True)
        if proc is None:
            continue
        mig, mib = proc
        where = devices.get(mig)
        try:
            if where is None or where[0] not in by_minor or not _holds(int(name), *held_devices(root, *where)):
                continue
        except (OSError, KeyError):  # the driver's files are not as it made them: nothing to check against
            continue
        _, gi, ci = where
        by_minor[where[0]].processes.append(SimProcess(int(name), gi, ci, mib, real=True,
                                                       started=proc_start_time(int(name))))
        changed = True
    return changed


def _claimant(path: Path, name: str) -> tuple[str, int] | None:
    """A claim's MIG device and memory, if the file is the claiming process's own (its owner is the
    process's real uid: nobody claims for another)."""
    try:
        st = os.lstat(path)
        text = path.read_text().split()
        uid = _status(int(name))["Uid"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or len(text) != 2 or not text[1].isdigit():
        return None
    return text[0], int(text[1])


def _status(pid: int) -> dict[str, list[int]]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Uid", "Gid", "Groups"):
                out[key] = [int(x) for x in value.split()]
    return out


def _holds(pid: int, rdevs: set[int], files: list[Path]) -> bool:
    """Whether process ``pid`` has open a character device of each number in ``rdevs`` and each of
    ``files`` (the very files), as ``stat`` of its ``/proc/PID/fd`` entries shows them."""
    devices, held = set(), set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            devices.add(st.st_rdev)
        held.add((st.st_dev, st.st_ino))
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) not in held:
            return False
    return rdevs <= devices

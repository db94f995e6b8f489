"""The simulated driver's side of the CUDA processes that open a MIG device: which files such a process
holds, and the adoption of those that left a claim.

Why a module of its own: it is the one place that decides whether a process counts as a user of an
instance, apart from how the files are made (``migd.sim.caps``, ``migd.sim.caps_tree``) and from the
CUDA program that opens them (``migd.sim.cuda``, which leaves the claims).  The simulated NVML library
adopts claims through :func:`adopt_claims`.

A CUDA process's subscription (:func:`adopt_claims`): the driver validates the file descriptor the
process passes for each capability, and only that: that it is the ``nvidia-caps`` device with the
capability's minor (``nv_cap_validate_and_dup_fd``, open-gpu-kernel-modules 580.95.05
``kernel-open/nvidia/nv-caps.c``), then keeps a duplicate of it for as long as the process holds the
instance (``src/nvidia/arch/nvalloc/unix/src/os.c`` ``osRmCapAcquire``: "to let administrators know
about the capability users", lsof).  The node's owner and mode are the kernel's business at open time,
never looked at again: a process that opened a node keeps using the instance after the node is closed.

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
(which a root NVML caller adopts: only root may read another user's ``/proc/PID/fd``).  With the
deprecated /proc interface (``nv_cap_enable_devfs=0``) the /proc files are what a process opens and holds.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from migd.hardware.caps import CapsPaths, caps_major, ci_cap, gi_cap, read_minors, uses_devfs
from migd.sim.caps_tree import mig_devices
from migd.sim.devnodes import CTL_MINOR
from migd.sim.entry import proc_start_time
from migd.sim.gpu import SimProcess
from migd.sim.state import SimState

CLAIMS = "run/nvidia-sim/claims"


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

"""A simulated CUDA program: ``python -m migd.sim.cuda --caps-root ROOT [--device MIG-UUID] [--mib N]
-- COMMAND...`` starts COMMAND as a CUDA process on one MIG device of a simulated node whose driver files
(``migd.sim.caps``) live under ROOT, as the user who runs it.

What libcuda does first, it does: find the MIG device (``--device``, else the first entry of
``CUDA_VISIBLE_DEVICES``); run nvidia-modprobe (``migd.sim.modprobe``; the real one is setuid root and
libcuda forks and execs it, nvidia-modprobe(1)) for ``/dev/nvidiactl``, ``/dev/nvidia<gpu minor>`` and
the GI and CI capabilities, its exit status ignored (CUDA goes on and opens what is there); then open
``/dev/nvidiactl`` and ``/dev/nvidia<minor>`` read-write and the GI and CI capability nodes read-only,
none through a symbolic link, each checked to be the driver's character device (its major and minor;
with the deprecated /proc interface the /proc files are opened instead).  When the kernel refuses any,
CUDA sees no device ("no CUDA-capable device is detected", CUDA_ERROR_NO_DEVICE, exit 100; the exact
wording a real driver gives for a refused capability is not documented).

How a node is opened (``migd.sim.caps_claims`` says why): ``O_PATH|O_NOFOLLOW`` pins the very inode (a
symbolic link is refused as ``O_NOFOLLOW`` refuses it: ELOOP), ``fstat`` checks it is the expected
character device, and the kernel then opens that inode for real through ``/proc/self/fd`` (its whole
permission check: owner, group, mode, a nodev mount, the device cgroup).  No driver of this machine has
the simulated majors, so an open the kernel allowed ends in ENXIO (``chrdev_open``); the pinned
descriptor is then kept, without close-on-exec, as a CUDA context keeps its device files:
``/proc/PID/fd`` shows the node and its device number, which the simulated driver checks (never the
node's mode).  On success it leaves a claim for the simulated driver and becomes COMMAND, keeping its
pid and its descriptors, so the simulated GPU shows it until it exits.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from migd.hardware.caps import CapsPaths, caps_major, ci_cap, gi_cap, read_minors, uses_devfs
from migd.sim import modprobe, modprobe_rules
from migd.sim.caps_claims import CLAIMS
from migd.sim.caps_tree import mig_devices
from migd.sim.devnodes import CTL_MINOR

NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE
HELD: list[int] = []  # the descriptors this process holds (kept across exec)


def _refuse(why: str) -> int:
    print(f"CUDA error: no CUDA-capable device is detected (migd-sim: {why})", file=sys.stderr)
    return NO_DEVICE


def _hold(fd: int) -> None:
    os.set_inheritable(fd, True)  # no close-on-exec: COMMAND keeps it
    HELD.append(fd)


def open_node(node: Path, major: int, minor: int, flags: int) -> str | None:
    """Open the driver's character device ``node`` (``major``:``minor``) with ``flags`` as the kernel
    lets this process, and hold it: None, or why not."""
    try:
        pinned = os.open(node, os.O_PATH | os.O_NOFOLLOW)
    except OSError as e:
        return f"{node}: {e.strerror}"
    why = None
    st = os.fstat(pinned)
    if stat.S_ISLNK(st.st_mode):
        why = f"{node}: {os.strerror(errno.ELOOP)}"  # what open(O_NOFOLLOW) says of a symbolic link
    elif not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(major, minor):
        why = f"{node}: not the driver's character device {major}:{minor}"
    else:
        try:
            os.close(os.open(f"/proc/self/fd/{pinned}", flags))  # a driver of this machine answered: not ours
        except OSError as e:
            if e.errno not in (errno.ENXIO, errno.ENODEV):  # ENXIO: allowed, and no driver behind it
                why = f"{node}: {e.strerror}"
    if why is not None:
        os.close(pinned)
        return why
    _hold(pinned)
    return None


def _open_proc(path: Path) -> str | None:
    """The deprecated /proc interface: the capability is the /proc file itself, held open."""
    try:
        _hold(os.open(path, os.O_RDONLY | os.O_NOFOLLOW))
    except OSError as e:
        return f"{path}: {e.strerror}"
    return None


def attach(root: Path, device: str) -> str | None:
    """Open ``device``'s device files and capabilities, holding them: None, or why the kernel (or the
    driver) refused."""
    table = mig_devices(root)
    if device not in table:
        return f"{device} is not a MIG device of this node"
    gpu, gi, ci = table[device]
    paths = CapsPaths(root)
    devfs, minors = uses_devfs(paths), read_minors(paths.mig_minors)
    names = (gi_cap(gpu, gi), ci_cap(gpu, gi, ci))
    for args in (["-c", str(CTL_MINOR)], ["-c", str(gpu)], *(["-f", str(paths.proc_file(n))] for n in names)):
        modprobe.request(root, args)  # (its exit status is not CUDA's concern: the opens below are)
    nv = modprobe_rules.nvidia_get_chardev_major(paths, "nvidia")
    for node, minor in ((paths.ctl_node, CTL_MINOR), (paths.gpu_node(gpu), gpu)):
        why = open_node(node, nv, minor, os.O_RDWR)
        if why is not None:
            return f"no access to {node.name} ({why})"
    for name in names:
        if devfs:
            why = open_node(paths.node(minors[name]), caps_major(paths.devices), minors[name], os.O_RDONLY)
        else:
            why = _open_proc(paths.proc_file(name))
        if why is not None:
            return f"no access to capability {name} ({why})"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m migd.sim.cuda", description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps-root", required=True, type=Path)
    ap.add_argument("--device", default=None, help="MIG-UUID (default: CUDA_VISIBLE_DEVICES' first)")
    ap.add_argument("--mib", type=int, default=256, help="memory the program uses (default 256)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    device = args.device or (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    if not cmd or not device:
        ap.error("needs a MIG device (--device or CUDA_VISIBLE_DEVICES) and -- COMMAND")
    why = attach(args.caps_root, device)
    if why is not None:
        for fd in HELD:
            os.close(fd)
        HELD.clear()
        return _refuse(why)
    claim = args.caps_root / CLAIMS / str(os.getpid())
    fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(f"{device} {args.mib}\n")
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)
    return 0  # (not reached)


if __name__ == "__main__":
    sys.exit(main())

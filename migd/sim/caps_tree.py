"""The simulated driver's /proc capability tree, kept in step with the instances, and read as the driver
serves it; and the MIG device table a CUDA program asks the driver for.

Why a module of its own: everything else of the simulated driver's files stands on it.  The boot
(``migd.sim.caps``) writes through it, nvidia-modprobe (``migd.sim.modprobe_rules``) reads capability
files through :func:`proc_read`, the simulated NVML library and ``migd.sim.world`` call :func:`sync`
after each change of instances, and the adoption of CUDA processes (``migd.sim.caps_claims``) looks
devices up in :func:`mig_devices`.  It imports none of them.

What the driver does, this does (sources: open-gpu-kernel-modules 580.95.05, ``kernel-open/nvidia/nv-caps.c``
and ``src/nvidia/arch/nvalloc/unix/src/os.c``; the recording
``tests/fixtures/h100-sxm5-580.159.04-driver-files.txt``):

- With the instances (:func:`sync`): one /proc file per existing GI and CI capability, made and removed
  with the instance (``osRmCapRegisterSmcPartition``/``...ExecutionPartition``: "access", ``OS_RUGO``),
  reading ``DeviceFileMinor``/``DeviceFileMode``/``DeviceFileModify`` (``nv_cap_procfs_read``), its
  ``DeviceFileModify`` starting at the registry's ``ModifyDeviceFiles`` (``nv_cap_alloc``).
- A write changes only ``DeviceFileModify`` (``nv_cap_procfs_release``: ``sscanf(buffer, "DeviceFileModify: %d")``):
  the simulated file is a regular file, so a write replaces its text; the driver's next read of it
  (:func:`proc_read`, as nvidia-modprobe reads it) puts the driver's three lines back, in place.

Not modelled: the driver's per-open write buffer (a write the driver would ignore leaves
``DeviceFileModify`` at the registry's value here, where the driver keeps the old value).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from migd.hardware.caps import CapsPaths, ci_cap, gi_cap, registry_modify, uses_devfs
from migd.sim.devnodes import capability_minors
from migd.sim.state import SimState

GI_CI_MODE = 0o444  # os.c: GI and CI "access" files are created OS_RUGO (DeviceFileMode 292)
# The capabilities the driver makes at load (os.c osRmCapRegisterSys): name -> (/proc path under
# capabilities/, DeviceFileMode); the recording reads 256, 292 and 256.
SYS_CAPS = {"config": ("mig/config", 0o400), "monitor": ("mig/monitor", 0o444),
            "fabric-imex-mgmt": ("fabric-imex-mgmt", 0o400)}
RUN = "run/nvidia-sim"
DEVICES = "run/nvidia-sim/mig-devices"  # MIG UUID -> gpu minor, GI, CI (what CUDA asks the driver)
PROC_DIR_MODE = 0o555  # the recording: /proc/driver/nvidia/capabilities and below are dr-xr-xr-x


def make_dirs(path: Path, mode: int = 0o755) -> None:
    """``path`` and the directories above it that are missing, each with ``mode`` (whatever the umask)."""
    for d in (*reversed(path.parents), path):
        if not d.exists():
            d.mkdir(mode=mode)
            os.chmod(d, mode)


def write_file(path: Path, text: str, mode: int = 0o444, dir_mode: int = 0o755) -> None:
    make_dirs(path.parent, dir_mode)
    path.write_text(text)
    os.chmod(path, mode)


def write_proc(path: Path, text: str) -> None:
    """A /proc file of the driver's: world-readable, in directories all may read and search."""
    write_file(path, text, 0o444, PROC_DIR_MODE)


def cap_text(minor: int, mode: int, modify: int) -> str:
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
    text = cap_text(capability_minors()[name], mode, modify)
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
            write_proc(paths.proc_file(name), cap_text(minors[name], GI_CI_MODE, modify) if devfs else "")
    if now != set(s.caps_synced):
        lines = [f"{g.mig_uuid(gi, ci)} {g.minor} {gi.id} {ci.id}" for g in s.gpus if g.mig_current
                 for gi in g.gis for ci in gi.cis]
        write_file(root / DEVICES, "".join(line + "\n" for line in lines), 0o444)
        s.caps_synced = sorted(now)


def mig_devices(root: Path) -> dict[str, tuple[int, int, int]]:
    """The simulated driver's MIG devices: MIG UUID -> (GPU minor, GI, CI), as CUDA learns them."""
    out = {}
    for line in (root / DEVICES).read_text().splitlines():
        mig, gpu, gi, ci = line.split()
        out[mig] = (int(gpu), int(gi), int(ci))
    return out

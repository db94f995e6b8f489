"""The simulated driver's nvidia-capabilities: the /proc capability tree, the mig-minors table, the
``/dev/nvidia-caps`` nodes, kept beside the simulated node under a root of its own (a directory every
local user may look into, as /proc and /dev are), and the processes that open them.

What it models (``migd.hardware.caps`` cites the sources): one /proc capability file per existing GI and
CI (the driver makes and removes them with the instances), reading ``DeviceFileMinor``/``Mode``/
``Modify`` with the /dev interface and nothing with the /proc one; the nodes as nvidia-modprobe leaves
them (real character devices, GI and CI capabilities ``DeviceFileMode`` 0444, ``config`` 0400,
``monitor`` 0444; their major is one no driver of this machine has, so opening one that the kernel lets
you open ends in ENXIO, never in a device).  A CUDA process (``migd.sim.cuda``) must be able to open its
MIG device's GI and CI capability, as the kernel decides from the node's owner and mode; the driver
here learns of it from a claim it leaves in ``run/nvidia-sim/claims`` and checks that claim again with
the claimant's own credentials (``/proc/PID/status``), as the kernel checks them, before counting it.

Not modelled: nvidia-modprobe putting a node back to ``DeviceFileMode`` while ``DeviceFileModify`` is
1 (migd writes 0 before it relies on a node; the simulator keeps what was written).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from migd.hardware.caps import CapsPaths, ci_cap, gi_cap, read_minors, uses_devfs
from migd.sim.devnodes import mig_minors_text
from migd.sim.entry import proc_start_time
from migd.sim.gpu import SimProcess
from migd.sim.state import SimState, StateStore

GI_CI_MODE = 0o444  # DeviceFileMode of GI/CI access capabilities (the MIG guide's listing: r--r--r--)
CAP_MODES = {"config": 0o400, "monitor": 0o444}  # the guide's /dev/nvidia-caps listing
CLAIMS = "run/nvidia-sim/claims"
DEVICES = "run/nvidia-sim/mig-devices"  # MIG UUID -> gpu minor, GI, CI (what CUDA asks the driver)


def free_major() -> int:
    """A character major no driver of this machine registered (so a node of it opens nothing)."""
    used = set()
    with open("/proc/devices") as f:
        for line in f:
            if line.startswith("Block"):
                break
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                used.add(int(parts[0]))
    return next(m for m in range(511, 233, -1) if m not in used)


def enable(store: StateStore, root: Path, devfs: bool = True) -> None:
    """Give the simulated node its capability tree under ``root`` (made; needs root: mknod)."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    major, paths = free_major(), CapsPaths(root)
    with store.transaction() as s:
        _write(paths.mig_minors, mig_minors_text(len(s.gpus)))
        _write(paths.devices, f"Character devices:\n{major} nvidia-caps\n\nBlock devices:\n")
        _write(paths.devfs_param, "1\n" if devfs else "0\n")
        paths.dev.mkdir(mode=0o755, parents=True, exist_ok=True)
        for name, minor in read_minors(paths.mig_minors).items() if devfs else ():
            node = paths.node(minor)
            if not os.path.lexists(node):
                os.mknod(node, stat.S_IFCHR | CAP_MODES.get(name, GI_CI_MODE), os.makedev(major, minor))
                os.chmod(node, CAP_MODES.get(name, GI_CI_MODE))
        claims = root / CLAIMS
        claims.mkdir(parents=True, exist_ok=True)
        os.chmod(claims.parent, 0o755)
        os.chmod(claims, 0o1733)  # anyone may leave a claim, nobody may list or touch another's
        _write(root / DEVICES, "")
        for g in s.gpus:  # the driver's per-GPU information file (its "Device Minor": the gpu<N> of caps)
            info = paths.gpu_information(g.bus_id)
            _write(info, f"Model: \t\t {g.model}\nGPU UUID: \t {g.uuid}\nBus Location: \t {info.parent.name}\n"
                         f"Device Minor: \t {g.minor}\n")
        paths.proc_caps.mkdir(mode=0o755, parents=True, exist_ok=True)
        s.caps_root, s.caps_synced = str(root), []
        sync(s)


def _write(path: Path, text: str, mode: int = 0o444) -> None:
    for d in reversed(path.parents):
        if not d.exists():
            d.mkdir(mode=0o755)
    path.write_text(text)
    os.chmod(path, mode)


def _caps_of(s: SimState) -> set[str]:
    """Every capability the driver has now: ``gpu0/gi7/access`` and ``gpu0/gi7/ci0/access`` (``gpu<N>``: the
    GPU's device minor, not its NVML index)."""
    out = set()
    for g in s.gpus:
        for gi in g.gis if g.mig_current else ():
            out.add(gi_cap(g.minor, gi.id))
            out.update(ci_cap(g.minor, gi.id, ci.id) for ci in gi.cis)
    return out


def sync(s: SimState) -> None:
    """The /proc tree as the driver keeps it: a file per existing capability, none for the others;
    and the MIG device table.  Incremental: only what changed since the last sync is touched."""
    paths = CapsPaths(Path(s.caps_root or ""))
    now = _caps_of(s)
    devfs = uses_devfs(paths)
    minors = None
    for name in sorted(set(s.caps_synced) - now, key=len, reverse=True):  # CIs before their GI
        path = paths.proc_file(name)
        path.unlink(missing_ok=True)
        if path.parent.name.startswith("gi") and path.parent.parent.name == "mig":
            shutil.rmtree(path.parent, ignore_errors=True)
    for name in sorted(now - set(s.caps_synced)):
        if minors is None:
            minors = read_minors(paths.mig_minors)
        text = f"DeviceFileMinor: {minors[name]}\nDeviceFileMode: {GI_CI_MODE}\nDeviceFileModify: 1\n" if devfs \
            else ""
        _write(paths.proc_file(name), text)
    if now != set(s.caps_synced):
        lines = [f"{g.mig_uuid(gi, ci)} {g.minor} {gi.id} {ci.id}" for g in s.gpus if g.mig_current
                 for gi in g.gis for ci in gi.cis]
        _write(paths.root / DEVICES, "".join(line + "\n" for line in lines), 0o444)
        s.caps_synced = sorted(now)


def mig_devices(root: Path) -> dict[str, tuple[int, int, int]]:
    """The simulated driver's MIG devices: MIG UUID -> (GPU minor, GI, CI), as CUDA learns them."""
    out = {}
    for line in (root / DEVICES).read_text().splitlines():
        mig, gpu, gi, ci = line.split()
        out[mig] = (int(gpu), int(gi), int(ci))
    return out


def adopt_claims(s: SimState) -> bool:
    """Count the CUDA processes that left a claim and may open their MIG device (checked with their
    own credentials, as the kernel checks an open); a claim that does not hold is dropped.  True when
    the state changed."""
    claims = Path(s.caps_root or "") / CLAIMS
    try:
        names = os.listdir(claims)
    except OSError:
        return False
    if not names:
        return False
    changed = False
    devices = mig_devices(Path(s.caps_root or ""))
    for name in names:
        path = claims / name
        proc = _claimant(path, name)
        path.unlink(missing_ok=True)
        if proc is None:
            continue
        mig, mib = proc
        where = devices.get(mig)
        if where is None or not _permitted(Path(s.caps_root or ""), int(name), where):
            continue
        gpu, gi, ci = where
        on = next(g for g in s.gpus if g.minor == gpu)  # the table names a GPU by its device minor
        on.processes.append(SimProcess(int(name), gi, ci, mib, real=True, started=proc_start_time(int(name))))
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


def _permitted(root: Path, pid: int, where: tuple[int, int, int]) -> bool:
    """Whether process ``pid`` may open its MIG device's GI and CI capabilities: the kernel's check of
    owner, group and mode (a root process always may: CAP_DAC_OVERRIDE, and the MIG guide's CAP_SYS_ADMIN)."""
    gpu, gi, ci = where
    try:
        st = _status(pid)
    except OSError:
        return False
    uid, groups = st["Uid"][1], {st["Gid"][1], *st.get("Groups", [])}
    if uid == 0:
        return True
    paths = CapsPaths(root)
    devfs, minors = uses_devfs(paths), read_minors(paths.mig_minors)
    for name in (gi_cap(gpu, gi), ci_cap(gpu, gi, ci)):
        try:
            node = os.lstat(paths.opened(name, minors[name], devfs))
        except OSError:
            return False
        bits = 0o400 if node.st_uid == uid else 0o040 if node.st_gid in groups else 0o004
        if not node.st_mode & bits:
            return False
    return True

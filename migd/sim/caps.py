"""The boot of a simulated node's driver: its files under a root of its own (a directory every local
user may look into, as /proc and /dev are), as the NVIDIA driver leaves them when it loads.

Why this module: it is where a simulated node's driver files begin (:func:`enable`), and the one that
puts the parts together: the /proc capability tree (``migd.sim.caps_tree``, kept in step with the
instances afterwards), the directory where CUDA processes leave their claims (``migd.sim.caps_claims``)
and the helper that stands for nvidia-modprobe's setuid bit (``migd.sim.modprobe_helper``).  Nothing
of the simulated driver imports it back.

What the driver does at load, this does (sources: open-gpu-kernel-modules 580.95.05, the nearest
published 580 release to the recorded 580.159.04, ``kernel-open/nvidia/nv-caps.c`` and
``src/nvidia/arch/nvalloc/unix/src/os.c``; the recording ``tests/fixtures/h100-sxm5-580.159.04-driver-files.txt``):
``/proc/driver/nvidia/params`` as recorded (``ModifyDeviceFiles: 1``, ``DeviceFileUID: 0``,
``DeviceFileGID: 0``, ``DeviceFileMode: 438``), ``/proc/devices`` with the ``nvidia``/``nvidiactl`` and
``nvidia-caps`` majors, the three minor tables of ``/proc/driver/nvidia-caps`` (``migd.sim.devnodes``),
the /proc capability files of ``mig/config`` (mode 0400), ``mig/monitor`` (0444) and
``fabric-imex-mgmt`` (0400) (os.c ``osRmCapRegisterSys``), a ``gpu<minor>/mig`` directory per GPU
(``osRmCapRegisterGpu``: its name is the GPU's device minor, ``nv_get_dev_minor``) and each GPU's
``information`` file.  The driver makes **no** device node: ``/dev/nvidiactl``, ``/dev/nvidia<N>`` and
every ``/dev/nvidia-caps/nvidia-cap<M>`` are nvidia-modprobe's to make (``migd.sim.modprobe``), so
after a boot ``dev/nvidia-caps`` is empty.

The majors.  A node is a real character device (so the kernel checks owner, mode and the O_NOFOLLOW of
an open) of a major no driver of this machine registered, so that an open the kernel allowed ends in
ENXIO (``migd.sim.caps_claims`` says what a CUDA process holds then).

Not modelled: ``nvidia-uvm``; capabilities of NVLink and IMEX channels; the deprecated /proc interface
(``nv_cap_enable_devfs=0``, gone from the open driver) is kept as before: the /proc file is then what a
process opens and holds.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from migd.hardware.caps import CapsPaths
from migd.sim.caps_claims import CLAIMS
from migd.sim.caps_tree import (
    DEVICES,
    PROC_DIR_MODE,
    RUN,
    SYS_CAPS,
    cap_text,
    make_dirs,
    sync,
    write_file,
    write_proc,
)
from migd.sim.devnodes import (
    NVIDIA_MAJOR,
    capability_minors,
    mig_minors_text,
    nvlink_minors_text,
    sys_minors_text,
)
from migd.sim.modprobe_helper import start_helper
from migd.sim.state import SimState, StateStore

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
    any user's CUDA program can have it make nodes (``migd.sim.modprobe_helper.start_helper``: a helper
    process that runs it with the caller's real ids); False: a node without it (the recorded H100 had
    none), where only root's programs make nodes.  ``modify_device_files``: the registry's
    ``ModifyDeviceFiles`` (``NVreg_ModifyDeviceFiles``)."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    paths = CapsPaths(root)
    nv = nvidia_major()
    majors = {"nvidia": nv, "nvidiactl": nv, "nvidia-caps": free_major(frozenset({nv}))}
    with store.transaction() as s:
        shutil.rmtree(paths.devices.parent, ignore_errors=True)  # a boot: /proc afresh
        _load_proc(s, paths, majors, devfs, modify_device_files)
        _fresh_dev(paths)
        _fresh_run(root)
        s.caps_root, s.caps_synced = str(root), []
        sync(s)
    if setuid_modprobe:
        start_helper(root)


def _load_proc(s: SimState, paths: CapsPaths, majors: dict[str, int], devfs: bool, modify_device_files: int) -> None:
    """The driver's /proc files as it loads: the character majors (name -> major), the registry, the
    minor tables, the system capabilities and each GPU's information file and capability directory."""
    devices = sorted((m, n) for n, m in majors.items())
    write_proc(paths.devices, "Character devices:\n" + "".join(f"{m:3d} {n}\n" for m, n in devices)
               + "\nBlock devices:\n")
    write_proc(paths.params, PARAMS.format(modify=modify_device_files))
    write_file(paths.devfs_param, "1\n" if devfs else "0\n")
    write_file(paths.devfs_param.parents[1] / "initstate", "live\n")  # the module is loaded
    write_proc(paths.mig_minors, mig_minors_text())
    write_proc(paths.mig_minors.with_name("sys-minors"), sys_minors_text())
    write_proc(paths.mig_minors.with_name("nvlink-minors"), nvlink_minors_text())
    make_dirs(paths.proc_caps, PROC_DIR_MODE)
    for name, (rel, mode) in SYS_CAPS.items():
        write_proc(paths.proc_caps / rel, cap_text(capability_minors()[name], mode, modify_device_files)
                   if devfs else "")
    for g in s.gpus:  # the driver's per-GPU information file ("Device Minor": the gpu<N> of caps)
        info = paths.gpu_information(g.bus_id)
        write_proc(info, f"Model: \t\t {g.model}\nGPU UUID: \t {g.uuid}\nBus Location: \t {info.parent.name}\n"
                         f"Device Minor: \t {g.minor}\n")
        make_dirs(paths.proc_caps / f"gpu{g.minor}" / "mig", PROC_DIR_MODE)


def _fresh_dev(paths: CapsPaths) -> None:
    """/dev after a boot: nothing of the driver's (a fresh devtmpfs; udev's /dev/char); nvidia-caps/ as
    nvidia-modprobe makes it (0755 root:root), empty."""
    dev = paths.dev.parent
    shutil.rmtree(dev, ignore_errors=True)
    for d in (dev, dev / "char", paths.dev):
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(d, 0o755)


def _fresh_run(root: Path) -> None:
    """The simulated driver's run directory: an empty claims drop box and an empty MIG device table."""
    run = root / RUN
    shutil.rmtree(run, ignore_errors=True)
    make_dirs(run)  # (each 0755 whatever root's umask: a run/ others could write let them swap nvidia-sim)
    claims = root / CLAIMS
    claims.mkdir(exist_ok=True)
    os.chmod(claims, 0o1733)  # anyone may leave a claim, nobody may list or touch another's
    write_file(root / DEVICES, "")

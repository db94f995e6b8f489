"""The driver's capability minor tables, and device files for tools that look at /dev (Slurm's gres.conf).

The NVIDIA driver numbers its capabilities once, at load, from fixed tables (open-gpu-kernel-modules
580.95.05, ``kernel-open/nvidia/nv-caps.c``: ``nv_cap_tables_init`` numbers ``g_nv_cap_nvlink_table``,
``g_nv_cap_mig_table``, ``g_nv_cap_mig_gpu_table`` and ``g_nv_cap_sys_table`` in that order from 0):
``fabric-mgmt`` 0; ``config`` 1 and ``monitor`` 2; then for every GPU minor 0..31 (the table names
``gpu0`` to ``gpu31``: NV_MAX_DEVICES) and every GI id 0..14 the GI's access capability and its
eight CIs'; ``fabric-imex-mgmt`` last (4323).  The table does not depend on how many GPUs the node has.
``/proc/driver/nvidia-caps/mig-minors`` lists the MIG part (``nv_procfs_read_mig_minors``: the MIG
table, then the GPU table), ``sys-minors`` the sys table and ``nvlink-minors`` the NVLink table.
A recording from an H100 with driver 580.159.04 (``tests/fixtures/h100-sxm5-580.159.04-mig-minors.txt``,
and ``fabric-imex-mgmt``'s ``DeviceFileMinor: 4323`` in ``...-driver-files.txt``) matches this byte
for byte.  migd itself never computes a minor: it reads the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from migd.hardware.caps import ci_cap, gi_cap

NV_MAX_DEVICES = 32  # nv-caps.c g_nv_cap_mig_gpu_table: gpu0 .. gpu31
GIS_PER_GPU = 15  # NV_CAP_MIG_GI_ENTRIES: gi0 .. gi14 (the memory-slice tree: sim/gpu.py gi_id_for)
CIS_PER_GI = 8  # NV_CAP_MIG_CI_ENTRIES: ci0 .. ci7
NVIDIA_MAJOR = 195  # nvidia-modprobe-utils.c NV_MAJOR_DEVICE_NUMBER: /dev/nvidia<N> and /dev/nvidiactl
CTL_MINOR = 255  # nvidia-modprobe-utils.h NV_CTL_DEVICE_NUM: /dev/nvidiactl


def _numbered() -> list[tuple[str, int]]:
    """Every capability the driver numbers, in its order, with its minor (the nvlink table first)."""
    names = ["fabric-mgmt", "config", "monitor"]
    for g in range(NV_MAX_DEVICES):
        for gi in range(GIS_PER_GPU):
            names.append(gi_cap(g, gi))
            names.extend(ci_cap(g, gi, ci) for ci in range(CIS_PER_GI))
    names.append("fabric-imex-mgmt")
    return [(name, minor) for minor, name in enumerate(names)]


def capability_minors() -> dict[str, int]:
    """Every capability's minor: ``config`` 1, ``gpu0/gi0/access`` 3, ``fabric-imex-mgmt`` 4323."""
    return dict(_numbered())


def mig_minors_text(_gpus: int | None = None) -> str:
    """``/proc/driver/nvidia-caps/mig-minors`` as the driver writes it: all 32 GPU minors, whatever
    the node has (an argument, a GPU count callers once passed, is ignored)."""
    return "".join(f"{name} {minor}\n" for name, minor in _numbered()
                   if name not in ("fabric-mgmt", "fabric-imex-mgmt"))


def sys_minors_text() -> str:
    """``/proc/driver/nvidia-caps/sys-minors`` (nv-caps.c ``nv_procfs_read_sys_minors``)."""
    return f"fabric-imex-mgmt {capability_minors()['fabric-imex-mgmt']}\n"


def nvlink_minors_text() -> str:
    """``/proc/driver/nvidia-caps/nvlink-minors`` (nv-caps.c ``nv_procfs_read_nvlink_minors``)."""
    return "fabric-mgmt 0\n"


def make_device_nodes(root: Path, gpus: int, caps_major: int = 511) -> Path:
    """``root/nvidia<N>`` (char 195:N) for the first ``gpus`` GPU minors, ``root/nvidia-caps/
    nvidia-cap<M>`` for config, monitor and those GPUs' GI/CI capabilities, plus ``root/mig-minors``
    (the driver's whole table); needs CAP_MKNOD (root), as the nodes are real character devices."""
    caps = root / "nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    for g in range(gpus):
        _mknod(root / f"nvidia{g}", NVIDIA_MAJOR, g)
    text = mig_minors_text()
    wanted = tuple(f"gpu{g}/" for g in range(gpus))
    for line in text.splitlines():
        name, minor = line.split()
        if name in ("config", "monitor") or name.startswith(wanted):
            _mknod(caps / f"nvidia-cap{minor}", caps_major, int(minor))
    (root / "mig-minors").write_text(text)
    return root / "mig-minors"


def _mknod(path: Path, major: int, minor: int) -> None:
    if not path.exists():
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))

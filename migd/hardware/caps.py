"""The NVIDIA driver's capability interface for MIG, as its documentation and source describe it.

NVIDIA's MIG user guide, "Device Nodes and Capabilities" (R580 edition): a CUDA process needs access
to its MIG device's GPU-instance capability ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/
access`` and compute-instance capability ``.../gi<G>/ci<C>/access``; root (CAP_SYS_ADMIN) always has
it.  Two interfaces exist, chosen by the ``nvidia.ko`` parameter ``nv_cap_enable_devfs``
(``/sys/module/nvidia/parameters/nv_cap_enable_devfs``, read-only, default 1 in the driver's
nv-caps.c):

- **/dev** (``1``, the default and the guide's recommendation): the /proc files only *point* at a
  device node: they read ``DeviceFileMinor``, ``DeviceFileMode`` and ``DeviceFileModify``; access is
  opening ``/dev/nvidia-caps/nvidia-cap<minor>`` (major: ``nvidia-caps`` in ``/proc/devices``; every
  minor listed in ``/proc/driver/nvidia-caps/mig-minors``), guarded by cgroups and by the node's own
  owner and mode ("a second-level access control mechanism").  The driver does not create the nodes:
  ``nvidia-modprobe`` (setuid root, run by CUDA and nvidia-smi) does, with ``DeviceFileMode``, and
  while ``DeviceFileModify`` is 1 it may set them back to that mode; writing ``DeviceFileModify: 0``
  to the /proc file (after ``chmod u+w``) leaves the node to whoever manages it (the guide's own
  procedure).  A new capability starts with ``DeviceFileModify`` = ``NVreg_ModifyDeviceFiles``
  (nv-caps.c ``nv_cap_alloc``).
- **/proc** (``0``, deprecated): access is opening the /proc file itself, guarded by its owner and mode.

Unclear in the documentation, and handled here: whether every driver exposes the parameter (absent
is read as the default, /dev); the default ``DeviceFileMode`` of GI and CI capabilities (the guide's
listing shows them world-readable, ``-r--r--r--``, which is why any local user can use any MIG
device until someone restricts the nodes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from migd.numeral import whole


@dataclass(frozen=True)
class CapsPaths:
    """Where the driver's files are, under ``root`` ("/" on a node; the simulator's own tree in tests)."""

    root: Path = Path("/")

    @property
    def proc_caps(self) -> Path:
        return self.root / "proc/driver/nvidia/capabilities"

    @property
    def mig_minors(self) -> Path:
        return self.root / "proc/driver/nvidia-caps/mig-minors"

    @property
    def dev(self) -> Path:
        return self.root / "dev/nvidia-caps"

    @property
    def devices(self) -> Path:
        return self.root / "proc/devices"

    @property
    def devfs_param(self) -> Path:
        return self.root / "sys/module/nvidia/parameters/nv_cap_enable_devfs"

    @property
    def params(self) -> Path:
        """The driver's registry (``ModifyDeviceFiles``, ``DeviceFileUID``/``GID``/``Mode``): what
        nvidia-modprobe gives ``/dev/nvidia<N>`` and ``/dev/nvidiactl`` (nvidia-modprobe-utils.c
        ``NV_PROC_REGISTRY_PATH``)."""
        return self.root / "proc/driver/nvidia/params"

    @property
    def ctl_node(self) -> Path:
        """``/dev/nvidiactl`` (char 195:255), which every CUDA process opens."""
        return self.root / "dev/nvidiactl"

    def gpu_node(self, gpu_minor: int) -> Path:
        """``/dev/nvidia<N>`` (char 195:N), N the GPU's device minor (not its NVML index)."""
        return self.root / f"dev/nvidia{gpu_minor}"

    def proc_file(self, name: str) -> Path:
        """``gpu0/gi1/ci0/access`` (a mig-minors name) -> its /proc capability file."""
        gpu, rest = name.split("/", 1)
        return self.proc_caps / gpu / "mig" / rest

    def node(self, minor: int) -> Path:
        return self.dev / f"nvidia-cap{minor}"

    def opened(self, name: str, minor: int, devfs: bool) -> Path:
        """What a process opens to hold capability ``name``: its /dev node, or with the /proc interface
        the /proc file itself."""
        return self.node(minor) if devfs else self.proc_file(name)

    def gpu_information(self, pci_bus_id: str) -> Path:
        """The driver's ``/proc/driver/nvidia/gpus/<bus>/information`` (its "Device Minor" is the
        ``gpu<N>`` of the GPU's capabilities); NVML's 8-digit PCI domain is 4 digits there."""
        domain, rest = pci_bus_id.split(":", 1)
        return self.root / "proc/driver/nvidia/gpus" / f"{domain[-4:]}:{rest}".lower() / "information"


def read_minors(path: Path) -> dict[str, int]:
    """``gpu0/gi1/ci0/access 13`` lines -> {"gpu0/gi1/ci0/access": 13} (config/monitor lines too), as
    nvidia-container-toolkit's ``internal/nvcaps`` reads the file."""
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        minor = whole(parts[1], 9) if len(parts) == 2 else None
        if minor is not None:
            out[parts[0]] = minor
    return out


def caps_major(devices: Path) -> int:
    """The ``nvidia-caps`` character major from ``/proc/devices`` (dynamic: read, never assumed)."""
    section = ""
    for line in devices.read_text().splitlines():
        if line.endswith(":"):
            section = line
            continue
        parts = line.split()
        if section.startswith("Character") and len(parts) == 2 and parts[1] == "nvidia-caps":
            return int(parts[0])
    raise FileNotFoundError(f"{devices} lists no nvidia-caps character device (is the nvidia module loaded?)")


def uses_devfs(paths: CapsPaths) -> bool:
    """The /dev interface (``nv_cap_enable_devfs`` 1, or the parameter absent: its default) or /proc."""
    try:
        return paths.devfs_param.read_text().strip() != "0"
    except FileNotFoundError:
        return True


_FIELD = re.compile(r"([^:]{1,31}):\s*([+-]?[0-9]{1,18})\s*", re.ASCII)


def modprobe_fields(text: str) -> list[tuple[str, int]]:
    """The ``name: number`` pairs nvidia-modprobe reads from a driver file (nvidia-modprobe-utils.c
    ``while (fscanf(fp, "%31[^:]: %u\\n", name, &value) == 2)``): from the top, up to the first line
    that is not one (a string value such as ``CoherentGPUMemoryMode: ""``, or a name over 31
    characters: in the recorded H100's registry ``InitializeSystemMemoryAllocations``, right after
    the four fields it uses)."""
    out, pos = [], 0
    while (m := _FIELD.match(text, pos)) is not None:
        out.append((m.group(1), int(m.group(2))))
        pos = m.end()
    return out


def registry_modify(paths: CapsPaths) -> int:
    """The registry's ``ModifyDeviceFiles`` (``NVreg_ModifyDeviceFiles``: 1 unless the module was loaded
    with it; what every new capability's ``DeviceFileModify`` starts as, nv-caps.c ``nv_cap_alloc``),
    read as nvidia-modprobe reads it.  A registry that cannot be read is taken as the default, as
    nvidia-modprobe takes it."""
    try:
        text = paths.params.read_text()
    except OSError:
        return 1
    return next((v for name, v in reversed(modprobe_fields(text)) if name == "ModifyDeviceFiles"), 1)


def gpu_caps(minors: dict[str, int], gpu_minor: int) -> dict[str, int]:
    """Every GI and CI access capability of one GPU (by its device minor), name -> node minor."""
    prefix = f"gpu{gpu_minor}/"
    return {name: m for name, m in minors.items() if name.startswith(prefix)}


def gi_cap(gpu_minor: int, gi: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/access"


def ci_cap(gpu_minor: int, gi: int, ci: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"

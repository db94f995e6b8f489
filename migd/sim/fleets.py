"""The simulated nodes one can name with ``--sim FLEET``: the model of each GPU, by index."""

from __future__ import annotations

# Model key per GPU index.
FLEETS: dict[str, list[str]] = {
    "dgx-a100": ["A100-SXM4-80GB"] * 8,
    "dgx-a100-40gb": ["A100-SXM4-40GB"] * 8,
    "dgx-h100": ["H100-SXM5-80GB"] * 8,
    "hgx-h200": ["H200-141GB"] * 8,
    "mixed": ["A100-SXM4-40GB"] * 2 + ["H100-SXM5-80GB"] * 2,
    "a30": ["A30-24GB"] * 4,
    "h100-nvl": ["H100-NVL-94GB"] * 2,
    "single-a100": ["A100-SXM4-80GB"],
    "single-h100": ["H100-SXM5-80GB"],
    "a100-vm": ["A100-SXM4-80GB"] * 2,
    # Newer families: board sizes as NVIDIA sells them (HGX: 8 GPUs; a GB200/GB300
    # compute tray: 4; a GH200 node: 1 superchip, NVL2: 2).
    "hgx-b200": ["B200"] * 8,
    "hgx-b300": ["B300"] * 8,
    "gb200-tray": ["GB200"] * 4,
    "gb300-tray": ["GB300"] * 4,
    "gh200": ["GH200-96GB"],
    "gh200-nvl2": ["GH200-144GB"] * 2,
    "h20": ["H20-96GB"] * 8,
    "rtx-pro-6000": ["RTX-PRO-6000-Blackwell-Server"] * 8,
    "unlisted": ["unlisted-7slice"] * 2,  # a GPU migd's catalog does not know (sim/gpu.py UNLISTED)
}
# Device minors (``/dev/nvidia<minor>``, the ``gpu<minor>`` of the capabilities) per NVML index, where
# they are not the index.  NVML enumerates GPUs in PCI bus order; the driver numbers them as it probes
# them ("the first device encountered gets 0": NVIDIA/nvidia-docker#1432), and the two differ on some
# machines: NVIDIA/nvidia-installer#21 ("In A100, Minor Number is different from GPU number"; NVIDIA:
# "That's expected"), PrincetonUniversity/jobstats#34 (an AMD host: /dev/nvidia0 was nvidia-smi's GPU 6).
# A DGX A100 has two AMD EPYC sockets; this order (each socket's PCIe switches probed pair-swapped) is
# the simulator's own, no recording: it only makes every minor differ from its index.
FLEET_MINORS: dict[str, list[int]] = {
    "dgx-a100": [2, 3, 0, 1, 6, 7, 4, 5],
}
# Fleets of catalog models only (the doctor finds no difference there; "unlisted" is the exception).
CATALOG_FLEETS = sorted(f for f, keys in FLEETS.items() if all(not k.startswith("unlisted") for k in keys))
# Fleets that stand for a pass-through VM: the guest cannot reset the GPU itself, so an Ampere
# MIG mode change answers NVML_ERROR_RESET_REQUIRED and stays pending until `nvidia-smi -r`
# (nvml.h, nvmlDeviceSetMigMode).  On bare metal the driver resets the GPU itself.
PASSTHROUGH_FLEETS = frozenset({"a100-vm"})
DRIVER_VERSION = "580.105.08"
DEFAULT_FLEET = "dgx-a100"

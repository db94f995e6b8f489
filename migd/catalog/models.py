"""Offline catalog of MIG-capable GPU models: lookup by PCI device id or NVML name.

In production the live profile table from NVML is authoritative (``migctl doctor`` shows any
difference); this catalog serves offline validation (``migctl validate``/``plan`` with no GPU),
the planner's placement tables and the simulator.  It covers every device id of NVIDIA's
mig-parted ``config-default.yaml``; the tables and their sources are in ``tables.py``.
"""

from __future__ import annotations

from migd.catalog.gpumodel import (
    ARCH_AMPERE,
    ARCH_BLACKWELL,
    ARCH_HOPPER,
    CI_ENUM_COUNT,
    GI_ENUM_COUNT,
    CiProfile,
    Family,
    GiProfile,
    GpuModel,
    Media,
    Placement,
    media_conflict,
)
from migd.catalog.model_tables import ALL

__all__ = ["ARCH_AMPERE", "ARCH_BLACKWELL", "ARCH_HOPPER", "CI_ENUM_COUNT", "GI_ENUM_COUNT", "MODELS", "CiProfile",
           "Family", "GiProfile", "GpuModel", "Media", "Placement", "media_conflict", "model_for"]

MODELS: dict[str, GpuModel] = {m.key: m for m in ALL}

_BY_PCI = {m.pci_device_id: m for m in ALL}
_BY_NAME = {n: m for m in ALL for n in (m.nvml_name, *m.alt_names)}


def model_for(name: str | None = None, pci_device_id: int | None = None) -> GpuModel | None:
    """Find a model by PCI device id (preferred: names vary by driver) or NVML name."""
    if pci_device_id is not None and pci_device_id in _BY_PCI:
        return _BY_PCI[pci_device_id]
    if name is not None:
        # Older drivers print names without the "NVIDIA " prefix (facts: A100-SXM4-40GB nvml_name).
        return _BY_NAME.get(name) or _BY_NAME.get(f"NVIDIA {name}")
    return None

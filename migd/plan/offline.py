"""Planning without hardware: a GPU of a catalog model as NVML would describe it."""

from __future__ import annotations

from migd.catalog.models import GpuModel
from migd.hardware.types import GpuInfo


def fake_gpu(model: GpuModel, index: int = 0, mig: bool = True) -> GpuInfo:
    """A GPU of ``model`` as NVML would describe it, for planning without hardware."""
    return GpuInfo(index=index, uuid=f"GPU-catalog-{model.key}", name=model.nvml_name, pci_bus_id="",
                   pci_device_id=model.pci_device_id, architecture=model.architecture,
                   memory_total_bytes=model.total_memory_mib << 20, mig_current=mig, mig_pending=mig, model=model)

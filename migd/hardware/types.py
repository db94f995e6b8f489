"""The domain types every layer above the hardware speaks: GPUs, instances, MIG devices, processes,
events, one reading of a GPU, and the error NVML's failures become.  Plain frozen values."""

from __future__ import annotations

from dataclasses import dataclass, field

from migd.catalog.models import GpuModel, Placement
from migd.kinds import Word

NVML_ERROR_GPU_IS_LOST = 15  # nvml.h nvmlReturn_t
GPU_WIDE = 0xFFFFFFFF  # gpuInstanceId of an event that is not scoped to one instance


class HardwareError(Exception):
    """An NVML or nvidia-smi failure, with the NVML error code when there is one."""

    def __init__(self, message: str, code: int | None = None, gpu: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.gpu = gpu

    @property
    def lost(self) -> bool:
        """nvml.h NVML_ERROR_GPU_IS_LOST (15): "the GPU has fallen off the bus or has otherwise become
        inaccessible"; only a reset or reboot brings it back."""
        return self.code == NVML_ERROR_GPU_IS_LOST


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    pci_device_id: int
    architecture: int
    memory_total_bytes: int
    mig_current: bool
    mig_pending: bool
    model: GpuModel | None  # None: a GPU the catalog does not know (no offline validation)
    pci_subsystem_id: int = 0  # nvmlPciInfo_t.pciSubSystemId (mig-parted device filters may name it)

    @property
    def model_key(self) -> str:
        return self.model.key if self.model else self.name


@dataclass(frozen=True)
class ComputeInstance:
    id: int
    profile_id: int
    placement: Placement  # compute slices inside the GI


@dataclass(frozen=True)
class GpuInstance:
    id: int
    profile_id: int
    placement: Placement  # memory slices
    compute_instances: tuple[ComputeInstance, ...] = ()
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # hashed once: the planner's memos are keyed by the GIs that exist
        object.__setattr__(self, "_hash", hash((self.id, self.profile_id, self.placement, self.compute_instances)))

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_memory_bytes: int | None
    gi_id: int | None  # None: a process on a GPU in non-MIG mode
    ci_id: int | None


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (= one compute instance) as CUDA sees it."""

    gpu_index: int
    gi_id: int
    ci_id: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    processes: tuple[ProcessInfo, ...] = ()


@dataclass(frozen=True)
class GpmMetrics:
    """Per-GPU-instance activity from GPM, each a ratio 0..1 (None where NVML gave none)."""

    gi_id: int
    sm_active: float | None
    sm_occupancy: float | None
    graphics_active: float | None
    tensor_active: float | None
    dram_active: float | None


class EventKind(Word):
    XID = "xid"
    MIG_CONFIG_CHANGE = "mig_config_change"


@dataclass(frozen=True)
class GpuEvent:
    gpu_index: int
    kind: EventKind
    xid: int | None = None
    gi_id: int | None = None  # None: GPU-wide
    ci_id: int | None = None


@dataclass(frozen=True)
class GpuState:
    """One GPU as read at one moment.  The planner, the post-apply check and the isolation audit
    all work from one reading instead of each asking NVML again."""

    gpu: GpuInfo
    instances: tuple[GpuInstance, ...] = ()
    devices: tuple[MigDevice, ...] = ()
    pids: tuple[int, ...] = ()  # compute processes of a GPU in non-MIG mode

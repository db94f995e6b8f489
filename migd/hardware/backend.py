"""The one interface through which migd touches GPUs, and the domain objects it returns.

There is exactly one implementation that talks to hardware, :class:`migd.hardware.nvml.NvmlBackend`;
tests and the demo run that same class over the simulated NVML library (``migd.sim``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from migd.hardware.catalog import GpuModel, Placement
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


class GpuView(Protocol):
    """One GPU's layout as read once for the sampler (the adapter keeps its handles behind it): read
    again only when its MIG mode or layout changes."""

    @property
    def index(self) -> int: ...

    @property
    def info(self) -> GpuInfo: ...

    @property
    def instances(self) -> tuple[GpuInstance, ...]: ...

    @property
    def gpm(self) -> bool: ...


@runtime_checkable
class GpuReader(Protocol):
    """What reading a node's GPUs takes: the narrow port of status, plans and the post-apply check."""

    def gpu_count(self) -> int: ...

    def gpu(self, index: int) -> GpuInfo: ...

    def list_gpu_instances(self, index: int) -> list[GpuInstance]: ...

    def list_mig_devices(self, index: int) -> list[MigDevice]: ...

    def gpu_processes(self, index: int) -> list[ProcessInfo]:
        """Every compute process on the GPU (in MIG mode too, with its GI/CI)."""
        ...


@runtime_checkable
class GpuWriter(Protocol):
    """The changes an apply makes, one NVML operation each."""

    def set_mig_mode(self, index: int, enabled: bool) -> bool:
        """Request a MIG mode; True if it is now current, False if it waits for a GPU reset."""
        ...

    def reset_gpu(self, index: int) -> None: ...

    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> int: ...

    def create_compute_instance(self, index: int, gi_id: int, ci_profile_id: int,
                                placement: Placement | None = None) -> int: ...

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None: ...

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None: ...


@runtime_checkable
class ApplyPort(GpuReader, GpuWriter, Protocol):
    """What the applier takes: read and change GPUs (an in-memory fake of it runs its unit tests)."""


class GpuBackend(ApplyPort, Protocol):
    """Everything migd does to a GPU (the NVML adapter is the one implementation).  GPUs are named by
    their NVML index; each consumer takes the narrowest port it needs."""

    def driver_version(self) -> str: ...

    def nvml_version(self) -> str: ...

    def list_gpus(self) -> list[GpuInfo]: ...

    # The sampler's per-layout view (hardware/nvml_view.py): read once, then only what changes.
    def open_view(self, index: int) -> GpuView: ...
    def close_view(self, view: GpuView) -> None: ...
    def view_mode(self, view: GpuView) -> tuple[bool, bool]: ...
    def view_devices(self, view: GpuView) -> list[MigDevice]: ...
    def view_processes(self, view: GpuView) -> list[ProcessInfo]: ...
    def view_activity(self, view: GpuView, interval_s: float) -> dict[int, GpmMetrics]: ...

    def minor_number(self, index: int) -> int:
        """The N of the GPU's /dev/nvidiaN (nvml.h nvmlDeviceGetMinorNumber): not always its index."""
        ...

    def gi_profiles(self, index: int) -> list[Any]:
        """The live GI profile table (NVML profile info structs); empty where NVML offers none."""
        ...

    def possible_placements(self, index: int, profile_id: int) -> list[Placement]: ...

    def probe_mig_devices(self, index: int) -> dict[tuple[int, int], str | None]:
        """(GI, CI) -> None if the MIG device answers (handle, memory, processes), else the error."""
        ...

    def gpm_supported(self, index: int) -> bool: ...

    def gpm_sample(self, index: int, gi_ids: list[int], interval_s: float = 0.1) -> dict[int, GpmMetrics]: ...

    def wait_event(self, timeout_ms: int) -> GpuEvent | None: ...

    def probe_events(self) -> dict[int, str]:
        """Register events on a throw-away set: GPUs that cannot be watched, and why."""
        ...

    def close(self) -> None: ...


def read_state(backend: GpuReader, gpu: GpuInfo) -> GpuState:
    """Instances and MIG devices (with their processes) of a MIG GPU, or the processes of a whole GPU."""
    i = gpu.index
    if not gpu.mig_current:
        return GpuState(gpu, pids=tuple(sorted(p.pid for p in backend.gpu_processes(i))))
    return GpuState(gpu, tuple(backend.list_gpu_instances(i)), tuple(backend.list_mig_devices(i)))

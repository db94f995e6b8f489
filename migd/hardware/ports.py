"""The ports through which migd touches GPUs: small protocols, each consumer taking the narrowest.

``GpuReader`` (status, plans, the post-apply check), ``GpuWriter`` (the apply's changes), ``ApplyPort``
(both: the applier; ``tests/fakes.py`` is an in-memory one), ``GpuView`` (the sampler's cached view),
and ``GpuBackend``, everything: its one implementation is ``migd.hardware.nvml.backend.NvmlBackend``,
which tests and the demo run over the simulated NVML library (``migd.sim``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from migd.catalog.models import Placement
from migd.hardware.types import (
    GpmMetrics,
    GpuEvent,
    GpuInfo,
    GpuInstance,
    GpuState,
    MigDevice,
    ProcessInfo,
)


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


class ViewSource(Protocol):
    """What the sampler needs: a per-layout view (read once, then only what changes) and the per-cycle
    readings through it."""

    def gpu_count(self) -> int: ...
    def open_view(self, index: int) -> GpuView: ...
    def close_view(self, view: GpuView) -> None: ...
    def view_mode(self, view: GpuView) -> tuple[bool, bool]: ...
    def view_devices(self, view: GpuView) -> list[MigDevice]: ...
    def view_processes(self, view: GpuView) -> list[ProcessInfo]: ...
    def view_activity(self, view: GpuView, interval_s: float) -> dict[int, GpmMetrics]: ...


class GpuBackend(ApplyPort, ViewSource, Protocol):
    """Everything migd does to a GPU (the NVML adapter is the one implementation).  GPUs are named by
    their NVML index; each consumer takes the narrowest port it needs."""

    def driver_version(self) -> str: ...

    def nvml_version(self) -> str: ...

    def list_gpus(self) -> list[GpuInfo]: ...

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

    def watch_events(self) -> None:
        """Register for events now, not at the first :meth:`wait_event`: NVML delivers no event from
        before a set's registration, so a fault watch that starts must be listening when it says so."""
        ...

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

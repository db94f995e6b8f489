"""What the sampler reads once per layout and what it reads every cycle.

nvml.h: GPU-instance profile info "is immutable throughout the lifetime of a MIG mode"; handles,
names and UUIDs of MIG devices live as long as their instances ("handles become invalid if the
parent device is unbound/reset or the GI is destroyed").  So a :class:`NvmlView` keeps them, and a
cycle asks only what changes: the MIG mode (to notice a change), each MIG device's memory and
processes, and GPM.  The two GPM sample buffers per GPU instance are allocated with the view and
freed with it (nvmlGpmSampleFree), not per cycle; the first sample is taken as the view opens and
each cycle adds one (:class:`~migd.hardware.nvml.telemetry.GpmRing`).  A view is dropped on a MIG-config-change event,
an apply, a mode change or any error while it is used; the next cycle reads the GPU afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml

from migd.hardware.nvml.call import Nvml
from migd.hardware.nvml.telemetry import GpmRing, alloc_samples, free_samples
from migd.hardware.types import GpmMetrics, GpuInfo, GpuInstance, HardwareError, MigDevice, ProcessInfo


@dataclass(frozen=True)
class ViewDevice:
    handle: Any
    gi_id: int
    ci_id: int
    uuid: str
    name: str


@dataclass
class NvmlView:
    index: int
    info: GpuInfo
    handle: Any
    instances: tuple[GpuInstance, ...] = ()
    devices: tuple[ViewDevice, ...] = ()
    gpm_ring: GpmRing | None = None  # GI id -> GPM sample pair (kept per layout), rolling

    @property
    def gpm(self) -> bool:
        return self.gpm_ring is not None


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def view_devices(nvml: Nvml, index: int, mig_handles: list[tuple[Any, int, int]]) -> tuple[ViewDevice, ...]:
    """What stays of each MIG device while it lives: its handle, ids, UUID and name."""
    return tuple(ViewDevice(h, gi, ci, _str(nvml(pynvml.nvmlDeviceGetUUID, h, gpu=index)),
                            _str(nvml(pynvml.nvmlDeviceGetName, h, gpu=index))) for h, gi, ci in mig_handles)


def open_view(nvml: Nvml, info: GpuInfo, handle: Any, instances: tuple[GpuInstance, ...],
              mig_handles: list[tuple[Any, int, int]], gpm: bool) -> NvmlView:
    view = NvmlView(info.index, info, handle, instances, view_devices(nvml, info.index, mig_handles))
    if gpm:
        view.gpm_ring = GpmRing(alloc_samples(nvml, sorted({g.id for g in instances})))
        try:
            view.gpm_ring.prime(nvml, handle, info.index)
        except HardwareError:
            pass  # counted by the error callback; the first read primes again and reports no activity
        except BaseException:
            close_view(nvml, view)
            raise
    return view


def close_view(nvml: Nvml, view: NvmlView) -> None:
    if view.gpm_ring is not None:
        free_samples(nvml, view.gpm_ring.samples, view.index)
        view.gpm_ring = None


def view_mode(nvml: Nvml, view: NvmlView) -> tuple[bool, bool]:
    current, pending = nvml(pynvml.nvmlDeviceGetMigMode, view.handle, gpu=view.index)
    return bool(current), bool(pending)


def read_devices(nvml: Nvml, index: int, devices: tuple[ViewDevice, ...]) -> list[MigDevice]:
    """Memory and processes of each MIG device: the two calls a cycle needs per device."""
    out = []
    for d in devices:
        mem = nvml(pynvml.nvmlDeviceGetMemoryInfo, d.handle, gpu=index)
        procs = nvml(pynvml.nvmlDeviceGetComputeRunningProcesses, d.handle, gpu=index)
        out.append(MigDevice(gpu_index=index, gi_id=d.gi_id, ci_id=d.ci_id, uuid=d.uuid, name=d.name,
                             memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used),
                             processes=tuple(ProcessInfo(pid=int(p.pid), used_memory_bytes=p.usedGpuMemory,
                                                         gi_id=d.gi_id, ci_id=d.ci_id) for p in procs)))
    return out


def read_view_devices(nvml: Nvml, view: NvmlView) -> list[MigDevice]:
    """Each MIG device's memory, and its processes from one listing of the parent GPU instead of one
    per device: nvml.h's nvmlProcessInfo_t carries each process's gpuInstanceId/computeInstanceId
    "if MIG is enabled" (the driver's answer on the parent handle under MIG; nvidia-smi's process
    table shows the same GI/CI columns).  A cycle costs 1 + n calls here instead of 2n."""
    with nvml.session.shared():
        by_device: dict[tuple[int, int], list[ProcessInfo]] = {}
        for p in nvml(pynvml.nvmlDeviceGetComputeRunningProcesses, view.handle, gpu=view.index):
            gi, ci = int(p.gpuInstanceId), int(p.computeInstanceId)
            by_device.setdefault((gi, ci), []).append(ProcessInfo(pid=int(p.pid), used_memory_bytes=p.usedGpuMemory,
                                                                  gi_id=gi, ci_id=ci))
        out = []
        memory: dict[int, Any] = {}  # GI id -> its memory: every MIG device of a GI reports the GI's
        for d in view.devices:
            mem = memory.get(d.gi_id)
            if mem is None:
                mem = memory[d.gi_id] = nvml(pynvml.nvmlDeviceGetMemoryInfo, d.handle, gpu=view.index)
            out.append(MigDevice(gpu_index=view.index, gi_id=d.gi_id, ci_id=d.ci_id, uuid=d.uuid, name=d.name,
                                 memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used),
                                 processes=tuple(by_device.get((d.gi_id, d.ci_id), ()))))
        return out


def read_activity(nvml: Nvml, view: NvmlView, interval_s: float) -> dict[int, GpmMetrics]:
    """Activity since the previous read (or since the view opened), at least ``interval_s`` apart."""
    if view.gpm_ring is None:
        return {}
    return view.gpm_ring.read(nvml, view.handle, view.index, interval_s)

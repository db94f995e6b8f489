"""What the sampler reads once per layout and what it reads every cycle (issue 16).

nvml.h: GPU-instance profile info "is immutable throughout the lifetime of a MIG mode"; handles,
names and UUIDs of MIG devices live as long as their instances ("handles become invalid if the
parent device is unbound/reset or the GI is destroyed").  So a :class:`GpuView` keeps them, and a
cycle asks only what changes: the MIG mode (to notice a change), each MIG device's memory and
processes, and GPM.  The two GPM sample buffers per GPU instance are allocated with the view and
freed with it (nvmlGpmSampleFree), not per cycle.  A view is dropped on a MIG-config-change event,
an apply, a mode change or any error while it is used; the next cycle reads the GPU afresh.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from migd.hardware.backend import GpmMetrics, GpuInfo, GpuInstance, HardwareError, MigDevice, ProcessInfo
from migd.hardware.nvml_telemetry import gpm_metrics
from migd.hardware.nvmlcall import Nvml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ViewDevice:
    handle: Any
    gi_id: int
    ci_id: int
    uuid: str
    name: str


@dataclass
class GpuView:
    index: int
    info: GpuInfo
    handle: Any
    instances: tuple[GpuInstance, ...] = ()
    devices: tuple[ViewDevice, ...] = ()
    samples: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # GI id -> GPM sample pair

    @property
    def gpm(self) -> bool:
        return bool(self.samples)


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def open_view(nvml: Nvml, info: GpuInfo, handle: Any, instances: tuple[GpuInstance, ...],
              mig_handles: list[tuple[Any, int, int]], gpm: bool) -> GpuView:
    i = info.index
    devices = tuple(ViewDevice(h, gi, ci, _str(nvml("nvmlDeviceGetUUID", h, gpu=i)),
                               _str(nvml("nvmlDeviceGetName", h, gpu=i))) for h, gi, ci in mig_handles)
    view = GpuView(i, info, handle, instances, devices)
    if gpm:
        try:
            for gi in sorted({g.id for g in instances}):
                first = nvml("nvmlGpmSampleAlloc")
                view.samples[gi] = (first, None)  # kept at once: a failing second alloc still frees it
                view.samples[gi] = (first, nvml("nvmlGpmSampleAlloc"))
        except HardwareError:
            close_view(nvml, view)
            raise
    return view


def close_view(nvml: Nvml, view: GpuView) -> None:
    """Give the GPM sample buffers back (library memory: nvml.h nvmlGpmSampleFree)."""
    for pair in view.samples.values():
        for s in pair:
            if s is None:
                continue
            try:
                nvml("nvmlGpmSampleFree", s)
            except HardwareError as e:
                log.warning("GPU %d: freeing a GPM sample failed: %s", view.index, e)
    view.samples.clear()


def view_mode(nvml: Nvml, view: GpuView) -> tuple[bool, bool]:
    current, pending = nvml("nvmlDeviceGetMigMode", view.handle, gpu=view.index)
    return bool(current), bool(pending)


def read_devices(nvml: Nvml, view: GpuView) -> list[MigDevice]:
    """Memory and processes of each MIG device: the two calls a cycle needs per device."""
    out = []
    for d in view.devices:
        mem = nvml("nvmlDeviceGetMemoryInfo", d.handle, gpu=view.index)
        procs = nvml("nvmlDeviceGetComputeRunningProcesses", d.handle, gpu=view.index)
        out.append(MigDevice(gpu_index=view.index, gi_id=d.gi_id, ci_id=d.ci_id, uuid=d.uuid, name=d.name,
                             memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used),
                             processes=tuple(ProcessInfo(pid=int(p.pid), used_memory_bytes=p.usedGpuMemory,
                                                         gi_id=d.gi_id, ci_id=d.ci_id) for p in procs)))
    return out


def read_activity(nvml: Nvml, view: GpuView, interval_s: float) -> dict[int, GpmMetrics]:
    """Two GPM samples per GPU instance at least ``interval_s`` apart (nvml.h: "greater than 100ms")
    into the view's own buffers, then one metrics read per instance."""
    with nvml.session.shared():  # a reset waits until the samples are read
        for gi, (s1, _) in view.samples.items():
            nvml("nvmlGpmMigSampleGet", view.handle, gi, s1, gpu=view.index)
        time.sleep(max(0.1, interval_s))
        for gi, (_, s2) in view.samples.items():
            nvml("nvmlGpmMigSampleGet", view.handle, gi, s2, gpu=view.index)
        return {gi: gpm_metrics(nvml, gi, s1, s2, view.index) for gi, (s1, s2) in view.samples.items()}

"""The real backend: NVML through ``nvidia-ml-py`` (module ``pynvml``), nvidia-smi for resets.

``lib`` is the ``pynvml`` module in production and :class:`migd.sim.nvml.SimNvml` under
test; this file has no simulator branches.  GPU reset has no NVML call, so it runs
``nvidia-smi -r -i <bus id>`` (argument list, no shell, with a timeout) on that GPU only.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pynvml

from migd.hardware.backend import (
    GPU_WIDE,
    ComputeInstance,
    GpmMetrics,
    GpuEvent,
    GpuInfo,
    GpuInstance,
    HardwareError,
    MigDevice,
    ProcessInfo,
)
from migd.hardware.catalog import CI_ENUM_COUNT, GI_ENUM_COUNT, Placement, model_for

log = logging.getLogger(__name__)
T = TypeVar("T")

_GPM_METRICS = (
    pynvml.NVML_GPM_METRIC_SM_UTIL,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
)
# What NVML answers for a profile index this GPU does not have.
_NO_SUCH_PROFILE = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)
_ERROR_NAMES = {v: k[len("NVML_ERROR_"):] for k, v in vars(pynvml).items()
                if k.startswith("NVML_ERROR_") and isinstance(v, int)}


def error_name(code: int | None) -> str:
    return str(_ERROR_NAMES.get(code or 0, f"CODE_{code}"))


class NvmlBackend:
    """:class:`migd.hardware.backend.GpuBackend` over an NVML library object."""

    def __init__(self, lib: Any = None, smi_argv: Sequence[str] = ("nvidia-smi",), smi_timeout_s: float = 300.0,
                 on_nvml_error: Callable[[str, int], None] | None = None) -> None:
        self._lib = lib if lib is not None else pynvml
        self._smi_argv = list(smi_argv)
        self._smi_timeout_s = smi_timeout_s
        self._on_error = on_nvml_error
        self._event_set: Any = None
        self._event_lock = threading.Lock()
        self._nvml("nvmlInit")

    # -- plumbing ---------------------------------------------------------------------------------
    def _nvml(self, fn: str, *args: Any, gpu: int | None = None) -> Any:
        try:
            return getattr(self._lib, fn)(*args)
        except pynvml.NVMLError as e:
            code = int(getattr(e, "value", 0) or 0)
            if self._on_error is not None:
                self._on_error(fn, code)
            where = f"GPU {gpu}: " if gpu is not None else ""
            raise HardwareError(f"{where}{fn} failed: NVML_ERROR_{error_name(code)}", code=code, gpu=gpu) from e

    def _dev(self, index: int) -> Any:
        # Handles are fetched per call: a reset or mode change may replace them.
        return self._nvml("nvmlDeviceGetHandleByIndex", index, gpu=index)

    @staticmethod
    def _str(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    def close(self) -> None:
        if self._event_set is not None:
            try:
                self._lib.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError:
                pass
            self._event_set = None
        self._nvml("nvmlShutdown")

    # -- GPUs -------------------------------------------------------------------------------------
    def list_gpus(self) -> list[GpuInfo]:
        return [self.gpu(i) for i in range(int(self._nvml("nvmlDeviceGetCount")))]

    def gpu(self, index: int) -> GpuInfo:
        dev = self._dev(index)
        name = self._str(self._nvml("nvmlDeviceGetName", dev, gpu=index))
        pci = self._nvml("nvmlDeviceGetPciInfo", dev, gpu=index)
        try:
            current, pending = self._nvml("nvmlDeviceGetMigMode", dev, gpu=index)
        except HardwareError as e:
            if e.code != pynvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            current = pending = 0
        return GpuInfo(
            index=index,
            uuid=self._str(self._nvml("nvmlDeviceGetUUID", dev, gpu=index)),
            name=name,
            pci_bus_id=self._str(pci.busId),
            pci_device_id=int(pci.pciDeviceId),
            architecture=int(self._nvml("nvmlDeviceGetArchitecture", dev, gpu=index)),
            memory_total_bytes=int(self._nvml("nvmlDeviceGetMemoryInfo", dev, gpu=index).total),
            mig_current=bool(current),
            mig_pending=bool(pending),
            model=model_for(name=name, pci_device_id=int(pci.pciDeviceId)),
        )

    def set_mig_mode(self, index: int, enabled: bool) -> bool:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        dev = self._dev(index)
        status = self._nvml("nvmlDeviceSetMigMode", dev, mode, gpu=index)
        current, _ = self._nvml("nvmlDeviceGetMigMode", dev, gpu=index)
        if bool(current) != enabled and status not in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_RESET_REQUIRED,
                                                       pynvml.NVML_ERROR_IN_USE):
            raise HardwareError(f"GPU {index}: MIG mode activation failed: NVML_ERROR_{error_name(status)}",
                                code=status, gpu=index)
        return bool(current) == enabled

    def reset_gpu(self, index: int) -> None:
        bus_id = self.gpu(index).pci_bus_id
        argv = [*self._smi_argv, "-r", "-i", bus_id]
        log.info("resetting GPU %d (%s): %s", index, bus_id, " ".join(argv))
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self._smi_timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HardwareError(f"GPU {index}: reset via nvidia-smi failed: {e}", gpu=index) from e
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise HardwareError(f"GPU {index}: nvidia-smi -r exited {proc.returncode}: "
                                f"{detail[-1] if detail else 'no output'}", gpu=index)

    # -- instances --------------------------------------------------------------------------------
    def _profiles(self, fn: str, parent: Any, enum_count: int, index: int, *extra: Any) -> list[Any]:
        """Profile infos the GPU (or GI) supports; NVML answers NOT_SUPPORTED/INVALID_ARGUMENT for others."""
        infos = []
        for enum in range(enum_count):
            try:
                infos.append(getattr(self._lib, fn)(parent, enum, *extra))
            except pynvml.NVMLError as e:
                if getattr(e, "value", None) not in _NO_SUCH_PROFILE:
                    raise HardwareError(f"GPU {index}: {fn} failed: NVML_ERROR_{error_name(e.value)}",
                                        code=e.value, gpu=index) from e
        return infos

    def _handles(self, fn: str, parent: Any, info: Any, ptype: Any, index: int) -> list[Any]:
        """The instances of one profile, through NVML's caller-allocated handle array."""
        refs = (ptype * max(1, info.instanceCount))()
        count = ctypes.c_uint(0)
        self._nvml(fn, parent, info.id, refs, ctypes.byref(count), gpu=index)
        return [refs[i] for i in range(count.value)]

    def list_gpu_instances(self, index: int) -> list[GpuInstance]:
        dev = self._dev(index)
        out = []
        for info in self._profiles("nvmlDeviceGetGpuInstanceProfileInfo", dev, GI_ENUM_COUNT, index):
            for gi in self._handles("nvmlDeviceGetGpuInstances", dev, info, pynvml.c_nvmlGpuInstance_t, index):
                gi_info = self._nvml("nvmlGpuInstanceGetInfo", gi, gpu=index)
                out.append(GpuInstance(id=int(gi_info.id), profile_id=int(gi_info.profileId),
                                       placement=Placement(int(gi_info.placement.start), int(gi_info.placement.size)),
                                       compute_instances=tuple(self._compute_instances(gi, index))))
        return sorted(out, key=lambda g: (g.placement.start, g.id))

    def _compute_instances(self, gi: Any, index: int) -> list[ComputeInstance]:
        out = []
        for info in self._profiles("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, CI_ENUM_COUNT, index,
                                   pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED):
            for ref in self._handles("nvmlGpuInstanceGetComputeInstances", gi, info, pynvml.c_nvmlComputeInstance_t,
                                     index):
                ci = self._nvml("nvmlComputeInstanceGetInfo", ref, gpu=index)
                out.append(ComputeInstance(id=int(ci.id), profile_id=int(ci.profileId),
                                           placement=Placement(int(ci.placement.start), int(ci.placement.size))))
        return sorted(out, key=lambda c: c.id)

    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> int:
        pl = pynvml.c_nvmlGpuInstancePlacement_t()
        pl.start, pl.size = placement.start, placement.size
        gi = self._nvml("nvmlDeviceCreateGpuInstanceWithPlacement", self._dev(index), profile_id, pl, gpu=index)
        return int(self._nvml("nvmlGpuInstanceGetInfo", gi, gpu=index).id)

    def _gi(self, index: int, gi_id: int) -> Any:
        return self._nvml("nvmlDeviceGetGpuInstanceById", self._dev(index), gi_id, gpu=index)

    def create_compute_instance(self, index: int, gi_id: int, ci_profile_id: int,
                                placement: Placement | None = None) -> int:
        gi = self._gi(index, gi_id)
        if placement is None:
            ci = self._nvml("nvmlGpuInstanceCreateComputeInstance", gi, ci_profile_id, gpu=index)
        else:
            pl = pynvml.c_nvmlComputeInstancePlacement_t()
            pl.start, pl.size = placement.start, placement.size
            ci = self._nvml("nvmlGpuInstanceCreateComputeInstanceWithPlacement", gi, ci_profile_id, pl, gpu=index)
        return int(self._nvml("nvmlComputeInstanceGetInfo", ci, gpu=index).id)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        ci = self._nvml("nvmlGpuInstanceGetComputeInstanceById", self._gi(index, gi_id), ci_id, gpu=index)
        self._nvml("nvmlComputeInstanceDestroy", ci, gpu=index)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._nvml("nvmlGpuInstanceDestroy", self._gi(index, gi_id), gpu=index)

    # -- MIG devices, processes, memory -----------------------------------------------------------
    def list_mig_devices(self, index: int) -> list[MigDevice]:
        dev = self._dev(index)
        out = []
        for i in range(int(self._nvml("nvmlDeviceGetMaxMigDeviceCount", dev, gpu=index))):
            try:
                mig = self._lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, i)
            except pynvml.NVMLError as e:
                if getattr(e, "value", None) == pynvml.NVML_ERROR_NOT_FOUND:
                    continue
                raise HardwareError(f"GPU {index}: nvmlDeviceGetMigDeviceHandleByIndex failed: "
                                    f"NVML_ERROR_{error_name(e.value)}", code=e.value, gpu=index) from e
            mem = self._nvml("nvmlDeviceGetMemoryInfo", mig, gpu=index)
            procs = self._nvml("nvmlDeviceGetComputeRunningProcesses", mig, gpu=index)
            gi_id = int(self._nvml("nvmlDeviceGetGpuInstanceId", mig, gpu=index))
            ci_id = int(self._nvml("nvmlDeviceGetComputeInstanceId", mig, gpu=index))
            out.append(MigDevice(
                gpu_index=index, gi_id=gi_id, ci_id=ci_id,
                uuid=self._str(self._nvml("nvmlDeviceGetUUID", mig, gpu=index)),
                name=self._str(self._nvml("nvmlDeviceGetName", mig, gpu=index)),
                memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used),
                processes=tuple(ProcessInfo(pid=int(p.pid), used_memory_bytes=p.usedGpuMemory,
                                            gi_id=gi_id, ci_id=ci_id) for p in procs)))
        return out

    def probe_mig_devices(self, index: int) -> dict[tuple[int, int], str | None]:
        dev = self._dev(index)
        out: dict[tuple[int, int], str | None] = {}
        for i in range(int(self._nvml("nvmlDeviceGetMaxMigDeviceCount", dev, gpu=index))):
            try:
                mig = self._lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, i)
            except pynvml.NVMLError:
                continue
            key = (int(self._nvml("nvmlDeviceGetGpuInstanceId", mig, gpu=index)),
                   int(self._nvml("nvmlDeviceGetComputeInstanceId", mig, gpu=index)))
            try:
                self._lib.nvmlDeviceGetMemoryInfo(mig)
                self._lib.nvmlDeviceGetComputeRunningProcesses(mig)
                out[key] = None
            except pynvml.NVMLError as e:
                out[key] = f"NVML_ERROR_{error_name(getattr(e, 'value', None))}"
        return out

    def gpu_processes(self, index: int) -> list[ProcessInfo]:
        procs = self._nvml("nvmlDeviceGetComputeRunningProcesses", self._dev(index), gpu=index)
        return [ProcessInfo(pid=int(p.pid), used_memory_bytes=p.usedGpuMemory,
                            gi_id=None if p.gpuInstanceId == GPU_WIDE else int(p.gpuInstanceId),
                            ci_id=None if p.computeInstanceId == GPU_WIDE else int(p.computeInstanceId))
                for p in procs]

    # -- GPM --------------------------------------------------------------------------------------
    def gpm_supported(self, index: int) -> bool:
        try:
            return bool(self._lib.nvmlGpmQueryDeviceSupport(self._dev(index)).isSupportedDevice)
        except pynvml.NVMLError:
            return False

    def gpm_sample(self, index: int, gi_ids: list[int], interval_s: float = 0.1) -> dict[int, GpmMetrics]:
        """Two GPM samples per GPU instance at least ``interval_s`` (>= 100 ms) apart."""
        dev = self._dev(index)
        pairs = {gi: (self._nvml("nvmlGpmSampleAlloc"), self._nvml("nvmlGpmSampleAlloc")) for gi in gi_ids}
        try:
            for gi, (s1, _) in pairs.items():
                self._nvml("nvmlGpmMigSampleGet", dev, gi, s1, gpu=index)
            time.sleep(max(0.1, interval_s))
            for gi, (_, s2) in pairs.items():
                self._nvml("nvmlGpmMigSampleGet", dev, gi, s2, gpu=index)
            return {gi: self._gpm_metrics(gi, s1, s2, index) for gi, (s1, s2) in pairs.items()}
        finally:
            for s1, s2 in pairs.values():
                for s in (s1, s2):
                    try:
                        self._lib.nvmlGpmSampleFree(s)
                    except pynvml.NVMLError:
                        pass

    def _gpm_metrics(self, gi: int, s1: Any, s2: Any, index: int) -> GpmMetrics:
        mg = pynvml.c_nvmlGpmMetricsGet_t()
        mg.version, mg.numMetrics, mg.sample1, mg.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, \
            len(_GPM_METRICS), s1, s2
        for i, metric in enumerate(_GPM_METRICS):
            mg.metrics[i].metricId = metric
        self._nvml("nvmlGpmMetricsGet", mg, gpu=index)
        vals: list[float | None] = [
            mg.metrics[i].value / 100.0 if mg.metrics[i].nvmlReturn == pynvml.NVML_SUCCESS else None
            for i in range(len(_GPM_METRICS))]
        return GpmMetrics(gi_id=gi, sm_active=vals[0], sm_occupancy=vals[1], graphics_active=vals[2],
                          tensor_active=vals[3], dram_active=vals[4])

    # -- events -----------------------------------------------------------------------------------
    def _ensure_event_set(self) -> Any:
        with self._event_lock:
            if self._event_set is None:
                es = self._nvml("nvmlEventSetCreate")
                want = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventMigConfigChange
                for i in range(int(self._nvml("nvmlDeviceGetCount"))):
                    dev = self._dev(i)
                    mask = want & int(self._nvml("nvmlDeviceGetSupportedEventTypes", dev, gpu=i))
                    if mask:
                        self._nvml("nvmlDeviceRegisterEvents", dev, mask, es, gpu=i)
                self._event_set = es
            return self._event_set

    def wait_event(self, timeout_ms: int) -> GpuEvent | None:
        es = self._ensure_event_set()
        try:
            data = self._lib.nvmlEventSetWait(es, timeout_ms)
        except pynvml.NVMLError as e:
            if getattr(e, "value", None) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise HardwareError(f"nvmlEventSetWait failed: NVML_ERROR_{error_name(e.value)}", code=e.value) from e
        index = int(self._nvml("nvmlDeviceGetIndex", data.device))
        gi = None if data.gpuInstanceId == GPU_WIDE else int(data.gpuInstanceId)
        ci = None if data.computeInstanceId == GPU_WIDE else int(data.computeInstanceId)
        if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return GpuEvent(gpu_index=index, kind="xid", xid=int(data.eventData), gi_id=gi, ci_id=ci)
        return GpuEvent(gpu_index=index, kind="mig_config_change", gi_id=gi, ci_id=ci)

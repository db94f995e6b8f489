"""NVML telemetry that owns library memory: GPM samples and the event set.

Both are allocated by the NVML library and must be given back on every path (nvml.h:
nvmlGpmSampleFree, nvmlEventSetFree); both are released before a GPU reset.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Any

import pynvml

from migd.hardware.backend import GPU_WIDE, EventKind, GpmMetrics, GpuEvent, HardwareError
from migd.hardware.nvmlcall import Nvml, error_name

log = logging.getLogger(__name__)

_GPM_METRICS = (
    pynvml.NVML_GPM_METRIC_SM_UTIL,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
)
_WANTED_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventMigConfigChange
# A GPU that cannot report events is skipped, not fatal: the others stay watched.
_SKIP_GPU = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_GPU_IS_LOST)


Samples = dict[int, tuple[Any, Any]]  # GPU-instance id -> the two GPM sample buffers read into


def alloc_samples(nvml: Nvml, gi_ids: list[int]) -> Samples:
    """Two sample buffers per GPU instance; on a failure the ones already allocated are freed."""
    samples: Samples = {}
    try:
        for gi in gi_ids:
            first = nvml("nvmlGpmSampleAlloc")
            samples[gi] = (first, None)  # kept at once: a failing second alloc still frees it
            samples[gi] = (first, nvml("nvmlGpmSampleAlloc"))
    except HardwareError:
        free_samples(nvml, samples, -1)
        raise
    return samples


def free_samples(nvml: Nvml, samples: Samples, index: int) -> None:
    """Give the buffers back (library memory: nvml.h nvmlGpmSampleFree); a failure is only logged."""
    for pair in samples.values():
        for s in pair:
            if s is None:
                continue
            try:
                nvml("nvmlGpmSampleFree", s)
            except HardwareError as e:
                log.warning("GPU %d: freeing a GPM sample failed: %s", index, e)
    samples.clear()


def read_samples(nvml: Nvml, dev: Any, index: int, samples: Samples, interval_s: float) -> dict[int, GpmMetrics]:
    """Two GPM samples per GPU instance at least ``interval_s`` apart (nvml.h: "greater than 100ms")
    into the given buffers, then one metrics read per instance."""
    with nvml.session.shared():  # a reset waits until the samples are read
        for gi, (s1, _) in samples.items():
            nvml("nvmlGpmMigSampleGet", dev, gi, s1, gpu=index)
        time.sleep(max(0.1, interval_s))
        for gi, (_, s2) in samples.items():
            nvml("nvmlGpmMigSampleGet", dev, gi, s2, gpu=index)
        return {gi: gpm_metrics(nvml, gi, s1, s2, index) for gi, (s1, s2) in samples.items()}


def gpm_sample(nvml: Nvml, dev: Any, index: int, gi_ids: list[int], interval_s: float) -> dict[int, GpmMetrics]:
    """One-off activity of the given GPU instances: buffers allocated, read and freed on every path."""
    with nvml.session.shared():  # a reset waits until the samples are freed
        samples = alloc_samples(nvml, gi_ids)
        try:
            return read_samples(nvml, dev, index, samples, interval_s)
        finally:
            free_samples(nvml, samples, index)


def gpm_metrics(nvml: Nvml, gi: int, s1: Any, s2: Any, index: int) -> GpmMetrics:
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, \
        len(_GPM_METRICS), s1, s2
    for i, metric in enumerate(_GPM_METRICS):
        mg.metrics[i].metricId = metric
    nvml("nvmlGpmMetricsGet", mg, gpu=index)
    vals: list[float | None] = [
        mg.metrics[i].value / 100.0 if mg.metrics[i].nvmlReturn == pynvml.NVML_SUCCESS else None
        for i in range(len(_GPM_METRICS))]
    return GpmMetrics(gi_id=gi, sm_active=vals[0], sm_occupancy=vals[1], graphics_active=vals[2],
                      tensor_active=vals[3], dram_active=vals[4])


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class EventWatch:
    """The event set for Xids and MIG config changes on every GPU that supports them."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._set: Any = None
        self._lock = threading.Lock()
        self.unwatched: dict[int, str] = {}
        self._index_of: dict[int, int] = {}  # device handle address -> index, from registration

    def _ensure(self) -> Any:
        with self._lock:
            if self._set is None:
                es = self._nvml("nvmlEventSetCreate")
                try:
                    self.unwatched = self._register_all(es)
                except BaseException:
                    self._free(es)  # a half-registered set is never kept, nor leaked
                    raise
                self._set = es
            return self._set

    def _register_all(self, es: Any) -> dict[int, str]:
        skipped: dict[int, str] = {}
        for i in range(int(self._nvml("nvmlDeviceGetCount"))):
            try:
                dev = self._nvml("nvmlDeviceGetHandleByIndex", i, gpu=i)
                self._index_of[_address(dev)] = i
                mask = _WANTED_EVENTS & int(self._nvml("nvmlDeviceGetSupportedEventTypes", dev, gpu=i))
                if mask:
                    self._nvml("nvmlDeviceRegisterEvents", dev, mask, es, gpu=i)
                else:
                    skipped[i] = "no Xid or MIG-config events on this GPU"
            except HardwareError as e:
                if e.code not in _SKIP_GPU:
                    raise
                skipped[i] = f"NVML_ERROR_{error_name(e.code)}"
        for i, why in skipped.items():
            log.warning("GPU %d: events not watched (%s); Xids on it go unseen", i, why)
        return skipped

    def _free(self, es: Any) -> None:
        try:
            self._nvml.unlocked("nvmlEventSetFree", es)
        except HardwareError as e:
            log.warning("freeing the NVML event set failed: %s", e)

    def probe(self) -> dict[int, str]:
        """Create, register and free a set of our own: which GPUs could not be watched, and why."""
        with self._nvml.session.shared():
            es = self._nvml("nvmlEventSetCreate")
            try:
                return self._register_all(es)
            finally:
                self._free(es)

    def release(self) -> None:
        """Free the set (before a reset, at close); the next wait registers anew."""
        with self._lock:
            if self._set is not None:
                self._free(self._set)
                self._set = None

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        with self._nvml.session.shared():
            es = self._ensure()
            data = self._nvml("nvmlEventSetWait", es, timeout_ms, absent=(pynvml.NVML_ERROR_TIMEOUT,))
            if data is None:
                return None
            # The index as registered: a GPU that just fell off the bus (Xid 79) answers no query, and
            # its event must still be counted against it.
            index = self._index_of.get(_address(data.device))
            if index is None:
                index = int(self._nvml("nvmlDeviceGetIndex", data.device))
        gi = None if data.gpuInstanceId == GPU_WIDE else int(data.gpuInstanceId)
        ci = None if data.computeInstanceId == GPU_WIDE else int(data.computeInstanceId)
        if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return GpuEvent(gpu_index=index, kind=EventKind.XID, xid=int(data.eventData), gi_id=gi, ci_id=ci)
        return GpuEvent(gpu_index=index, kind=EventKind.MIG_CONFIG_CHANGE, gi_id=gi, ci_id=ci)

"""NVML telemetry that owns library memory: GPM samples and the event set.

Both are allocated by the NVML library and must be given back on every path (nvml.h:
nvmlGpmSampleFree, nvmlEventSetFree); both are released before a GPU reset.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import threading
import time
from typing import Any

import pynvml

from migd.hardware.nvml.call import Nvml, error_name
from migd.hardware.types import GPU_WIDE, EventKind, GpmMetrics, GpuEvent, HardwareError

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


# nvmlGpmMetricsGet_t.metrics[i] is {metricId, nvmlReturn, value, metricInfo}: the results are read
# as (nvmlReturn, value) pairs in one unpack of the struct's bytes (offsets checked below).
_RESULTS_AT = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
_RESULT_FIELDS = struct.Struct("<" + "".join(
    f"{pynvml.c_nvmlGpmMetric_t.nvmlReturn.offset}xId{ctypes.sizeof(pynvml.c_nvmlGpmMetric_t) - 16}x"
    for _ in _GPM_METRICS))
if (pynvml.c_nvmlGpmMetric_t.nvmlReturn.offset, pynvml.c_nvmlGpmMetric_t.value.offset) != (4, 8):
    raise ImportError("pynvml's nvmlGpmMetric_t no longer has the layout migd reads")
Samples = dict[int, tuple[Any, Any]]  # GPU-instance id -> the two GPM sample buffers read into


def alloc_samples(nvml: Nvml, gi_ids: list[int]) -> Samples:
    """Two sample buffers per GPU instance; on a failure the ones already allocated are freed."""
    samples: Samples = {}
    try:
        for gi in gi_ids:
            first = nvml(pynvml.nvmlGpmSampleAlloc)
            samples[gi] = (first, None)  # kept at once: a failing second alloc still frees it
            samples[gi] = (first, nvml(pynvml.nvmlGpmSampleAlloc))
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
                nvml(pynvml.nvmlGpmSampleFree, s)
            except HardwareError as e:
                log.warning("GPU %d: freeing a GPM sample failed: %s", index, e)
    samples.clear()


def _take(nvml: Nvml, dev: Any, index: int, samples: Samples, slot: int) -> None:
    for gi, pair in samples.items():
        nvml(pynvml.nvmlGpmMigSampleGet, dev, gi, pair[slot], gpu=index)


def read_samples(nvml: Nvml, dev: Any, index: int, samples: Samples, interval_s: float) -> dict[int, GpmMetrics]:
    """Two GPM samples per GPU instance at least ``interval_s`` apart (nvml.h: "greater than 100ms")
    into the given buffers, then one metrics read per instance."""
    with nvml.session.shared():  # a reset waits until the samples are read
        _take(nvml, dev, index, samples, 0)
        time.sleep(max(0.1, interval_s))
        _take(nvml, dev, index, samples, 1)
        return {gi: gpm_metrics(nvml, gi, s1, s2, index) for gi, (s1, s2) in samples.items()}


class GpmRing:
    """Rolling GPM samples of one GPU's instances: each read takes one new sample per instance into
    the buffer that does not hold the newest one, and the metrics span the time since that newest
    one.  So a sampler cycle costs one sample and one metrics read per instance, sleeps only on the
    first read of a layout, and reports activity averaged over the whole interval between cycles
    instead of a 100 ms window.  nvml.h (nvmlGpmSampleGet, 12.x headers) asks for more than 100 ms
    between two samples "due to the internal sample refresh rate"; it names no longest interval,
    so how far apart two samples may lie is **undocumented** (migd uses its sample interval,
    15 s by default)."""

    def __init__(self, samples: Samples) -> None:
        self.samples = samples
        # Per GPU instance the two requests, from buffer 0 to 1 and from 1 to 0, built once.
        self.requests = {gi: (metrics_request(a, b), metrics_request(b, a)) for gi, (a, b) in samples.items()}
        self.newest = 0  # which buffer of each pair holds the newest sample
        self.taken_at: float | None = None  # monotonic time of the newest sample

    def prime(self, nvml: Nvml, dev: Any, index: int) -> float:
        """The first sample of a layout (taken when its view opens, so the first read waits least)."""
        with nvml.session.shared():
            _take(nvml, dev, index, self.samples, self.newest)
            self.taken_at = time.monotonic()
            return self.taken_at

    def read(self, nvml: Nvml, dev: Any, index: int, min_interval_s: float) -> dict[int, GpmMetrics]:
        if self.taken_at is None:  # the sample at the view's opening failed: this one starts the ring
            self.prime(nvml, dev, index)
            return {}  # activity absent this cycle, never a made-up value
        wait = self.taken_at + max(0.1, min_interval_s) - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # only right after the layout was read: later cycles are further apart
        old, new = self.newest, 1 - self.newest
        with nvml.session.shared():  # a reset waits until the samples are read
            self.taken_at = None  # a failure below leaves no half-taken pair behind
            _take(nvml, dev, index, self.samples, new)
            self.newest, self.taken_at = new, time.monotonic()
            return {gi: read_metrics(nvml, gi, pair[old], index) for gi, pair in self.requests.items()}


def gpm_sample(nvml: Nvml, dev: Any, index: int, gi_ids: list[int], interval_s: float) -> dict[int, GpmMetrics]:
    """One-off activity of the given GPU instances: buffers allocated, read and freed on every path."""
    with nvml.session.shared():  # a reset waits until the samples are freed
        samples = alloc_samples(nvml, gi_ids)
        try:
            return read_samples(nvml, dev, index, samples, interval_s)
        finally:
            free_samples(nvml, samples, index)


def metrics_request(s1: Any, s2: Any) -> Any:
    """An nvmlGpmMetricsGet_t asking for migd's metrics between two sample buffers (metricsGet is
    IN/OUT in nvml.h: the ids and buffers stay, each call overwrites the values, so it is reusable)."""
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, \
        len(_GPM_METRICS), s1, s2
    for i, metric in enumerate(_GPM_METRICS):
        mg.metrics[i].metricId = metric
    return mg


def gpm_metrics(nvml: Nvml, gi: int, s1: Any, s2: Any, index: int) -> GpmMetrics:
    return read_metrics(nvml, gi, metrics_request(s1, s2), index)


def read_metrics(nvml: Nvml, gi: int, mg: Any, index: int) -> GpmMetrics:
    nvml(pynvml.nvmlGpmMetricsGet, mg, gpu=index)
    raw = _RESULT_FIELDS.unpack_from(mg, _RESULTS_AT)  # (nvmlReturn, value) of each metric asked for
    vals = [raw[i + 1] / 100.0 if raw[i] == pynvml.NVML_SUCCESS else None for i in range(0, len(raw), 2)]
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
                es = self._nvml(pynvml.nvmlEventSetCreate)
                try:
                    self.unwatched = self._register_all(es)
                except BaseException:
                    self._free(es)  # a half-registered set is never kept, nor leaked
                    raise
                self._set = es
            return self._set

    def _register_all(self, es: Any) -> dict[int, str]:
        skipped: dict[int, str] = {}
        for i in range(int(self._nvml(pynvml.nvmlDeviceGetCount))):
            try:
                dev = self._nvml(pynvml.nvmlDeviceGetHandleByIndex, i, gpu=i)
                self._index_of[_address(dev)] = i
                mask = _WANTED_EVENTS & int(self._nvml(pynvml.nvmlDeviceGetSupportedEventTypes, dev, gpu=i))
                if mask:
                    self._nvml(pynvml.nvmlDeviceRegisterEvents, dev, mask, es, gpu=i)
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
            self._nvml.unlocked(pynvml.nvmlEventSetFree, es)
        except HardwareError as e:
            log.warning("freeing the NVML event set failed: %s", e)

    def probe(self) -> dict[int, str]:
        """Create, register and free a set of our own: which GPUs could not be watched, and why."""
        with self._nvml.session.shared():
            es = self._nvml(pynvml.nvmlEventSetCreate)
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

    def arm(self) -> None:
        """The set created and registered now, if it is not (a wait registers it otherwise)."""
        with self._nvml.session.shared():
            self._ensure()

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        with self._nvml.session.shared():
            es = self._ensure()
            data = self._nvml(pynvml.nvmlEventSetWait, es, timeout_ms, absent=(pynvml.NVML_ERROR_TIMEOUT,))
            if data is None:
                return None
            # The index as registered: a GPU that just fell off the bus (Xid 79) answers no query, and
            # its event must still be counted against it.
            index = self._index_of.get(_address(data.device))
            if index is None:
                index = int(self._nvml(pynvml.nvmlDeviceGetIndex, data.device))
        gi = None if data.gpuInstanceId == GPU_WIDE else int(data.gpuInstanceId)
        ci = None if data.computeInstanceId == GPU_WIDE else int(data.computeInstanceId)
        if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return GpuEvent(gpu_index=index, kind=EventKind.XID, xid=int(data.eventData), gi_id=gi, ci_id=ci)
        return GpuEvent(gpu_index=index, kind=EventKind.MIG_CONFIG_CHANGE, gi_id=gi, ci_id=ci)

"""C entry points: GPM samples (Hopper+) and event sets (Xid, MIG config change).

GPM samples and event sets are library memory owned by the calling process, as in the
real library: :func:`gpm_sample_free` returns the memory, after which the sample is an
invalid argument (nvml.h: nvmlGpmSampleFree "Free an allocated sample buffer").
"""

from __future__ import annotations

import ctypes
import functools
import math
import time
import zlib
from typing import Any

import pynvml

from migd.hardware.nvml.cstruct import plain
from migd.sim.cmem import Ref
from migd.sim.entry import HANDLE, PTR, UINT, ULL, Export, exporter, put
from migd.sim.gpu import NvmlFail

ENTRIES: list[Export] = []
export = exporter(ENTRIES)

# GPM metric ids the simulator models, with each one's share of the instance's activity.
_GPM_SHAPE = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 0.9,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 0.55,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.6,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 0.45,
}
_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventMigConfigChange | pynvml.nvmlEventTypeDoubleBitEccError


@functools.lru_cache(maxsize=4096)
def _phase(gpu_uuid: str, gi_start: int) -> float:
    return (zlib.crc32(f"{gpu_uuid}/{gi_start}".encode()) % 1000) / 1000.0


def activity(gpu_uuid: str, gi_start: int, t: float) -> float:
    """Deterministic synthetic busy ratio of a loaded instance at time ``t`` (0.1..0.95)."""
    return 0.525 + 0.425 * math.sin(2 * math.pi * (t / 300.0 + _phase(gpu_uuid, gi_start)))


def _activity_integral(gpu_uuid: str, gi_start: int, t: float) -> float:
    phase = _phase(gpu_uuid, gi_start)
    w = 2 * math.pi / 300.0
    return 0.525 * t - 0.425 / w * math.cos(w * t + 2 * math.pi * phase)


# -- GPM -----------------------------------------------------------------------------------------
@export(HANDLE, PTR, name="nvmlGpmQueryDeviceSupport", handle=("gpu",))
def gpm_support(call: Any, handle: int, support_p: int) -> None:
    sup = call.mem.versioned("nvmlGpmQueryDeviceSupport", "gpmSupport", support_p, pynvml.c_nvmlGpmSupport_t,
                             pynvml.NVML_GPM_SUPPORT_VERSION)
    with call.state() as s:
        sup.isSupportedDevice = int(call.gpu_of(s, handle)[0].catalog.is_hopper_or_newer)  # "Hopper or newer"


@export(PTR, name="nvmlGpmSampleAlloc")
def gpm_sample_alloc(call: Any, sample_p: int) -> None:
    out = call.mem.at("nvmlGpmSampleAlloc", "gpmSample", sample_p, ctypes.c_void_p)
    with call.state():
        buf = ctypes.create_string_buffer(64)
        call.lib.samples[ctypes.addressof(buf)] = [buf, None]
    out.value = ctypes.addressof(buf)


@export(HANDLE, name="nvmlGpmSampleFree")
def gpm_sample_free(call: Any, sample: int) -> None:
    with call.state():
        if call.lib.samples.pop(sample or 0, None) is None:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)


@export(HANDLE, UINT, HANDLE, name="nvmlGpmMigSampleGet", handle=("gpu",))
def gpm_mig_sample_get(call: Any, handle: int, gi_id: int, sample: int) -> None:
    slot = call.lib.samples.get(sample or 0)
    with call.state() as s:
        if slot is None:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = call.gpu_of(s, handle)[0]
        if not gpu.catalog.is_hopper_or_newer:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # "For Hopper or newer fully supported devices"
        gpu.require_mig()
        gi = gpu.gi(gi_id)
        if gi is None:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
        slot[1] = {"t": call.lib.clock(), "uuid": gpu.uuid, "start": gi.start,
                   "busy": any(p.gi == gi.id for p in gpu.processes)}


class _MetricsHead(ctypes.Structure):
    """The fields of nvmlGpmMetricsGet_t before its metrics array (checked against pynvml below)."""

    _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint), ("sample1", ctypes.c_void_p),
                ("sample2", ctypes.c_void_p)]


_METRIC = plain(pynvml.c_nvmlGpmMetric_t)
_METRICS_AT = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
_METRICS_MAX = pynvml.c_nvmlGpmMetricsGet_t.metrics.size // ctypes.sizeof(_METRIC)
if ctypes.sizeof(_MetricsHead) != _METRICS_AT:
    raise ImportError("pynvml's nvmlGpmMetricsGet_t no longer has the header this simulator reads")


@export(PTR, name="nvmlGpmMetricsGet")
def gpm_metrics_get(call: Any, mg_p: int) -> None:
    """Reads the header and the ``numMetrics`` entries it names, as the driver does (the rest of the
    caller's array is neither read nor checked)."""
    fn = "nvmlGpmMetricsGet"
    head = call.mem.versioned(fn, "metricsGet", mg_p, _MetricsHead, pynvml.NVML_GPM_METRICS_GET_VERSION)
    n = head.numMetrics
    if n > _METRICS_MAX:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # more metrics than the struct holds
    metrics = call.mem.at(fn, "metricsGet.metrics", mg_p + _METRICS_AT, _METRIC * n)
    with call.state():
        a = call.lib.samples.get(head.sample1 or 0)
        b = call.lib.samples.get(head.sample2 or 0)
    if not a or not b or a[1] is None or b[1] is None:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # freed or never filled
    a, b = a[1], b[1]
    dt = b["t"] - a["t"]
    if dt <= 0 or a["uuid"] != b["uuid"] or a["start"] != b["start"]:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    level = 0.0
    if b["busy"]:
        level = (_activity_integral(b["uuid"], b["start"], b["t"])
                 - _activity_integral(a["uuid"], a["start"], a["t"])) / dt
    for m in metrics:  # elements share the caller's memory: written in place
        shape = _GPM_SHAPE.get(m.metricId)
        if shape is None:
            m.nvmlReturn, m.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
        else:
            m.nvmlReturn, m.value = pynvml.NVML_SUCCESS, round(100.0 * shape * level, 6)


# -- events --------------------------------------------------------------------------------------
@export(PTR, name="nvmlEventSetCreate")
def event_set_create(call: Any, set_p: int) -> None:
    out = call.mem.at("nvmlEventSetCreate", "set", set_p, ctypes.c_void_p)
    with call.state() as s:
        buf = ctypes.create_string_buffer(16)
        call.lib.eventsets[ctypes.addressof(buf)] = [buf, {"seq": s.seq, "masks": {}}]
    out.value = ctypes.addressof(buf)


@export(HANDLE, PTR, name="nvmlDeviceGetSupportedEventTypes", handle=("gpu",))
def supported_event_types(call: Any, handle: int, types_p: int) -> None:
    out = call.mem.at("nvmlDeviceGetSupportedEventTypes", "eventTypes", types_p, ctypes.c_ulonglong)
    with call.state() as s:
        call.gpu_of(s, handle)
    out.value = _EVENTS


@export(HANDLE, ULL, HANDLE, name="nvmlDeviceRegisterEvents", handle=("gpu",))
def register_events(call: Any, handle: int, types: int, event_set: int) -> None:
    with call.state() as s:
        es = call.lib.eventsets.get(event_set or 0)
        gpu = call.gpu_of(s, handle)[0]
        if es is None:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if types & ~_EVENTS:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # "some of requested event types" unsupported
        es[1]["masks"][gpu.index] = es[1]["masks"].get(gpu.index, 0) | types


@export(HANDLE, PTR, UINT, name="nvmlEventSetWait_v2")
def event_set_wait(call: Any, event_set: int, data_p: int, timeout_ms: int) -> None:
    """nvml.h: waits up to ``timeoutms`` for an event of a registered type; NVML_ERROR_TIMEOUT if none."""
    data = call.mem.at("nvmlEventSetWait_v2", "data", data_p, pynvml.c_nvmlEventData_t)
    deadline = time.monotonic() + timeout_ms / 1000.0
    store = call.lib.store
    while True:
        seen = store.generation()  # read before looking: a write after the look changes it
        with call.state() as s:
            es = call.lib.eventsets.get(event_set or 0)
            if es is None:
                raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            cursor = es[1]
            for ev in s.events:
                if ev["seq"] <= cursor["seq"]:
                    continue
                cursor["seq"] = ev["seq"]
                if cursor["masks"].get(ev["gpu"], 0) & ev["type"]:
                    put(data, device=ctypes.cast(call.handle(Ref("gpu", ev["gpu"])), pynvml.c_nvmlDevice_t),
                        eventType=ev["type"], eventData=ev["data"], gpuInstanceId=ev["gi"],
                        computeInstanceId=ev["ci"])
                    return
        left = deadline - time.monotonic()
        if left <= 0:
            raise NvmlFail(pynvml.NVML_ERROR_TIMEOUT)
        store.wait_changed(seen, left)  # sleeps until some process writes the state (no 20 ms poll)


@export(HANDLE, name="nvmlEventSetFree")
def event_set_free(call: Any, event_set: int) -> None:
    with call.state():
        if call.lib.eventsets.pop(event_set or 0, None) is None:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

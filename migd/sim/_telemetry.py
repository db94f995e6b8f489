"""Simulated NVML: GPM samples (Hopper+) and the event set (Xid, MIG config change)."""

from __future__ import annotations

import ctypes
import time
from typing import Any

from migd.sim.base import _GPM_SHAPE, E, SimBase, _activity_integral, _Ref, nvml_error
from migd.sim.state import SimState


class TelemetryMixin(SimBase):
    # -- GPM (Hopper+) ----------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        def body(s: SimState) -> Any:
            gpu, _ = self._gpu(s, handle)
            sup = E.c_nvmlGpmSupport_t()
            sup.version, sup.isSupportedDevice = E.NVML_GPM_SUPPORT_VERSION, int(gpu.catalog.is_hopper_or_newer)
            return sup
        return self._call("nvmlGpmQueryDeviceSupport", handle, body)

    def nvmlGpmSampleAlloc(self) -> Any:
        h = self._handle(_Ref("gpm", -1, len(self._samples) + 1), E.c_nvmlGpmSample_t)
        self._samples[ctypes.cast(h, ctypes.c_void_p).value or 0] = {}
        return h

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        addr = ctypes.cast(sample, ctypes.c_void_p).value or 0
        if addr not in self._samples:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        self._samples[addr] = {}

    def nvmlGpmMigSampleGet(self, handle: Any, gi_id: int, sample: Any) -> Any:
        addr = ctypes.cast(sample, ctypes.c_void_p).value or 0
        if addr not in self._samples:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)

        def body(s: SimState) -> Any:
            gpu, _ = self._gpu(s, handle)
            if not gpu.catalog.is_hopper_or_newer:
                raise nvml_error(E.NVML_ERROR_NOT_SUPPORTED)  # GPM is Hopper+ only
            self._require_mig(gpu)
            gi = gpu.gi(gi_id)
            if gi is None:
                raise nvml_error(E.NVML_ERROR_NOT_FOUND)
            busy = any(p.gi == gi.id for p in gpu.processes)
            self._samples[addr] = {"t": self._clock(), "uuid": gpu.uuid, "start": gi.start, "busy": busy}
            return sample
        return self._call("nvmlGpmMigSampleGet", handle, body)

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        a = self._samples.get(ctypes.cast(metrics_get.sample1, ctypes.c_void_p).value or 0)
        b = self._samples.get(ctypes.cast(metrics_get.sample2, ctypes.c_void_p).value or 0)
        if not a or not b or metrics_get.version != E.NVML_GPM_METRICS_GET_VERSION:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        dt = b["t"] - a["t"]
        if dt <= 0 or a["uuid"] != b["uuid"] or a["start"] != b["start"]:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        level = 0.0
        if b["busy"]:
            level = (_activity_integral(b["uuid"], b["start"], b["t"])
                     - _activity_integral(a["uuid"], a["start"], a["t"])) / dt
        for i in range(metrics_get.numMetrics):
            m = metrics_get.metrics[i]
            shape = _GPM_SHAPE.get(m.metricId)
            if shape is None:
                m.nvmlReturn, m.value = E.NVML_ERROR_NOT_SUPPORTED, 0.0
            else:
                m.nvmlReturn, m.value = E.NVML_SUCCESS, round(100.0 * shape * level, 6)
        return metrics_get

    # -- events -----------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        h = self._handle(_Ref("eventset", -1, len(self._eventsets) + 1), E.c_nvmlEventSet_t)
        with self._store.transaction(write=False) as s:
            self._eventsets[ctypes.cast(h, ctypes.c_void_p).value or 0] = {"seq": s.seq, "masks": {}}
        return h

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetSupportedEventTypes", handle,
                              lambda s: E.nvmlEventTypeXidCriticalError | E.nvmlEventMigConfigChange
                              | E.nvmlEventTypeDoubleBitEccError))

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        es = self._eventsets.get(ctypes.cast(event_set, ctypes.c_void_p).value or 0)
        if es is None:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        gpu_index = self._ref(handle, "gpu").gpu
        es["masks"][gpu_index] = es["masks"].get(gpu_index, 0) | int(event_types)

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        es = self._eventsets.get(ctypes.cast(event_set, ctypes.c_void_p).value or 0)
        if es is None:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            with self._store.transaction(write=False) as s:
                for ev in s.events:
                    if ev["seq"] <= es["seq"]:
                        continue
                    es["seq"] = ev["seq"]
                    if es["masks"].get(ev["gpu"], 0) & ev["type"]:
                        data = E.c_nvmlEventData_t()
                        data.device = self._gpu_handle(ev["gpu"])
                        data.eventType, data.eventData = ev["type"], ev["data"]
                        data.gpuInstanceId, data.computeInstanceId = ev["gi"], ev["ci"]
                        return data
            if time.monotonic() >= deadline:
                raise nvml_error(E.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    nvmlEventSetWait_v2 = nvmlEventSetWait

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._eventsets.pop(ctypes.cast(event_set, ctypes.c_void_p).value or 0, None)

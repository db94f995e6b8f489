"""Simulated NVML: library lifetime, devices, MIG mode and MIG-device handles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from migd.sim.base import E, MiB, SimBase, nvml_error
from migd.sim.state import SimCi, SimGi, SimGpu, SimState


class DevicesMixin(SimBase):
    # -- library lifetime -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._init += 1

    def nvmlShutdown(self) -> None:
        if self._init <= 0:
            raise nvml_error(E.NVML_ERROR_UNINITIALIZED)
        self._init -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.105.08-sim"

    # -- devices ----------------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        return int(self._call("nvmlDeviceGetCount", None, lambda s: len(s.gpus)))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        def body(s: SimState) -> Any:
            if not 0 <= index < len(s.gpus):
                raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
            return self._gpu_handle(index)
        return self._call("nvmlDeviceGetHandleByIndex", None, body)

    def nvmlDeviceGetHandleByUUID(self, gpu_uuid: str | bytes) -> Any:
        want = gpu_uuid.decode() if isinstance(gpu_uuid, bytes) else gpu_uuid

        def body(s: SimState) -> Any:
            for g in s.gpus:
                if g.uuid == want:
                    return self._gpu_handle(g.index)
                for gi in g.gis:
                    for ci in gi.cis:
                        if self.mig_uuid(g, gi, ci) == want:
                            return self._mig_handle(g.index, gi, ci)
            raise nvml_error(E.NVML_ERROR_NOT_FOUND)
        return self._call("nvmlDeviceGetHandleByUUID", None, body)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetIndex", handle, lambda s: self._gpu(s, handle)[0].index))

    def nvmlDeviceGetName(self, handle: Any) -> str:
        def body(s: SimState) -> str:
            gpu, ref = self._gpu(s, handle, "gpu", "mig")
            if ref.kind == "gpu":
                return gpu.catalog.nvml_name
            gi, ci = self._ci_by_serial(gpu, ref.gi_serial, ref.ci_serial)
            prof = self._profile(gpu, gi.profile_id)
            ci_prof = prof.ci_by_id(ci.profile_id)
            return f"{gpu.catalog.nvml_name} MIG {ci_prof.name if ci_prof else prof.name}"
        return str(self._call("nvmlDeviceGetName", handle, body, ("gpu", "mig")))

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        def body(s: SimState) -> str:
            gpu, ref = self._gpu(s, handle, "gpu", "mig")
            if ref.kind == "gpu":
                return gpu.uuid
            gi, ci = self._ci_by_serial(gpu, ref.gi_serial, ref.ci_serial)
            return self.mig_uuid(gpu, gi, ci)
        return str(self._call("nvmlDeviceGetUUID", handle, body, ("gpu", "mig")))

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        def body(s: SimState) -> Any:
            gpu, _ = self._gpu(s, handle)
            info = E.nvmlPciInfo_t()
            dom, bus, rest = gpu.bus_id.split(":")
            info.busId = gpu.bus_id.encode()
            info.busIdLegacy = gpu.bus_id[4:].encode()
            info.domain, info.bus, info.device = int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)
            info.pciDeviceId = gpu.catalog.pci_device_id
            info.pciSubSystemId = 0x16C010DE if gpu.catalog.is_hopper_or_newer else 0x134F10DE
            return info
        return self._call("nvmlDeviceGetPciInfo", handle, body)

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetArchitecture", handle,
                              lambda s: self._gpu(s, handle)[0].catalog.architecture))

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        def body(s: SimState) -> Any:
            gpu, ref = self._gpu(s, handle, "gpu", "mig")
            if ref.kind == "gpu":
                total = gpu.catalog.total_memory_mib * MiB
                used = sum(p.used_mib for p in gpu.processes) * MiB
            else:
                gi, ci = self._ci_by_serial(gpu, ref.gi_serial, ref.ci_serial)
                if gi.faulted:
                    raise nvml_error(E.NVML_ERROR_UNKNOWN)
                total = self._profile(gpu, gi.profile_id).memory_mib * MiB
                used = sum(p.used_mib for p in gpu.processes if p.gi == gi.id) * MiB
            mem = E.c_nvmlMemory_t()
            mem.total, mem.used, mem.free = total, used, total - used
            return mem
        return self._call("nvmlDeviceGetMemoryInfo", handle, body, ("gpu", "mig"))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        def body(s: SimState) -> list[Any]:
            gpu, ref = self._gpu(s, handle, "gpu", "mig")
            procs = gpu.processes
            if ref.kind == "mig":
                gi, ci = self._ci_by_serial(gpu, ref.gi_serial, ref.ci_serial)
                if gi.faulted:
                    raise nvml_error(E.NVML_ERROR_UNKNOWN)
                procs = [p for p in procs if p.gi == gi.id and p.ci == ci.id]
            out = []
            for p in procs:
                info = E.c_nvmlProcessInfo_t()
                info.pid, info.usedGpuMemory = p.pid, p.used_mib * MiB
                info.gpuInstanceId = 0xFFFFFFFF if p.gi is None else p.gi
                info.computeInstanceId = 0xFFFFFFFF if p.ci is None else p.ci
                out.append(E.nvmlStructToFriendlyObject(info))
            return out
        return list(self._call("nvmlDeviceGetComputeRunningProcesses", handle, body, ("gpu", "mig")))

    # -- MIG mode ---------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        def body(s: SimState) -> list[int]:
            gpu, _ = self._gpu(s, handle)
            return [int(gpu.mig_current), int(gpu.mig_pending)]
        return list(self._call("nvmlDeviceGetMigMode", handle, body))

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        def body(s: SimState) -> int:
            gpu, _ = self._gpu(s, handle)
            if mode not in (E.NVML_DEVICE_MIG_DISABLE, E.NVML_DEVICE_MIG_ENABLE):
                raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
            want = mode == E.NVML_DEVICE_MIG_ENABLE
            if gpu.gis and not want:
                raise nvml_error(E.NVML_ERROR_IN_USE)  # instances must be destroyed first
            gpu.mig_pending = want
            if gpu.mig_current == want:
                return int(E.NVML_SUCCESS)
            if gpu.catalog.mode_change_needs_reset:
                # Ampere: stays pending until the GPU is reset (facts: rules.mig_mode [S2,S3]).
                return int(E.NVML_ERROR_RESET_REQUIRED)
            if gpu.processes:
                gpu.mig_pending = gpu.mig_current
                raise nvml_error(E.NVML_ERROR_IN_USE)
            gpu.mig_current = want  # Hopper+: applied at once, no reset
            return int(E.NVML_SUCCESS)
        return int(self._call("nvmlDeviceSetMigMode", handle, body))

    # -- MIG devices ------------------------------------------------------------------------------
    def _mig_devices(self, gpu: SimGpu) -> list[tuple[SimGi, SimCi]]:
        return [(gi, ci) for gi in gpu.gis for ci in gi.cis]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        def body(s: SimState) -> int:
            gpu, _ = self._gpu(s, handle)
            return gpu.catalog.compute_slices if gpu.mig_current else 0
        return int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle, body))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        def body(s: SimState) -> Any:
            gpu, _ = self._gpu(s, handle)
            self._require_mig(gpu)
            devs = self._mig_devices(gpu)
            if not 0 <= index < len(devs):
                raise nvml_error(E.NVML_ERROR_NOT_FOUND)
            return self._mig_handle(gpu.index, *devs[index])
        return self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, body)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> bool:
        return self._ref(handle, "gpu", "mig").kind == "mig"

    def _mig_ids(self, fn: str, handle: Any, pick: Callable[[SimGi, SimCi], int]) -> int:
        def body(s: SimState) -> int:
            gpu, ref = self._gpu(s, handle, "mig")
            return pick(*self._ci_by_serial(gpu, ref.gi_serial, ref.ci_serial))
        return int(self._call(fn, handle, body, ("mig",)))

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig_ids("nvmlDeviceGetGpuInstanceId", handle, lambda gi, ci: gi.id)

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig_ids("nvmlDeviceGetComputeInstanceId", handle, lambda gi, ci: ci.id)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> Any:
        return self._gpu_handle(self._ref(handle, "mig").gpu)


"""Simulated NVML: GPU-instance and compute-instance management."""

from __future__ import annotations

import ctypes
from typing import Any

from migd.hardware.catalog import CI_ENUM_COUNT, GI_ENUM_COUNT, GiProfile
from migd.sim.base import E, SimBase, free_starts, nvml_error, remaining_capacity
from migd.sim.state import SimCi, SimGi, SimGpu, SimState


class InstancesMixin(SimBase):
    # -- GPU instances ----------------------------------------------------------------------------
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        def body(s: SimState) -> Any:
            gpu, _ = self._gpu(s, handle)
            if not 0 <= profile < GI_ENUM_COUNT:
                raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
            p = gpu.catalog.profile_by_enum(profile)
            if p is None:
                raise nvml_error(E.NVML_ERROR_NOT_SUPPORTED)
            info = E.c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2 else E.c_nvmlGpuInstanceProfileInfo_t()
            info.id, info.isP2pSupported, info.sliceCount = p.profile_id, 0, p.slices
            info.instanceCount, info.multiprocessorCount = p.instance_count, p.sm
            info.copyEngineCount, info.decoderCount, info.encoderCount = p.ce, p.dec, p.enc
            info.jpegCount, info.ofaCount, info.memorySizeMB = p.jpeg, p.ofa, p.memory_mib
            if version == 2:
                info.name = f"MIG {p.name}".encode()
            return info
        return self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, body)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: Any, profile_id: int,
                                                   placements_ref: Any, count_ref: Any) -> int:
        def body(s: SimState) -> int:
            gpu, _ = self._gpu(s, handle)
            p = self._profile(gpu, profile_id)
            count = ctypes.cast(count_ref, ctypes.POINTER(ctypes.c_uint))
            if placements_ref is None:
                count[0] = len(p.starts)
                return int(E.NVML_SUCCESS)
            if count[0] < len(p.starts):
                count[0] = len(p.starts)
                raise nvml_error(E.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, pl in enumerate(p.placements):
                placements_ref[i].start, placements_ref[i].size = pl.start, pl.size
            count[0] = len(p.starts)
            return int(E.NVML_SUCCESS)
        return int(self._call("nvmlDeviceGetGpuInstancePossiblePlacements", handle, body))

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profile_id: int) -> int:
        def body(s: SimState) -> int:
            gpu, _ = self._gpu(s, handle)
            self._require_mig(gpu)
            p = self._profile(gpu, profile_id)
            return remaining_capacity(gpu, p)
        return int(self._call("nvmlDeviceGetGpuInstanceRemainingCapacity", handle, body))

    @staticmethod
    def _under_cap(gpu: SimGpu, p: GiProfile) -> bool:
        return sum(1 for g in gpu.gis if g.profile_id == p.profile_id) < p.instance_count

    def _create_gi(self, s: SimState, gpu: SimGpu, p: GiProfile, start: int) -> Any:
        if not self._under_cap(gpu, p) or start not in free_starts(gpu, p):
            raise nvml_error(E.NVML_ERROR_INSUFFICIENT_RESOURCES)
        used_ids = {g.id for g in gpu.gis}
        gi_id = 0 if p.slices == gpu.catalog.compute_slices else next(i for i in range(1, 64) if i not in used_ids)
        gi = SimGi(id=gi_id, serial=s.next_serial(), profile_id=p.profile_id, start=start, size=p.memory_slices)
        gpu.gis.append(gi)
        gpu.gis.sort(key=lambda g: g.id)
        s.add_event(gpu.index, E.nvmlEventMigConfigChange, 0, 0xFFFFFFFF, 0xFFFFFFFF)
        return self._gi_handle(gpu.index, gi)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement: Any) -> Any:
        def body(s: SimState) -> Any:
            gpu, _ = self._gpu(s, handle)
            self._require_mig(gpu)
            p = self._profile(gpu, profile_id)
            if placement.start not in p.starts or placement.size != p.memory_slices:
                raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
            return self._create_gi(s, gpu, p, placement.start)
        return self._call("nvmlDeviceCreateGpuInstanceWithPlacement", handle, body)

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: int) -> Any:
        """Driver-chosen placement; an approximation of the undocumented order (facts: rules.placement)."""
        def body(s: SimState) -> Any:
            gpu, _ = self._gpu(s, handle)
            self._require_mig(gpu)
            p = self._profile(gpu, profile_id)
            free = free_starts(gpu, p)
            if not free:
                raise nvml_error(E.NVML_ERROR_INSUFFICIENT_RESOURCES)
            start = (6 if 6 in free else min(free)) if p.memory_slices == 1 else max(free)
            return self._create_gi(s, gpu, p, start)
        return self._call("nvmlDeviceCreateGpuInstance", handle, body)

    def nvmlGpuInstanceDestroy(self, gi_handle: Any) -> int:
        def body(s: SimState) -> int:
            gpu, ref = self._gpu(s, gi_handle, "gi")
            gi = self._gi_by_serial(gpu, ref.gi_serial)
            if gi.cis or any(p.gi == gi.id for p in gpu.processes):
                raise nvml_error(E.NVML_ERROR_IN_USE)
            gpu.gis.remove(gi)
            s.add_event(gpu.index, E.nvmlEventMigConfigChange, 0, 0xFFFFFFFF, 0xFFFFFFFF)
            return int(E.NVML_SUCCESS)
        return int(self._call("nvmlGpuInstanceDestroy", gi_handle, body, ("gi",)))

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, refs: Any, count_ref: Any) -> int:
        def body(s: SimState) -> int:
            gpu, _ = self._gpu(s, handle)
            self._require_mig(gpu)
            self._profile(gpu, profile_id)
            gis = [g for g in gpu.gis if g.profile_id == profile_id]
            for i, gi in enumerate(gis):
                refs[i] = self._gi_handle(gpu.index, gi)
            ctypes.cast(count_ref, ctypes.POINTER(ctypes.c_uint))[0] = len(gis)
            return int(E.NVML_SUCCESS)
        return int(self._call("nvmlDeviceGetGpuInstances", handle, body))

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int) -> Any:
        def body(s: SimState) -> Any:
            gpu, _ = self._gpu(s, handle)
            self._require_mig(gpu)
            gi = gpu.gi(gi_id)
            if gi is None:
                raise nvml_error(E.NVML_ERROR_NOT_FOUND)
            return self._gi_handle(gpu.index, gi)
        return self._call("nvmlDeviceGetGpuInstanceById", handle, body)

    def nvmlGpuInstanceGetInfo(self, gi_handle: Any) -> Any:
        def body(s: SimState) -> Any:
            gpu, ref = self._gpu(s, gi_handle, "gi")
            gi = self._gi_by_serial(gpu, ref.gi_serial)
            info = E.c_nvmlGpuInstanceInfo_t()
            info.device, info.id, info.profileId = self._gpu_handle(gpu.index), gi.id, gi.profile_id
            info.placement.start, info.placement.size = gi.start, gi.size
            return info
        return self._call("nvmlGpuInstanceGetInfo", gi_handle, body, ("gi",))

    # -- compute instances ------------------------------------------------------------------------
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi_handle: Any, profile: int, eng_profile: int,
                                                     version: int = 2) -> Any:
        def body(s: SimState) -> Any:
            gpu, ref = self._gpu(s, gi_handle, "gi")
            gi = self._gi_by_serial(gpu, ref.gi_serial)
            if not 0 <= profile < CI_ENUM_COUNT or eng_profile != 0:
                raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
            c = self._profile(gpu, gi.profile_id).ci_by_id(profile)
            if c is None:
                raise nvml_error(E.NVML_ERROR_NOT_SUPPORTED)
            p = self._profile(gpu, gi.profile_id)
            info = E.c_nvmlComputeInstanceProfileInfo_v2_t() if version == 2 else \
                E.c_nvmlComputeInstanceProfileInfo_t()
            info.id, info.sliceCount, info.instanceCount = c.profile_id, c.slices, c.instance_count
            info.multiprocessorCount, info.sharedCopyEngineCount = c.sm, p.ce
            info.sharedDecoderCount, info.sharedEncoderCount = p.dec, p.enc
            info.sharedJpegCount, info.sharedOfaCount = p.jpeg, p.ofa
            if version == 2:
                info.name = f"MIG {c.name}".encode()
            return info
        return self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi_handle, body, ("gi",))

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def _create_ci(self, s: SimState, gpu: SimGpu, gi: SimGi, profile_id: int, start: int | None) -> Any:
        c = self._profile(gpu, gi.profile_id).ci_by_id(profile_id)
        if c is None:
            raise nvml_error(E.NVML_ERROR_NOT_SUPPORTED)
        used = [(x.start, x.start + x.size) for x in gi.cis]
        free = [st for st in c.starts if all(st + c.slices <= a or b <= st for a, b in used)]
        if start is not None and start not in c.starts:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        count = sum(1 for x in gi.cis if x.profile_id == profile_id)
        chosen = start if start is not None else (free[0] if free else None)
        if chosen is None or chosen not in free or count >= c.instance_count:
            raise nvml_error(E.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ids = {x.id for x in gi.cis}
        ci = SimCi(id=next(i for i in range(64) if i not in ids), serial=s.next_serial(),
                   profile_id=profile_id, start=chosen, size=c.slices)
        gi.cis.append(ci)
        gi.cis.sort(key=lambda x: x.id)
        s.add_event(gpu.index, E.nvmlEventMigConfigChange, 0, gi.id, ci.id)
        return self._ci_handle(gpu.index, gi, ci)

    def nvmlGpuInstanceCreateComputeInstance(self, gi_handle: Any, profile_id: int) -> Any:
        def body(s: SimState) -> Any:
            gpu, ref = self._gpu(s, gi_handle, "gi")
            return self._create_ci(s, gpu, self._gi_by_serial(gpu, ref.gi_serial), profile_id, None)
        return self._call("nvmlGpuInstanceCreateComputeInstance", gi_handle, body, ("gi",))

    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(self, gi_handle: Any, profile_id: int,
                                                          placement: Any) -> Any:
        def body(s: SimState) -> Any:
            gpu, ref = self._gpu(s, gi_handle, "gi")
            gi = self._gi_by_serial(gpu, ref.gi_serial)
            return self._create_ci(s, gpu, gi, profile_id, placement.start)
        return self._call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", gi_handle, body, ("gi",))

    def nvmlComputeInstanceDestroy(self, ci_handle: Any) -> int:
        def body(s: SimState) -> int:
            gpu, ref = self._gpu(s, ci_handle, "ci")
            gi, ci = self._ci_by_serial(gpu, ref.gi_serial, ref.ci_serial)
            if any(p.gi == gi.id and p.ci == ci.id for p in gpu.processes):
                raise nvml_error(E.NVML_ERROR_IN_USE)
            gi.cis.remove(ci)
            s.add_event(gpu.index, E.nvmlEventMigConfigChange, 0, gi.id, ci.id)
            return int(E.NVML_SUCCESS)
        return int(self._call("nvmlComputeInstanceDestroy", ci_handle, body, ("ci",)))

    def nvmlGpuInstanceGetComputeInstances(self, gi_handle: Any, profile_id: int, refs: Any,
                                           count_ref: Any) -> int:
        def body(s: SimState) -> int:
            gpu, ref = self._gpu(s, gi_handle, "gi")
            gi = self._gi_by_serial(gpu, ref.gi_serial)
            cis = [c for c in gi.cis if c.profile_id == profile_id]
            for i, ci in enumerate(cis):
                refs[i] = self._ci_handle(gpu.index, gi, ci)
            ctypes.cast(count_ref, ctypes.POINTER(ctypes.c_uint))[0] = len(cis)
            return int(E.NVML_SUCCESS)
        return int(self._call("nvmlGpuInstanceGetComputeInstances", gi_handle, body, ("gi",)))

    def nvmlGpuInstanceGetComputeInstanceById(self, gi_handle: Any, ci_id: int) -> Any:
        def body(s: SimState) -> Any:
            gpu, ref = self._gpu(s, gi_handle, "gi")
            gi = self._gi_by_serial(gpu, ref.gi_serial)
            ci = next((c for c in gi.cis if c.id == ci_id), None)
            if ci is None:
                raise nvml_error(E.NVML_ERROR_NOT_FOUND)
            return self._ci_handle(gpu.index, gi, ci)
        return self._call("nvmlGpuInstanceGetComputeInstanceById", gi_handle, body, ("gi",))

    def nvmlComputeInstanceGetInfo(self, ci_handle: Any) -> Any:
        def body(s: SimState) -> Any:
            gpu, ref = self._gpu(s, ci_handle, "ci")
            gi, ci = self._ci_by_serial(gpu, ref.gi_serial, ref.ci_serial)
            info = E.c_nvmlComputeInstanceInfo_t()
            info.device, info.gpuInstance = self._gpu_handle(gpu.index), self._gi_handle(gpu.index, gi)
            info.id, info.profileId = ci.id, ci.profile_id
            info.placement.start, info.placement.size = ci.start, ci.size
            return info
        return self._call("nvmlComputeInstanceGetInfo", ci_handle, body, ("ci",))


"""C entry points: GPU-instance and compute-instance profiles, placements and lifecycle.

Prototypes and return codes follow nvml.h (go-nvml's copy); the MIG rules themselves live
on :class:`migd.sim.gpu.SimGpu`.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from migd.catalog.models import CI_ENUM_COUNT, GI_ENUM_COUNT, GiProfile
from migd.sim.cmem import Ref
from migd.sim.entry import GPU_WIDE, HANDLE, PTR, UINT, Export, exporter, put
from migd.sim.gpu import NvmlFail, SimGi, SimGpu
from migd.sim.state import SimState

ENTRIES: list[Export] = []
export = exporter(ENTRIES)
# The profile enums this driver knows: the recorded 580.159.04 answers INVALID_ARGUMENT from
# 0x11 (3_SLICE_GFX, newer headers) on, although pynvml's header counts to 0x12.
DRIVER_GI_ENUM_COUNT = 0x11
_CONFIG_CHANGE = pynvml.nvmlEventMigConfigChange


def _gi_ref(gpu: SimGpu, gi: SimGi) -> Ref:
    return Ref("gi", gpu.index, gi.serial)


def _handle_out(call: Any, fn: str, what: str, addr: int) -> Any:
    return call.mem.at(fn, what, addr, ctypes.c_void_p)


# -- GPU-instance profiles -----------------------------------------------------------------------
def _gi_profile(gpu: SimGpu, enum: int) -> GiProfile:
    """nvml.h: enumerate "starting from 0, until the API returns NVML_ERROR_INVALID_ARGUMENT";
    NOT_SUPPORTED for a profile the GPU lacks.  The docs disagree on MIG mode off (v1 text:
    NOT_SUPPORTED "if device doesn't support MIG"; V text: "doesn't have MIG mode enabled").
    Observed on an H100 80GB HBM3, driver 580.159.04, MIG off (tests/fixtures/*-probe.json):
    the table is answered in full, so the simulator answers it too, whatever the mode."""
    if not 0 <= enum < min(GI_ENUM_COUNT, DRIVER_GI_ENUM_COUNT):
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    p = gpu.catalog.profile_by_enum(enum)
    if p is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return p


def _fill_gi_profile(info: Any, p: GiProfile) -> None:
    put(info, id=p.profile_id, isP2pSupported=0, sliceCount=p.slices, instanceCount=p.instance_count,
        multiprocessorCount=p.sm, copyEngineCount=p.ce, decoderCount=p.dec, encoderCount=p.enc,
        jpegCount=p.jpeg, ofaCount=p.ofa, memorySizeMB=p.memory_mib)


@export(HANDLE, UINT, PTR, name="nvmlDeviceGetGpuInstanceProfileInfo", handle=("gpu",))
def gi_profile_info(call: Any, handle: int, enum: int, info_p: int) -> None:
    info = call.mem.at("nvmlDeviceGetGpuInstanceProfileInfo", "info", info_p, pynvml.c_nvmlGpuInstanceProfileInfo_t)
    with call.state() as s:
        _fill_gi_profile(info, _gi_profile(call.gpu_of(s, handle)[0], enum))


@export(HANDLE, UINT, PTR, name="nvmlDeviceGetGpuInstanceProfileInfoV", handle=("gpu",))
def gi_profile_info_v(call: Any, handle: int, enum: int, info_p: int) -> None:
    info = call.mem.versioned("nvmlDeviceGetGpuInstanceProfileInfoV", "info", info_p,
                              pynvml.c_nvmlGpuInstanceProfileInfo_v2_t, pynvml.nvmlGpuInstanceProfileInfo_v2)
    with call.state() as s:
        p = _gi_profile(call.gpu_of(s, handle)[0], enum)
    _fill_gi_profile(info, p)
    info.name = f"MIG {p.name}".encode()
    info.version = 0  # the recorded H100 driver hands the struct back with version zeroed


@export(HANDLE, UINT, PTR, PTR, name="nvmlDeviceGetGpuInstancePossiblePlacements_v2", handle=("gpu",))
def possible_placements(call: Any, handle: int, profile_id: int, placements_p: int, count_p: int) -> None:
    """nvml.h: "all the possible placements for the given profile regardless of whether MIG is
    enabled"; placements may be NULL "to discover number of allowed placements"."""
    fn = "nvmlDeviceGetGpuInstancePossiblePlacements_v2"
    count = call.mem.at(fn, "count", count_p, ctypes.c_uint)
    with call.state() as s:
        p = call.gpu_of(s, handle)[0].profile(profile_id)
    if not placements_p:
        count.value = len(p.starts)
        return
    if count.value < len(p.starts):
        count.value = len(p.starts)
        raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    out = call.mem.at(fn, "placements", placements_p, pynvml.c_nvmlGpuInstancePlacement_t * len(p.starts))
    for slot, pl in zip(out, p.placements, strict=True):
        put(slot, start=pl.start, size=pl.size)
    count.value = len(p.starts)


@export(HANDLE, UINT, PTR, name="nvmlDeviceGetGpuInstanceRemainingCapacity", handle=("gpu",))
def remaining_capacity(call: Any, handle: int, profile_id: int, count_p: int) -> None:
    """nvml.h says NOT_SUPPORTED with MIG mode off; the H100 of tests/fixtures answered 7 for
    1g.10gb with MIG off (driver 580.159.04).  The simulator follows the driver."""
    count = call.mem.at("nvmlDeviceGetGpuInstanceRemainingCapacity", "count", count_p, ctypes.c_uint)
    with call.state() as s:
        gpu = call.gpu_of(s, handle)[0]
        count.value = gpu.remaining_capacity(gpu.profile(profile_id))


# -- GPU-instance lifecycle ----------------------------------------------------------------------
def _create_gi(call: Any, s: SimState, gpu: SimGpu, p: GiProfile, start: int) -> int:
    gi = gpu.create_gi(p, start, s.next_serial())
    s.add_event(gpu.index, _CONFIG_CHANGE, 0, GPU_WIDE, GPU_WIDE)
    return int(call.handle(_gi_ref(gpu, gi)))


@export(HANDLE, UINT, PTR, PTR, name="nvmlDeviceCreateGpuInstanceWithPlacement", handle=("gpu",), mutating=True)
def create_gi_with_placement(call: Any, handle: int, profile_id: int, placement_p: int, gi_p: int) -> None:
    fn = "nvmlDeviceCreateGpuInstanceWithPlacement"
    placement = call.mem.at(fn, "placement", placement_p, pynvml.c_nvmlGpuInstancePlacement_t)
    out = _handle_out(call, fn, "gpuInstance", gi_p)
    with call.state() as s:
        gpu = call.gpu_of(s, handle)[0]
        gpu.require_mig()
        p = gpu.profile(profile_id)
        if placement.start not in p.starts or placement.size != p.memory_slices:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        out.value = _create_gi(call, s, gpu, p, placement.start)


@export(HANDLE, UINT, PTR, name="nvmlDeviceCreateGpuInstance", handle=("gpu",), mutating=True)
def create_gi(call: Any, handle: int, profile_id: int, gi_p: int) -> None:
    out = _handle_out(call, "nvmlDeviceCreateGpuInstance", "gpuInstance", gi_p)
    with call.state() as s:
        gpu = call.gpu_of(s, handle)[0]
        gpu.require_mig()
        p = gpu.profile(profile_id)
        out.value = _create_gi(call, s, gpu, p, gpu.auto_start(p))


@export(HANDLE, name="nvmlGpuInstanceDestroy", handle=("gi",), mutating=True)
def destroy_gi(call: Any, handle: int) -> None:
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "gi")
        gpu.destroy_gi(gpu.gi_by_serial(ref.gi_serial))
        s.add_event(gpu.index, _CONFIG_CHANGE, 0, GPU_WIDE, GPU_WIDE)
    call.handles.drop(lambda r: not (r.gpu == ref.gpu and r.gi_serial == ref.gi_serial))


def _list_out(call: Any, fn: str, refs_p: int, count_p: int, refs: list[Ref]) -> None:
    """Instance listings: go-nvml passes the buffer's capacity in ``*count`` (device.go
    GetGpuInstances: ``count = info.InstanceCount``); nvml.h only says the buffer "must be large
    enough".  The simulator treats ``*count`` as the capacity: too small is INSUFFICIENT_SIZE."""
    count = call.mem.at(fn, "count", count_p, ctypes.c_uint)
    if count.value < len(refs):
        count.value = len(refs)
        raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    if refs:
        out = call.mem.at(fn, "instances", refs_p, ctypes.c_void_p * len(refs))
        for i, r in enumerate(refs):
            out[i] = call.handle(r)
    count.value = len(refs)


@export(HANDLE, UINT, PTR, PTR, name="nvmlDeviceGetGpuInstances", handle=("gpu",))
def list_gis(call: Any, handle: int, profile_id: int, refs_p: int, count_p: int) -> None:
    """nvml.h says NOT_SUPPORTED with MIG off; the recorded H100 answered SUCCESS, count 0."""
    with call.state() as s:
        gpu = call.gpu_of(s, handle)[0]
        gpu.profile(profile_id)
        refs = [_gi_ref(gpu, g) for g in gpu.gis if g.profile_id == profile_id]
    _list_out(call, "nvmlDeviceGetGpuInstances", refs_p, count_p, refs)


@export(HANDLE, UINT, PTR, name="nvmlDeviceGetGpuInstanceById", handle=("gpu",))
def gi_by_id(call: Any, handle: int, gi_id: int, gi_p: int) -> None:
    out = _handle_out(call, "nvmlDeviceGetGpuInstanceById", "gpuInstance", gi_p)
    with call.state() as s:
        gpu = call.gpu_of(s, handle)[0]
        gi = gpu.gi_by_id(gi_id)
    out.value = call.handle(_gi_ref(gpu, gi))


@export(HANDLE, PTR, name="nvmlGpuInstanceGetInfo", handle=("gi",))
def gi_info(call: Any, handle: int, info_p: int) -> None:
    info = call.mem.at("nvmlGpuInstanceGetInfo", "info", info_p, pynvml.c_nvmlGpuInstanceInfo_t)
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "gi")
        gi = gpu.gi_by_serial(ref.gi_serial)
    put(info, device=ctypes.cast(call.handle(Ref("gpu", gpu.index)), pynvml.c_nvmlDevice_t), id=gi.id,
        profileId=gi.profile_id)
    put(info.placement, start=gi.start, size=gi.size)


# -- compute instances ---------------------------------------------------------------------------
def _ci_profile_info(call: Any, fn: str, handle: int, enum: int, eng: int, info: Any) -> None:
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "gi")
        gi = gpu.gi_by_serial(ref.gi_serial)
        if not 0 <= enum < CI_ENUM_COUNT or eng != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        p = gpu.profile(gi.profile_id)
        c = p.ci_by_id(enum)  # the CI profile id equals its enum (facts nvml.compute_instance_profile_id)
        if c is None:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    put(info, id=c.profile_id, sliceCount=c.slices, instanceCount=c.instance_count, multiprocessorCount=c.sm,
        sharedCopyEngineCount=p.ce, sharedDecoderCount=p.dec, sharedEncoderCount=p.enc, sharedJpegCount=p.jpeg,
        sharedOfaCount=p.ofa)
    if hasattr(info, "name"):
        info.name = f"MIG {c.name}".encode()


@export(HANDLE, UINT, UINT, PTR, name="nvmlGpuInstanceGetComputeInstanceProfileInfo", handle=("gi",))
def ci_profile_info(call: Any, handle: int, enum: int, eng: int, info_p: int) -> None:
    fn = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
    info = call.mem.at(fn, "info", info_p, pynvml.c_nvmlComputeInstanceProfileInfo_t)
    _ci_profile_info(call, fn, handle, enum, eng, info)


@export(HANDLE, UINT, UINT, PTR, name="nvmlGpuInstanceGetComputeInstanceProfileInfoV", handle=("gi",))
def ci_profile_info_v(call: Any, handle: int, enum: int, eng: int, info_p: int) -> None:
    fn = "nvmlGpuInstanceGetComputeInstanceProfileInfoV"
    info = call.mem.versioned(fn, "info", info_p, pynvml.c_nvmlComputeInstanceProfileInfo_v2_t,
                              pynvml.nvmlComputeInstanceProfileInfo_v2)
    _ci_profile_info(call, fn, handle, enum, eng, info)


def _create_ci(call: Any, handle: int, profile_id: int, start: int | None, out: Any) -> None:
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "gi")
        gi = gpu.gi_by_serial(ref.gi_serial)
        ci = gpu.create_ci(gi, profile_id, start, s.next_serial())
        s.add_event(gpu.index, _CONFIG_CHANGE, 0, gi.id, ci.id)
    out.value = call.handle(Ref("ci", gpu.index, gi.serial, ci.serial))


@export(HANDLE, UINT, PTR, name="nvmlGpuInstanceCreateComputeInstance", handle=("gi",), mutating=True)
def create_ci(call: Any, handle: int, profile_id: int, ci_p: int) -> None:
    _create_ci(call, handle, profile_id, None,
               _handle_out(call, "nvmlGpuInstanceCreateComputeInstance", "computeInstance", ci_p))


@export(HANDLE, UINT, PTR, PTR, name="nvmlGpuInstanceCreateComputeInstanceWithPlacement", handle=("gi",),
        mutating=True)
def create_ci_with_placement(call: Any, handle: int, profile_id: int, placement_p: int, ci_p: int) -> None:
    fn = "nvmlGpuInstanceCreateComputeInstanceWithPlacement"
    placement = call.mem.at(fn, "placement", placement_p, pynvml.c_nvmlComputeInstancePlacement_t)
    _create_ci(call, handle, profile_id, int(placement.start), _handle_out(call, fn, "computeInstance", ci_p))


@export(HANDLE, name="nvmlComputeInstanceDestroy", handle=("ci",), mutating=True)
def destroy_ci(call: Any, handle: int) -> None:
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "ci")
        gi, ci = gpu.ci_by_serial(ref.gi_serial, ref.ci_serial)
        gpu.destroy_ci(gi, ci)
        s.add_event(gpu.index, _CONFIG_CHANGE, 0, gi.id, ci.id)
    call.handles.drop(lambda r: not (r.gpu == ref.gpu and r.ci_serial == ref.ci_serial))


@export(HANDLE, UINT, PTR, PTR, name="nvmlGpuInstanceGetComputeInstances", handle=("gi",))
def list_cis(call: Any, handle: int, profile_id: int, refs_p: int, count_p: int) -> None:
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "gi")
        gi = gpu.gi_by_serial(ref.gi_serial)
        refs = [Ref("ci", gpu.index, gi.serial, c.serial) for c in gi.cis if c.profile_id == profile_id]
    _list_out(call, "nvmlGpuInstanceGetComputeInstances", refs_p, count_p, refs)


@export(HANDLE, UINT, PTR, name="nvmlGpuInstanceGetComputeInstanceById", handle=("gi",))
def ci_by_id(call: Any, handle: int, ci_id: int, ci_p: int) -> None:
    out = _handle_out(call, "nvmlGpuInstanceGetComputeInstanceById", "computeInstance", ci_p)
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "gi")
        gi = gpu.gi_by_serial(ref.gi_serial)
        ci = gi.ci_by_id(ci_id)
    out.value = call.handle(Ref("ci", gpu.index, gi.serial, ci.serial))


@export(HANDLE, PTR, name="nvmlComputeInstanceGetInfo_v2", handle=("ci",))
def ci_info(call: Any, handle: int, info_p: int) -> None:
    info = call.mem.at("nvmlComputeInstanceGetInfo_v2", "info", info_p, pynvml.c_nvmlComputeInstanceInfo_t)
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "ci")
        gi, ci = gpu.ci_by_serial(ref.gi_serial, ref.ci_serial)
    put(info, device=ctypes.cast(call.handle(Ref("gpu", gpu.index)), pynvml.c_nvmlDevice_t),
        gpuInstance=ctypes.cast(call.handle(_gi_ref(gpu, gi)), pynvml.c_nvmlGpuInstance_t), id=ci.id,
        profileId=ci.profile_id)
    put(info.placement, start=ci.start, size=ci.size)

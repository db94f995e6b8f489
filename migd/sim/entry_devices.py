"""C entry points: library lifetime, devices, MIG mode and MIG-device handles.

Prototypes and return codes follow nvml.h (go-nvml's copy); each function cites what it
models where the behaviour is not plain bookkeeping.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import pynvml

from migd.hardware.nvml.cstruct import plain
from migd.sim.cmem import Ref
from migd.sim.entry import GPU_WIDE, HANDLE, PTR, UINT, Export, exporter, put, reap_clients
from migd.sim.gpu import MiB, NvmlFail, SimGpu
from migd.sim.state import SimState

ENTRIES: list[Export] = []
export = exporter(ENTRIES)
# nvmlErrorString returns a pointer to a static string: one buffer per code, built once.
_ERROR_TEXT = {v: ctypes.create_string_buffer(k.encode()) for k, v in vars(pynvml).items()
               if k.startswith("NVML_ERROR_") and isinstance(v, int)}
_UNKNOWN_ERROR = ctypes.create_string_buffer(b"Unknown Error")


# -- library lifetime ----------------------------------------------------------------------------
@export(UINT, name="nvmlInitWithFlags", needs_init=False, writes=True)
def init_with_flags(call: Any, flags: int = 0) -> None:
    with call.state() as s:
        call.lib.init_count += 1
        call.lib.register_client(s, os.getpid(), +1)


@export(name="nvmlInit_v2", needs_init=False, writes=True, aliases=("nvmlInit",))
def init(call: Any) -> None:
    init_with_flags(call, 0)


@export(name="nvmlShutdown", needs_init=True, writes=True)
def shutdown(call: Any) -> None:
    with call.state() as s:
        call.lib.init_count -= 1
        call.lib.register_client(s, os.getpid(), -1)


@export(ctypes.c_int, name="nvmlErrorString", needs_init=False, returns_string=True)
def error_string(lib: Any, code: int) -> int:
    return ctypes.addressof(_ERROR_TEXT.get(code, _UNKNOWN_ERROR))


@export(PTR, UINT, name="nvmlSystemGetDriverVersion")
def driver_version(call: Any, buf: int, length: int) -> None:
    with call.state() as s:
        version = s.driver_version
    call.mem.write_string("nvmlSystemGetDriverVersion", buf, length, version)


@export(PTR, UINT, name="nvmlSystemGetNVMLVersion")
def nvml_version(call: Any, buf: int, length: int) -> None:
    with call.state() as s:
        version = f"13.{s.driver_version}"
    call.mem.write_string("nvmlSystemGetNVMLVersion", buf, length, version)


# -- devices -------------------------------------------------------------------------------------
@export(PTR, name="nvmlDeviceGetCount_v2")
def device_count(call: Any, count: int) -> None:
    out = call.mem.at("nvmlDeviceGetCount_v2", "deviceCount", count, ctypes.c_uint)
    with call.state() as s:
        out.value = len(s.gpus)


@export(UINT, PTR, name="nvmlDeviceGetHandleByIndex_v2")
def handle_by_index(call: Any, index: int, device: int) -> None:
    out = call.mem.at("nvmlDeviceGetHandleByIndex_v2", "device", device, ctypes.c_void_p)
    with call.state() as s:
        if not 0 <= index < len(s.gpus):
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    out.value = call.handle(Ref("gpu", index))


@export(PTR, PTR, name="nvmlDeviceGetHandleByUUID")
def handle_by_uuid(call: Any, uuid_p: int, device: int) -> None:
    call.mem.at("nvmlDeviceGetHandleByUUID", "uuid", uuid_p, ctypes.c_char)
    want = ctypes.string_at(uuid_p).decode(errors="replace")
    out = call.mem.at("nvmlDeviceGetHandleByUUID", "device", device, ctypes.c_void_p)
    with call.state() as s:
        for g in s.gpus:
            if g.uuid == want:
                out.value = call.handle(Ref("gpu", g.index))
                return
            for gi, ci in g.mig_devices():
                if g.mig_uuid(gi, ci) == want:
                    out.value = call.handle(Ref("mig", g.index, gi.serial, ci.serial))
                    return
    raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)


def _uint_out(fn: str, what: str, kinds: tuple[str, ...], value: Any) -> Any:
    """An entry point ``fn(handle, unsigned int *out)`` whose value comes from ``value(call, state, gpu, ref)``."""

    @export(HANDLE, PTR, name=fn, handle=kinds)
    def impl(call: Any, handle: int, out_p: int) -> None:
        out = call.mem.at(fn, what, out_p, ctypes.c_uint)
        with call.state() as s:
            gpu, ref = call.gpu_of(s, handle, *kinds)
            out.value = int(value(call, s, gpu, ref))
    return impl


_uint_out("nvmlDeviceGetIndex", "index", ("gpu",), lambda c, s, g, r: g.index)
# /dev/nvidia<minor>: the simulated node numbers its device files in index order.
_uint_out("nvmlDeviceGetMinorNumber", "minorNumber", ("gpu",), lambda c, s, g, r: g.minor)  # its /dev/nvidia<minor>
_uint_out("nvmlDeviceGetArchitecture", "arch", ("gpu",), lambda c, s, g, r: g.catalog.architecture)
# Data-center boards are passively cooled; nvidia-smi shows the fan as N/A: no such sensor.
_uint_out("nvmlDeviceGetFanSpeed", "speed", ("gpu",), lambda c, s, g, r: _not_supported())
_uint_out("nvmlDeviceGetPowerUsage", "power", ("gpu",),
          lambda c, s, g, r: 90_000 + 3_000 * len(g.processes))  # milliwatts
_uint_out("nvmlDeviceGetEnforcedPowerLimit", "limit", ("gpu",),
          lambda c, s, g, r: 700_000 if g.catalog.is_hopper_or_newer else 400_000)
_uint_out("nvmlDeviceIsMigDeviceHandle", "isMigDevice", ("gpu", "mig"), lambda c, s, g, r: r.kind == "mig")
_uint_out("nvmlDeviceGetMaxMigDeviceCount", "count", ("gpu",),
          lambda c, s, g, r: g.catalog.compute_slices if g.mig_current else 0)
_uint_out("nvmlDeviceGetGpuInstanceId", "id", ("mig",),
          lambda c, s, g, r: g.ci_by_serial(r.gi_serial, r.ci_serial)[0].id)
_uint_out("nvmlDeviceGetComputeInstanceId", "id", ("mig",),
          lambda c, s, g, r: g.ci_by_serial(r.gi_serial, r.ci_serial)[1].id)


def _not_supported() -> int:
    raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)


@export(HANDLE, UINT, PTR, name="nvmlDeviceGetTemperature", handle=("gpu",))
def temperature(call: Any, handle: int, sensor: int, out_p: int) -> None:
    out = call.mem.at("nvmlDeviceGetTemperature", "temp", out_p, ctypes.c_uint)
    with call.state() as s:
        gpu, _ = call.gpu_of(s, handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        out.value = 31 + 2 * len(gpu.processes)


def _string_out(fn: str, value: Any) -> None:
    @export(HANDLE, PTR, UINT, name=fn, handle=("gpu", "mig"))
    def impl(call: Any, handle: int, buf: int, length: int) -> None:
        with call.state() as s:
            gpu, ref = call.gpu_of(s, handle, "gpu", "mig")
            text = value(gpu, ref)
        call.mem.write_string(fn, buf, length, text)


def _mig_name(gpu: SimGpu, ref: Ref) -> str:
    """nvml.h device names; a MIG device is '<GPU name> MIG <profile>' (facts naming.device_name_in_cuda)."""
    if ref.kind == "gpu":
        return gpu.catalog.nvml_name
    gi, ci = gpu.ci_by_serial(ref.gi_serial, ref.ci_serial)
    prof = gpu.profile(gi.profile_id)
    ci_prof = prof.ci_by_id(ci.profile_id)
    return f"{gpu.catalog.nvml_name} MIG {ci_prof.name if ci_prof else prof.name}"


_string_out("nvmlDeviceGetName", _mig_name)
_string_out("nvmlDeviceGetUUID", lambda g, r: g.uuid if r.kind == "gpu" else g.mig_uuid(
    *g.ci_by_serial(r.gi_serial, r.ci_serial)))


@export(HANDLE, PTR, name="nvmlDeviceGetPciInfo_v3", handle=("gpu",))
def pci_info(call: Any, handle: int, info_p: int) -> None:
    info = call.mem.at("nvmlDeviceGetPciInfo_v3", "pci", info_p, pynvml.nvmlPciInfo_t)
    with call.state() as s:
        gpu, _ = call.gpu_of(s, handle)
        dom, bus, rest = gpu.bus_id.split(":")
        put(info, busId=gpu.bus_id.encode(), busIdLegacy=gpu.bus_id[4:].encode(), domain=int(dom, 16),
            bus=int(bus, 16), device=int(rest.split(".")[0], 16), pciDeviceId=gpu.catalog.pci_device_id,
            pciSubSystemId=0x16C010DE if gpu.catalog.is_hopper_or_newer else 0x134F10DE)


def _memory(s: SimState, gpu: SimGpu, ref: Ref) -> tuple[int, int]:
    if ref.kind == "gpu":
        return gpu.catalog.total_memory_mib * MiB, sum(p.used_mib or 0 for p in gpu.processes) * MiB
    gi, _ = gpu.ci_by_serial(ref.gi_serial, ref.ci_serial)
    gpu.check_answers(gi)
    used = sum(p.used_mib or 0 for p in gpu.processes if p.gi == gi.id) if gpu.processes else 0
    return gpu.mig_memory_mib(gi) * MiB, used * MiB


_MEMORY = plain(pynvml.c_nvmlMemory_t)


@export(HANDLE, PTR, name="nvmlDeviceGetMemoryInfo", handle=("gpu", "mig"))
def memory_info(call: Any, handle: int, mem_p: int) -> None:
    mem = call.mem.at("nvmlDeviceGetMemoryInfo", "memory", mem_p, _MEMORY)
    with call.state() as s:
        total, used = _memory(s, *call.gpu_of(s, handle, "gpu", "mig"))
    mem.total, mem.used, mem.free = total, used, total - used


@export(HANDLE, PTR, name="nvmlDeviceGetMemoryInfo_v2", handle=("gpu", "mig"))
def memory_info_v2(call: Any, handle: int, mem_p: int) -> None:
    mem = call.mem.versioned("nvmlDeviceGetMemoryInfo_v2", "memory", mem_p, pynvml.c_nvmlMemory_v2_t,
                             pynvml.nvmlMemory_v2)
    with call.state() as s:
        total, used = _memory(s, *call.gpu_of(s, handle, "gpu", "mig"))
    put(mem, total=total, used=used, reserved=0, free=total - used)


@export(HANDLE, PTR, name="nvmlDeviceGetUtilizationRates", handle=("gpu",))
def utilization(call: Any, handle: int, util_p: int) -> None:
    """The brief and NVIDIA's MIG guide: utilization queries answer NOT_SUPPORTED in MIG mode."""
    util = call.mem.at("nvmlDeviceGetUtilizationRates", "utilization", util_p, pynvml.c_nvmlUtilization_t)
    with call.state() as s:
        gpu, _ = call.gpu_of(s, handle)
        if gpu.mig_current:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        busy = 100 if gpu.processes else 0
    put(util, gpu=busy, memory=busy // 2)


def _processes(fn: str, graphics: bool) -> None:
    @export(HANDLE, PTR, PTR, name=fn, handle=("gpu", "mig"))
    def impl(call: Any, handle: int, count_p: int, infos_p: int) -> None:
        """nvml.h: with ``*infoCount`` too small (or infos NULL) the call answers INSUFFICIENT_SIZE
        and writes the number needed; usedGpuMemory may be NVML_VALUE_NOT_AVAILABLE."""
        count = call.mem.at(fn, "infoCount", count_p, ctypes.c_uint)
        with call.state() as s:
            gpu, ref = call.gpu_of(s, handle, "gpu", "mig")
            procs = [] if graphics else list(gpu.processes)
            if ref.kind == "mig":
                gi, ci = gpu.ci_by_serial(ref.gi_serial, ref.ci_serial)
                gpu.check_answers(gi)
                procs = [p for p in procs if p.gi == gi.id and p.ci == ci.id]
        capacity, count.value = count.value, len(procs)
        if not procs:
            return
        if not infos_p or capacity < len(procs):
            raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        infos = call.mem.at(fn, "infos", infos_p, pynvml.c_nvmlProcessInfo_v3_t * len(procs))
        for info, p in zip(infos, procs, strict=True):
            put(info, pid=p.pid, usedGpuMemory=(p.used_mib * MiB) if p.used_mib is not None else 2**64 - 1,
                gpuInstanceId=GPU_WIDE if p.gi is None else p.gi, computeInstanceId=GPU_WIDE if p.ci is None else p.ci)


_processes("nvmlDeviceGetComputeRunningProcesses_v3", graphics=False)
_processes("nvmlDeviceGetGraphicsRunningProcesses_v3", graphics=True)  # no graphics in MIG mode [S3]


# -- MIG mode ------------------------------------------------------------------------------------
@export(HANDLE, PTR, PTR, name="nvmlDeviceGetMigMode", handle=("gpu",))
def get_mig_mode(call: Any, handle: int, current_p: int, pending_p: int) -> None:
    current = call.mem.at("nvmlDeviceGetMigMode", "currentMode", current_p, ctypes.c_uint)
    pending = call.mem.at("nvmlDeviceGetMigMode", "pendingMode", pending_p, ctypes.c_uint)
    with call.state() as s:
        gpu, _ = call.gpu_of(s, handle)
        current.value, pending.value = int(gpu.mig_current), int(gpu.mig_pending)


@export(HANDLE, UINT, PTR, name="nvmlDeviceSetMigMode", handle=("gpu",), mutating=True)
def set_mig_mode(call: Any, handle: int, mode: int, status_p: int) -> None:
    status = call.mem.at("nvmlDeviceSetMigMode", "activationStatus", status_p, ctypes.c_int)
    if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    with call.state() as s:
        gpu, _ = call.gpu_of(s, handle)
        if reap_clients(s):
            s.touched = True
        others = any(pid != str(os.getpid()) for pid in s.clients)
        status.value = gpu.set_mig_mode(mode == pynvml.NVML_DEVICE_MIG_ENABLE, others, s.passthrough)
        if status.value == pynvml.NVML_SUCCESS and not gpu.gis:
            s.add_event(gpu.index, pynvml.nvmlEventMigConfigChange, 0, GPU_WIDE, GPU_WIDE)


# -- MIG devices ---------------------------------------------------------------------------------
@export(HANDLE, UINT, PTR, name="nvmlDeviceGetMigDeviceHandleByIndex", handle=("gpu",))
def mig_handle_by_index(call: Any, handle: int, index: int, out_p: int) -> None:
    out = call.mem.at("nvmlDeviceGetMigDeviceHandleByIndex", "migDevice", out_p, ctypes.c_void_p)
    with call.state() as s:
        gpu, _ = call.gpu_of(s, handle)
        gi, ci = gpu.mig_device(index)
    out.value = call.handle(Ref("mig", gpu.index, gi.serial, ci.serial))


@export(HANDLE, PTR, name="nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle=("mig",))
def parent_handle(call: Any, handle: int, out_p: int) -> None:
    out = call.mem.at("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "device", out_p, ctypes.c_void_p)
    with call.state() as s:
        gpu, _ = call.gpu_of(s, handle, "mig")
    out.value = call.handle(Ref("gpu", gpu.index))

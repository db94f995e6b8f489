"""Board-level readings monitoring tools make (gpustat, nvitop, DCGM-less exporters), and every other
entry point pynvml wraps: a real libnvidia-ml exports them all, so none answers FUNCTION_NOT_FOUND.

Modelled (nvml.h prototypes): the CUDA driver version, BAR1 memory (per MIG device too), compute,
persistence, display and driver models, performance state, power limit, versioned temperature, ECC
totals, encoder and decoder utilization, a process's name.  The values are this simulator's model of an idle
data-center board, not recordings (docs/simulator.md); a MIG device handle answers NOT_SUPPORTED for
the GPU-wide readings (BAR1 aside), and encoder/decoder utilization is NOT_SUPPORTED in MIG mode, as
utilization is (NVIDIA's MIG user guide).

Every other function pynvml resolves (``_nvmlGetFunctionPointer("nvml...")`` in its source) is exported
as NOT_SUPPORTED, what a driver answers for a feature the board lacks, after the checks every entry
point makes (initialised; a device handle valid and its GPU not lost).
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import re
from typing import Any

import pynvml

from migd.sim.entry import HANDLE, PTR, UINT, Export, exporter
from migd.sim.gpu import NvmlFail

ENTRIES: list[Export] = []
export = exporter(ENTRIES)
_NOT_SUPPORTED = NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
GiB = 1 << 30

# CUDA toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions": the CUDA version a
# driver branch ships (nvml.h nvmlSystemGetCudaDriverVersion: "e.g. 12040 for CUDA 12.4").
_CUDA_OF_BRANCH = {580: 13000, 575: 12090, 570: 12080, 560: 12060, 555: 12050, 550: 12040, 545: 12030,
                   535: 12020, 530: 12010, 525: 12000}


def _gpu_only(call: Any, handle: int) -> Any:
    """The GPU behind a whole-GPU handle; a MIG device handle answers NOT_SUPPORTED (a GPU-wide reading)."""
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "gpu", "mig")
        if ref.kind != "gpu":
            raise _NOT_SUPPORTED
        return gpu


def _cuda_version(call: Any, out_p: int, fn: str) -> None:
    out = call.mem.at(fn, "cudaDriverVersion", out_p, ctypes.c_int)
    with call.state() as s:
        branch = int(s.driver_version.split(".")[0])
    out.value = _CUDA_OF_BRANCH.get(branch, max(_CUDA_OF_BRANCH.values()))


@export(PTR, name="nvmlSystemGetCudaDriverVersion")
def cuda_driver_version(call: Any, out_p: int) -> None:
    _cuda_version(call, out_p, "nvmlSystemGetCudaDriverVersion")


@export(PTR, name="nvmlSystemGetCudaDriverVersion_v2")
def cuda_driver_version_v2(call: Any, out_p: int) -> None:
    _cuda_version(call, out_p, "nvmlSystemGetCudaDriverVersion_v2")


@export(UINT, PTR, UINT, name="nvmlSystemGetProcessName")
def process_name(call: Any, pid: int, name_p: int, length: int) -> None:
    """nvml.h: the name of the process ``pid`` (any process, not only the GPU's: the driver reads the
    process table), NOT_FOUND when no such process exists (a simulated CUDA process with a made-up pid
    is one).  Its first argument, as ``nvidia-smi``'s process table shows it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
        if not argv0:  # a kernel thread: no command line
            with open(f"/proc/{pid}/comm", "rb") as f:
                argv0 = f.read().decode(errors="replace").strip()
    except FileNotFoundError:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND) from None
    except PermissionError:
        raise NvmlFail(pynvml.NVML_ERROR_NO_PERMISSION) from None
    call.mem.write_string("nvmlSystemGetProcessName", name_p, length, argv0)


@export(HANDLE, PTR, name="nvmlDeviceGetBAR1MemoryInfo", handle=("gpu", "mig"))
def bar1_memory(call: Any, handle: int, out_p: int) -> None:
    """nvmlBAR1Memory_t in bytes: data-center boards map a BAR1 aperture larger than their memory;
    ``nvidia-smi -q`` shows BAR1 per MIG device too, modelled here as its share of the memory slices
    (nvitop's MIG rows need it)."""
    out = call.mem.at("nvmlDeviceGetBAR1MemoryInfo", "bar1Memory", out_p, pynvml.c_nvmlBAR1Memory_t)
    with call.state() as s:
        gpu, ref = call.gpu_of(s, handle, "gpu", "mig")
        total = max(128, 1 << (gpu.catalog.total_memory_mib >> 10).bit_length()) * GiB
        if ref.kind == "mig":
            gi, _ = gpu.ci_by_serial(ref.gi_serial, ref.ci_serial)
            total = total * gpu.profile(gi.profile_id).memory_slices // gpu.catalog.memory_slices
        used = (2 + len(gpu.processes)) * (1 << 20)
    out.bar1Total, out.bar1Used, out.bar1Free = total, used, total - used


def _enum_out(fn: str, what: str, value: Any) -> None:
    """``fn(nvmlDevice_t, <enum> *)`` for a whole-GPU handle: ``value(gpu)``."""
    @export(HANDLE, PTR, name=fn, handle=("gpu", "mig"))
    def impl(call: Any, handle: int, out_p: int) -> None:
        out = call.mem.at(fn, what, out_p, ctypes.c_uint)
        out.value = int(value(_gpu_only(call, handle)))


_enum_out("nvmlDeviceGetComputeMode", "mode", lambda g: pynvml.NVML_COMPUTEMODE_DEFAULT)
# migd's unit runs after nvidia-persistenced: the driver stays loaded, persistence on (nvidia-smi -q).
_enum_out("nvmlDeviceGetPersistenceMode", "mode", lambda g: pynvml.NVML_FEATURE_ENABLED)
_enum_out("nvmlDeviceGetDisplayActive", "isActive", lambda g: pynvml.NVML_FEATURE_DISABLED)  # no display head
_enum_out("nvmlDeviceGetDisplayMode", "display", lambda g: pynvml.NVML_FEATURE_DISABLED)
_enum_out("nvmlDeviceGetPerformanceState", "pState", lambda g: pynvml.NVML_PSTATE_0)
_enum_out("nvmlDeviceGetPowerManagementLimit", "limit",
          lambda g: 700_000 if g.catalog.is_hopper_or_newer else 400_000)  # milliwatts, as the enforced limit


@export(HANDLE, PTR, PTR, name="nvmlDeviceGetDriverModel_v2", handle=("gpu", "mig"))
def driver_model(call: Any, handle: int, current_p: int, pending_p: int) -> None:
    """nvml.h: "For windows only": on Linux the driver answers NOT_SUPPORTED."""
    _gpu_only(call, handle)
    raise _NOT_SUPPORTED


@export(HANDLE, PTR, name="nvmlDeviceGetTemperatureV", handle=("gpu", "mig"))
def temperature_v(call: Any, handle: int, temp_p: int) -> None:
    """nvmlTemperature_t (version 1): a versioned struct whose version the caller sets."""
    out = call.mem.at("nvmlDeviceGetTemperatureV", "temperature", temp_p, pynvml.c_nvmlTemperature_v1_t)
    if out.version != pynvml.nvmlTemperature_v1:
        raise NvmlFail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    gpu = _gpu_only(call, handle)
    if out.sensorType != pynvml.NVML_TEMPERATURE_GPU:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    out.temperature = 31 + 2 * len(gpu.processes)  # as nvmlDeviceGetTemperature


@export(HANDLE, UINT, UINT, PTR, name="nvmlDeviceGetTotalEccErrors", handle=("gpu", "mig"))
def total_ecc(call: Any, handle: int, error_type: int, counter_type: int, count_p: int) -> None:
    out = call.mem.at("nvmlDeviceGetTotalEccErrors", "eccCounts", count_p, ctypes.c_ulonglong)
    _gpu_only(call, handle)
    if error_type > pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED or counter_type > pynvml.NVML_AGGREGATE_ECC:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    out.value = 0


def _codec(fn: str) -> None:
    @export(HANDLE, PTR, PTR, name=fn, handle=("gpu", "mig"))
    def impl(call: Any, handle: int, util_p: int, period_p: int) -> None:
        util = call.mem.at(fn, "utilization", util_p, ctypes.c_uint)
        period = call.mem.at(fn, "samplingPeriodUs", period_p, ctypes.c_uint)
        if _gpu_only(call, handle).mig_current:  # utilization is not reported under MIG
            raise _NOT_SUPPORTED
        util.value, period.value = 0, 167_000


_codec("nvmlDeviceGetEncoderUtilization")
_codec("nvmlDeviceGetDecoderUtilization")


# -- everything else pynvml can ask for ---------------------------------------------------------------
# Functions named nvmlDevice* whose first argument is not a device handle (a string, a PCI info, a count).
_NOT_A_HANDLE = re.compile(r"^nvmlDevice(GetHandleBy|GetCount|DiscoverGpus|RemoveGpu|QueryDrainState|"
                           r"ModifyDrainState|GetGpuInstanceRemainingCapacity$|CreateGpuInstance$)")


@functools.cache
def pynvml_names() -> frozenset[str]:
    """Every C symbol the installed pynvml resolves (its ``_nvmlGetFunctionPointer`` calls)."""
    return frozenset(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', inspect.getsource(pynvml)))


def _unsupported(call: Any, *raw: Any) -> None:
    if call.export.handle_kinds:
        with call.state() as s:
            call.gpu_of(s, raw[0], *call.export.handle_kinds)
    else:
        with call.state():
            pass  # (the per-call checks: initialised, faults)
    raise _NOT_SUPPORTED


def fallbacks(modelled: frozenset[str]) -> list[Export]:
    """NOT_SUPPORTED entry points for every pynvml name not in ``modelled``.  Only the first argument
    is declared (a device handle where there is one): a C callee may ignore the rest (SysV x86-64)."""
    out = []
    for name in sorted(pynvml_names() - modelled):
        device = name.startswith("nvmlDevice") and not _NOT_A_HANDLE.match(name)
        out.append(Export(name, (HANDLE,) if device else (), _unsupported,
                          handle_kinds=("gpu", "mig") if device else ()))
    return out

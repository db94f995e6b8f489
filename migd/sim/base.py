"""Plumbing of the simulated NVML library (see :mod:`migd.sim.nvml`).

The library itself is a stand-in shaped exactly like the ``pynvml`` module.

:class:`SimNvml` has the ``pynvml`` function names and signatures that migd uses, returns
the real ``pynvml`` ctypes structs and raises ``pynvml.NVMLError`` with real codes, so
:class:`migd.hardware.nvml.NvmlBackend` runs unchanged on top of it.  Handles are real
ctypes pointers whose address is a key into this object's handle table (never
dereferenced), exactly as opaque as the driver's.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from migd.hardware.catalog import GiProfile
from migd.sim.state import SimCi, SimGi, SimGpu, SimState, StateStore

MiB = 1024 * 1024
E = pynvml  # error codes and structs live on the real module

# Calls that change the GPU: they count towards ``crash_after_mutations``.
MUTATING = {
    "nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstance", "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceDestroy", "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "nvmlComputeInstanceDestroy",
}
# GPM metric ids the simulator models (pynvml NVML_GPM_METRIC_*).
_GPM_SHAPE = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 0.9,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 0.55,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.6,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 0.45,
}


ANY_MUTATION = "*mutation*"  # fault target: whichever mutating call comes next


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def free_starts(gpu: SimGpu, p: GiProfile) -> list[int]:
    """Placements of ``p`` that overlap no existing GI on ``gpu``."""
    used = [(g.start, g.start + g.size) for g in gpu.gis]
    return [st for st in p.starts if all(st + p.memory_slices <= a or b <= st for a, b in used)]


def remaining_capacity(gpu: SimGpu, p: GiProfile) -> int:
    # A profile's own placements never overlap each other, so free starts == room left.
    left = p.instance_count - sum(1 for g in gpu.gis if g.profile_id == p.profile_id)
    return max(0, min(left, len(free_starts(gpu, p))))


@dataclass(frozen=True)
class _Ref:
    kind: str  # gpu | gi | ci | mig | eventset | gpm
    gpu: int = -1
    gi_serial: int = -1
    ci_serial: int = -1


def activity(gpu_uuid: str, gi_start: int, t: float) -> float:
    """Deterministic synthetic busy ratio of a loaded instance at time ``t`` (0.1..0.95)."""
    phase = (zlib.crc32(f"{gpu_uuid}/{gi_start}".encode()) % 1000) / 1000.0
    return 0.525 + 0.425 * math.sin(2 * math.pi * (t / 300.0 + phase))


def _activity_integral(gpu_uuid: str, gi_start: int, t: float) -> float:
    phase = (zlib.crc32(f"{gpu_uuid}/{gi_start}".encode()) % 1000) / 1000.0
    w = 2 * math.pi / 300.0
    return 0.525 * t - 0.425 / w * math.cos(w * t + 2 * math.pi * phase)


class SimBase:
    """Plumbing shared by the simulated library's parts: handles, faults, transactions."""

    def __init__(self, store: StateStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._refs: dict[int, _Ref] = {}
        self._addr: dict[_Ref, int] = {}
        self._init = 0
        self._eventsets: dict[int, dict[str, Any]] = {}
        self._samples: dict[int, dict[str, Any]] = {}
        self.NVMLError = pynvml.NVMLError

    # -- plumbing ---------------------------------------------------------------------------------
    def _handle(self, ref: _Ref, ptype: Any) -> Any:
        addr = self._addr.get(ref)
        if addr is None:
            addr = 0x10000 + 0x10 * (len(self._refs) + 1)
            self._refs[addr] = ref
            self._addr[ref] = addr
        return ctypes.cast(addr, ptype)

    def _ref(self, handle: Any, *kinds: str) -> _Ref:
        addr = ctypes.cast(handle, ctypes.c_void_p).value
        ref = self._refs.get(addr or 0)
        if ref is None or ref.kind not in kinds:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        return ref

    def _enter(self, fn: str, state: SimState, gpu: int | None = None) -> None:
        """Common checks for every call: initialised, injected faults, lost GPUs.

        Sets ``state.touched`` when fault bookkeeping changed (the state must be written back)."""
        if self._init <= 0:
            raise nvml_error(E.NVML_ERROR_UNINITIALIZED)
        if self._reap(state):
            state.touched = True
        for fault in list(state.faults):
            if (fault.fn == fn or (fault.fn == ANY_MUTATION and fn in MUTATING)) and \
                    (fault.gpu is None or fault.gpu == gpu):
                fault.calls += 1
                state.touched = True
                if fault.calls >= fault.nth:
                    state.faults.remove(fault)
                    raise nvml_error(fault.code)
        if gpu is not None and state.gpus[gpu].lost:
            raise nvml_error(E.NVML_ERROR_GPU_IS_LOST)

    @staticmethod
    def _reap(state: SimState) -> bool:
        """Like the driver, forget the contexts of processes that have exited."""
        changed = False
        for g in state.gpus:
            alive = [p for p in g.processes if not p.real or _alive(p.pid)]
            if len(alive) != len(g.processes):
                g.processes, changed = alive, True
        return changed

    def _mutated(self, state: SimState) -> None:
        state.mutations += 1
        if state.crash_after_mutations is not None:
            state.crash_after_mutations -= 1
            if state.crash_after_mutations <= 0:
                state.crash_after_mutations = None
                self._store.write_held(state)  # the driver already did it: the change survives the crash
                os.kill(os.getpid(), signal.SIGKILL)

    def _call(self, fn: str, gpu_handle: Any | None, body: Callable[[SimState], Any],
              kinds: tuple[str, ...] = ("gpu",)) -> Any:
        ref = self._ref(gpu_handle, *kinds) if gpu_handle is not None else None
        error: pynvml.NVMLError | None = None
        with self._store.transaction() as state:
            state.touched = False
            try:
                self._enter(fn, state, ref.gpu if ref else None)
                result = body(state)
            except pynvml.NVMLError as e:
                error = e  # bodies validate before they change anything: nothing else to persist
            else:
                if fn in MUTATING:
                    self._mutated(state)
                    state.touched = True
        if error is not None:
            raise error
        if fn in MUTATING and state.mutation_delay_s > 0:
            time.sleep(state.mutation_delay_s)  # outside the lock: other processes keep going
        return result

    def _gpu(self, state: SimState, handle: Any, *kinds: str) -> tuple[SimGpu, _Ref]:
        ref = self._ref(handle, *(kinds or ("gpu",)))
        if ref.gpu >= len(state.gpus):
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        return state.gpus[ref.gpu], ref

    @staticmethod
    def _gi_by_serial(gpu: SimGpu, serial: int) -> SimGi:
        gi = next((g for g in gpu.gis if g.serial == serial), None)
        if gi is None:  # destroyed, or lost in a reset: the handle is stale
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        return gi

    def _ci_by_serial(self, gpu: SimGpu, gi_serial: int, ci_serial: int) -> tuple[SimGi, SimCi]:
        gi = self._gi_by_serial(gpu, gi_serial)
        ci = next((c for c in gi.cis if c.serial == ci_serial), None)
        if ci is None:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        return gi, ci

    def _gpu_handle(self, index: int) -> Any:
        return self._handle(_Ref("gpu", index), E.c_nvmlDevice_t)

    def _gi_handle(self, index: int, gi: SimGi) -> Any:
        return self._handle(_Ref("gi", index, gi.serial), E.c_nvmlGpuInstance_t)

    def _ci_handle(self, index: int, gi: SimGi, ci: SimCi) -> Any:
        return self._handle(_Ref("ci", index, gi.serial, ci.serial), E.c_nvmlComputeInstance_t)

    def _mig_handle(self, index: int, gi: SimGi, ci: SimCi) -> Any:
        return self._handle(_Ref("mig", index, gi.serial, ci.serial), E.c_nvmlDevice_t)

    @staticmethod
    def _require_mig(gpu: SimGpu) -> None:
        if not gpu.mig_current:
            raise nvml_error(E.NVML_ERROR_NOT_SUPPORTED)

    @staticmethod
    def _profile(gpu: SimGpu, profile_id: int) -> GiProfile:
        p = gpu.catalog.profile_by_id(profile_id)
        if p is None:
            raise nvml_error(E.NVML_ERROR_INVALID_ARGUMENT)
        return p

    @staticmethod
    def mig_uuid(gpu: SimGpu, gi: SimGi, ci: SimCi) -> str:
        return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{gpu.uuid}/{gi.serial}/{ci.serial}"))


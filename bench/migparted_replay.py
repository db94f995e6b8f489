"""NVIDIA mig-parted's NVML call sequence for ``nvidia-mig-parted apply``, replayed through pynvml.

The reference the apply benchmark is measured against: the calls mig-parted makes,
in its order, on the same simulated driver with the same latency per mutating call.  Followed
from mig-parted's code (github.com/NVIDIA/mig-parted):

- ``cmd/nvidia-mig-parted/apply/apply.go`` ApplyMigConfigWithHooks: assert the mode, assert the
  config (fails), apply the mode (already right: nothing changes), apply the config;
- ``assert.WalkSelectedMigConfigForEachGPU``: every GPU, one after another, by index with its PCI id;
- ``apply/config.go`` ApplyMigConfig: MIG capable, mode, current config, then SetMigConfig;
- ``pkg/mig/config/config.go`` SetMigConfig: memory, mode, the GPU's MIG profiles (go-nvlib
  ``VisitMigProfiles``), current config, ClearMigConfig (every CI, then its GI), current config
  again, then per device of the config (``Flatten`` order) CreateGpuInstance (reusing the last GI
  while its CI fits) and CreateComputeInstance, each after its profile-info query;
- ``internal/nvlib/mig/mig.go`` WalkGpuInstances / WalkComputeInstances: every GI profile index,
  every CI profile and engine profile index, instances listed per profile.

Permutations after a failed creation are not replayed: on the configs benchmarked the first
ordering succeeds, as it does on hardware.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

_SKIP = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)


def _maybe(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as e:
        if e.value in _SKIP:
            return None
        raise


def _listing(fn: Callable[..., Any], parent: Any, info: Any, ctype: Any) -> list[Any]:
    capacity = max(1, int(info.instanceCount))  # go-nvml: the array's capacity goes in *count
    refs = (ctype * capacity)()
    count = ctypes.c_uint(capacity)
    fn(parent, info.id, refs, ctypes.byref(count))
    return [refs[i] for i in range(count.value)]


def walk(dev: Any, on_ci: Callable[[Any], None] | None = None, on_gi: Callable[[Any], None] | None = None) -> int:
    """WalkGpuInstances + WalkComputeInstances; returns the number of CIs seen (GetMigConfig's count)."""
    seen = 0
    for i in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _maybe(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev, i)
        if info is None:
            continue
        for gi in _listing(pynvml.nvmlDeviceGetGpuInstances, dev, info, pynvml.c_nvmlGpuInstance_t):
            for j in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                for k in range(pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT):
                    cinfo = _maybe(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, j, k)
                    if cinfo is None:
                        continue
                    for ci in _listing(pynvml.nvmlGpuInstanceGetComputeInstances, gi, cinfo,
                                       pynvml.c_nvmlComputeInstance_t):
                        seen += 1
                        if on_ci is not None:
                            on_ci(ci)
            if on_gi is not None:
                on_gi(gi)
    return seen


def get_mig_config(index: int) -> int:
    dev = pynvml.nvmlDeviceGetHandleByIndex(index)
    pynvml.nvmlDeviceGetMemoryInfo(dev)
    pynvml.nvmlDeviceGetMigMode(dev)  # AssertMigEnabled
    return walk(dev)


def clear_mig_config(index: int) -> None:
    dev = pynvml.nvmlDeviceGetHandleByIndex(index)
    pynvml.nvmlDeviceGetMigMode(dev)
    walk(dev, on_ci=pynvml.nvmlComputeInstanceDestroy, on_gi=pynvml.nvmlGpuInstanceDestroy)


def set_mig_config(index: int, devices: list[tuple[int, int]]) -> None:
    """``devices``: (GI profile index, CI profile index) per MIG device, in Flatten order."""
    dev = pynvml.nvmlDeviceGetHandleByIndex(index)
    pynvml.nvmlDeviceGetMemoryInfo(dev)
    pynvml.nvmlDeviceGetMigMode(dev)
    pynvml.nvmlDeviceGetMigMode(dev)  # go-nvlib VisitMigProfiles: IsMigCapable
    pynvml.nvmlDeviceGetMemoryInfo(dev)
    for i in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        _maybe(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev, i)
    if get_mig_config(index):
        clear_mig_config(index)
        get_mig_config(index)
    gi, last = None, -1
    for gi_profile, ci_profile in devices:
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, gi_profile)
        reuse = gi is not None and last == gi_profile
        last = gi_profile
        while True:
            if not reuse:
                gi = pynvml.nvmlDeviceCreateGpuInstance(dev, info.id)
            try:
                cinfo = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                pynvml.nvmlGpuInstanceCreateComputeInstance(gi, cinfo.id)
            except pynvml.NVMLError:
                if reuse:
                    reuse = False
                    continue
                raise
            break


def _selected(count: int) -> list[Any]:
    """WalkSelectedMigConfigForEachGPU: each GPU's handle and PCI device id, in index order."""
    out = []
    for i in range(count):
        dev = pynvml.nvmlDeviceGetHandleByIndex(i)
        pynvml.nvmlDeviceGetPciInfo(dev)
        out.append(dev)
    return out


def apply(devices: list[tuple[int, int]]) -> None:
    """``nvidia-mig-parted apply`` of one config selecting every GPU, MIG mode already enabled."""
    count = pynvml.nvmlDeviceGetCount()
    for dev in _selected(count):  # AssertMigMode
        pynvml.nvmlDeviceGetMigMode(dev)
    for i, dev in enumerate(_selected(count)):  # AssertMigConfig (fails: the layout differs)
        pynvml.nvmlDeviceGetMigMode(dev)
        get_mig_config(i)
    for dev in _selected(count):  # ApplyMigMode: capable, mode already as asked
        pynvml.nvmlDeviceGetMigMode(dev)
        pynvml.nvmlDeviceGetMigMode(dev)
    for i, dev in enumerate(_selected(count)):  # ApplyMigConfig
        pynvml.nvmlDeviceGetMigMode(dev)
        pynvml.nvmlDeviceGetMigMode(dev)
        get_mig_config(i)
        set_mig_config(i, devices)

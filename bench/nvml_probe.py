"""Read-only NVML probe: what a real driver answers where the simulator makes assumptions.

Run on a machine with an NVIDIA GPU (``python3 bench/nvml_probe.py``).  It only *reads*:
no MIG mode change, no instance created or destroyed, no reset.  The JSON it prints is
compared by hand with migd's simulator (README "What was checked on real hardware").
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

import pynvml as N


def ask(fn: Any, *args: Any) -> Any:
    try:
        v = fn(*args)
        return v.decode() if isinstance(v, bytes) else v
    except N.NVMLError as e:
        return f"NVML_ERROR {e.value} ({e})"
    except N.NVMLLibraryMismatchError as e:
        return f"library mismatch: {e}"


def _instances(h: Any) -> int:
    refs = (N.c_nvmlGpuInstance_t * 7)()
    count = ctypes.c_uint(7)  # the buffer's capacity, as go-nvml passes it
    N.nvmlDeviceGetGpuInstances(h, 19, refs, ctypes.byref(count))
    return count.value


def gpu(i: int) -> dict[str, Any]:
    h = N.nvmlDeviceGetHandleByIndex(i)
    pci = N.nvmlDeviceGetPciInfo(h)
    mem = N.nvmlDeviceGetMemoryInfo(h)
    out: dict[str, Any] = {
        "name": ask(N.nvmlDeviceGetName, h), "pci_device_id": hex(pci.pciDeviceId),
        "pci_sub_system_id": hex(pci.pciSubSystemId), "memory_total_mib": mem.total // 2**20,
        "architecture": ask(N.nvmlDeviceGetArchitecture, h), "mig_mode": ask(N.nvmlDeviceGetMigMode, h),
        "max_mig_devices": ask(N.nvmlDeviceGetMaxMigDeviceCount, h),
        "supported_event_types": ask(N.nvmlDeviceGetSupportedEventTypes, h),
        "fan_speed": ask(N.nvmlDeviceGetFanSpeed, h), "utilization": str(ask(N.nvmlDeviceGetUtilizationRates, h)),
        "processes": str(ask(N.nvmlDeviceGetComputeRunningProcesses, h)),
        "gpm_supported": str(ask(lambda d: N.nvmlGpmQueryDeviceSupport(d).isSupportedDevice, h)),
        "remaining_capacity_19": ask(N.nvmlDeviceGetGpuInstanceRemainingCapacity, h, 19),
        "gpu_instances_19": ask(_instances, h), "profile_info_v1_enum0": str(ask(
            N.nvmlDeviceGetGpuInstanceProfileInfo, h, 0, 1)),
        "profiles": {}, "placements": {},
    }
    for enum in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT + 1):
        info = ask(N.nvmlDeviceGetGpuInstanceProfileInfo, h, enum)
        if isinstance(info, str):
            out["profiles"][enum] = info
            continue
        out["profiles"][enum] = {k: (getattr(info, k).decode() if isinstance(getattr(info, k), bytes)
                                     else getattr(info, k)) for k, _ in info._fields_}
    for pid in (19, 20, 15, 14, 9, 5, 0):
        count = ctypes.c_uint(0)
        r = ask(N.nvmlDeviceGetGpuInstancePossiblePlacements, h, pid, None, ctypes.byref(count))
        if isinstance(r, str):
            out["placements"][pid] = r
            continue
        buf = (N.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
        r = ask(N.nvmlDeviceGetGpuInstancePossiblePlacements, h, pid, buf, ctypes.byref(count))
        out["placements"][pid] = r if isinstance(r, str) else [(buf[k].start, buf[k].size) for k in range(count.value)]
    return out


def main() -> int:
    if sys.argv[1:]:
        print(__doc__.strip().splitlines()[0] + "\nusage: python3 bench/nvml_probe.py  (no options)", file=sys.stderr)
        return 0 if sys.argv[1:] in (["-h"], ["--help"]) else 2
    try:
        N.nvmlInit()
    except N.NVMLError as e:
        print(f"nvml_probe: nvmlInit failed: {e}", file=sys.stderr)
        return 4
    try:
        doc = {"driver": ask(N.nvmlSystemGetDriverVersion), "nvml": ask(N.nvmlSystemGetNVMLVersion),
               "cuda_driver": ask(N.nvmlSystemGetCudaDriverVersion), "nvidia_ml_py": getattr(N, "__version__", "?"),
               "gpus": [gpu(i) for i in range(N.nvmlDeviceGetCount())]}
    finally:
        N.nvmlShutdown()
    json.dump(doc, sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``nvidia-smi --query-gpu=FIELD,... --format=csv[,noheader][,nounits]`` over the simulator.

Like the real tool, this is an NVML client: every value is what the simulated library answers through
pynvml, so a script reading the CSV sees what an NVML program sees.  Field names, units and the CSV
layout follow nvidia-smi(1) and ``nvidia-smi --help-query-gpu`` (R550 manual page): values separated by
", ", a header naming each field with its unit in brackets (``memory.total [MiB]``), ``noheader`` and
``nounits`` dropping them; a value NVML does not support prints ``[N/A]``.  Fields outside the table
below are refused as the real tool refuses an unknown one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

MiB = 1 << 20
_STATE = {pynvml.NVML_FEATURE_ENABLED: "Enabled", pynvml.NVML_FEATURE_DISABLED: "Disabled"}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _mem(part: str) -> Callable[[Any], int]:
    return lambda h: int(getattr(pynvml.nvmlDeviceGetMemoryInfo(h), part)) // MiB


# field -> (unit, NVML reading of a device handle)
FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "index": ("", pynvml.nvmlDeviceGetIndex),
    "uuid": ("", lambda h: _s(pynvml.nvmlDeviceGetUUID(h))),
    "name": ("", lambda h: _s(pynvml.nvmlDeviceGetName(h))),
    "serial": ("", lambda h: _s(pynvml.nvmlDeviceGetSerial(h))),
    "gpu_serial": ("", lambda h: _s(pynvml.nvmlDeviceGetSerial(h))),
    "pci.bus_id": ("", lambda h: _s(pynvml.nvmlDeviceGetPciInfo(h).busId)),
    "driver_version": ("", lambda h: _s(pynvml.nvmlSystemGetDriverVersion())),
    "count": ("", lambda h: pynvml.nvmlDeviceGetCount()),
    "memory.total": ("MiB", _mem("total")),
    "memory.used": ("MiB", _mem("used")),
    "memory.free": ("MiB", _mem("free")),
    "utilization.gpu": ("%", lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
    "utilization.memory": ("%", lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).memory),
    "temperature.gpu": ("", lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
    "power.draw": ("W", lambda h: f"{pynvml.nvmlDeviceGetPowerUsage(h) / 1000:.2f}"),
    "power.limit": ("W", lambda h: f"{pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000:.2f}"),
    "mig.mode.current": ("", lambda h: _STATE[pynvml.nvmlDeviceGetMigMode(h)[0]]),
    "mig.mode.pending": ("", lambda h: _STATE[pynvml.nvmlDeviceGetMigMode(h)[1]]),
    "persistence_mode": ("", lambda h: _STATE[pynvml.nvmlDeviceGetPersistenceMode(h)]),
    "display_active": ("", lambda h: _STATE[pynvml.nvmlDeviceGetDisplayActive(h)]),
    "display_mode": ("", lambda h: _STATE[pynvml.nvmlDeviceGetDisplayMode(h)]),
    "pstate": ("", lambda h: f"P{pynvml.nvmlDeviceGetPerformanceState(h)}"),
    "compute_mode": ("", lambda h: "Default" if pynvml.nvmlDeviceGetComputeMode(h) == 0 else "Exclusive_Process"),
}


def _value(field: str, handle: Any, units: bool) -> str:
    unit, read = FIELDS[field]
    try:
        value = _s(read(handle))
    except pynvml.NVMLError_NotSupported:
        return "[N/A]"
    except pynvml.NVMLError as e:
        return f"[{e}]"
    return f"{value} {unit}" if units and unit else value


def query_gpu(fields: list[str], formats: list[str], indexes: list[int]) -> tuple[int, str]:
    """The CSV for ``fields`` of the GPUs ``indexes`` (the simulated library is loaded and initialised)."""
    bad = [f for f in fields if f not in FIELDS]
    if bad:
        return 2, f'Field "{bad[0]}" is not a valid field to query.\n\n'
    if "csv" not in formats:
        return 2, "Format must be specified with csv: --format=csv[,noheader][,nounits]\n"
    units = "nounits" not in formats
    lines = []
    if "noheader" not in formats:
        lines.append(", ".join(f"{f} [{FIELDS[f][0]}]" if units and FIELDS[f][0] else f for f in fields))
    for i in indexes:
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        lines.append(", ".join(_value(f, h, units) for f in fields))
    return 0, "\n".join(lines) + "\n"

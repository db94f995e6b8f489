"""``nvidia-smi`` with no arguments over the simulator: the GPU table, the MIG devices table and the
processes table, read through pynvml as the real tool reads NVML.

Layout: the R570 driver's 89-column tables (columns 41|24|22, MIG devices 18|34|11|23, processes one
column), as ``nvidia-smi`` 570.148.08 printed them for an A100 80GB PCIe in MIG mode in a public
recording (the README of ztouchnetworks/k8s-dra-driver-gpu, June 2025); the R535 layout, one column
narrower, is in NVIDIA's MIG user guide ("Getting Started with MIG").  No recording of this table from
the lent H100 (580.159.04) exists yet (tests/fixtures holds its ``mig -lgip``/``-lgipp``), so where
R570 and R580 differ this follows R570.  Unclear from the recordings, so chosen here: a GPU's ECC cell
shows "On" in MIG mode (both recordings do) and its volatile uncorrected count otherwise; a GPU that
is not in MIG mode gets no MIG devices table when none is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

MiB = 1 << 20
T = TypeVar("T")
_COMPUTE_MODES = {pynvml.NVML_COMPUTEMODE_DEFAULT: "Default", pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "E. Process",
                  pynvml.NVML_COMPUTEMODE_PROHIBITED: "Prohibited"}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _or_na(read: Callable[[], T]) -> T | str:
    """NVML's answer, or "N/A" where the board does not support the reading (as the real tool prints)."""
    try:
        return read()
    except pynvml.NVMLError_NotSupported:
        return "N/A"


def _bar(widths: tuple[int, ...], fill: str = "-", left: str = "+", right: str = "+") -> str:
    return left + "+".join(fill * w for w in widths) + right


def _row(*cells: str) -> str:
    return "|" + "|".join(cells) + "|"


GPU_COLS = (41, 24, 22)
MIG_COLS = (18, 34, 11, 23)
FULL = (89,)


def header() -> list[str]:
    cuda = pynvml.nvmlSystemGetCudaDriverVersion()
    driver = _s(pynvml.nvmlSystemGetDriverVersion())
    cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}"
    return [time.strftime("%a %b %d %H:%M:%S %Y") + " " * 7, _bar(FULL),
            f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda_text:<9}|",
            _bar(GPU_COLS, left="|"),  # (the real tool closes this one with "+")
            _row(" GPU  Name                 Persistence-M ", " Bus-Id          Disp.A ", " Volatile Uncorr. ECC "),
            _row(" Fan  Temp   Perf          Pwr:Usage/Cap ", "           Memory-Usage ", " GPU-Util  Compute M. "),
            _row(" " * 41, " " * 24, "               MIG M. "),
            _bar(GPU_COLS, fill="=", left="|", right="|")]


def gpu_rows(index: int, h: Any, mig: int | str) -> list[str]:
    """One GPU's three lines and the bar under them (``mig``: its current MIG mode, or "N/A")."""
    name = _s(pynvml.nvmlDeviceGetName(h))
    name = name if len(name) <= 29 else name[:26] + "..."
    onoff = {pynvml.NVML_FEATURE_ENABLED: "On", pynvml.NVML_FEATURE_DISABLED: "Off"}
    pm = onoff[pynvml.nvmlDeviceGetPersistenceMode(h)]
    disp = onoff[pynvml.nvmlDeviceGetDisplayActive(h)]
    in_mig = mig == pynvml.NVML_DEVICE_MIG_ENABLE
    ecc = "On" if in_mig else _or_na(lambda: pynvml.nvmlDeviceGetTotalEccErrors(
        h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC))
    fan = _or_na(lambda: f"{pynvml.nvmlDeviceGetFanSpeed(h)}%")
    temp = f"{pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}C"
    usage, cap = _watts(lambda: pynvml.nvmlDeviceGetPowerUsage(h)), _watts(
        lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h))
    power = f"{usage:>16} / {cap:>5}"
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    util = "N/A" if in_mig else _or_na(lambda: f"{pynvml.nvmlDeviceGetUtilizationRates(h).gpu}%")
    mode = _COMPUTE_MODES.get(pynvml.nvmlDeviceGetComputeMode(h), "Unknown")
    bus = _s(pynvml.nvmlDeviceGetPciInfo(h).busId)
    mig_word = {pynvml.NVML_DEVICE_MIG_ENABLE: "Enabled", pynvml.NVML_DEVICE_MIG_DISABLE: "Disabled"}.get(mig, "N/A")
    return [_row(f"{index:>4}  {name:<{33 - len(pm)}}{pm}  ", f"{bus:>19} {disp:<3} ", f"{ecc:>21} "),
            _row(f"{fan:>4}{temp:>6}{'P' + str(pynvml.nvmlDeviceGetPerformanceState(h)):>6}{power} ",
                 f"{mem.used // MiB:>8}MiB / {mem.total // MiB:>6}MiB ", f"{util:>8}{mode:>13} "),
            _row(" " * 41, " " * 24, f"{mig_word:>21} "), _bar(GPU_COLS)]


def _mig_mode(h: Any) -> int | str:
    """The current MIG mode, or "N/A" on a board without MIG."""
    return _or_na(lambda: int(pynvml.nvmlDeviceGetMigMode(h)[0]))


def _watts(read: Callable[[], int]) -> str:
    value = _or_na(read)
    return value if isinstance(value, str) else f"{round(value / 1000)}W"


@dataclass(frozen=True)
class _Engines:
    sm: int
    ce: int
    enc: int
    dec: int
    ofa: int
    jpg: int


def _ci_engines(h: Any, gi_id: int, ci_id: int) -> _Engines:
    """A MIG device's SMs and shared engines: its compute instance's profile, as NVML describes it."""
    gi = pynvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
    ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
    want = pynvml.nvmlComputeInstanceGetInfo(ci).profileId
    for p in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, p, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except pynvml.NVMLError:
            continue
        if info.id == want:
            return _Engines(info.multiprocessorCount, info.sharedCopyEngineCount, info.sharedEncoderCount,
                            info.sharedDecoderCount, info.sharedOfaCount, info.sharedJpegCount)
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)


def mig_devices(h: Any) -> Iterator[tuple[int, Any, int, int]]:
    """(MIG device index, handle, GI id, CI id) of one GPU in MIG mode."""
    for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        except pynvml.NVMLError_NotFound:
            continue
        yield k, mh, pynvml.nvmlDeviceGetGpuInstanceId(mh), pynvml.nvmlDeviceGetComputeInstanceId(mh)


def mig_rows(index: int, h: Any, devices: list[tuple[int, Any, int, int]]) -> list[str]:
    rows = []
    for k, mh, gi, ci in devices:
        mem, bar1 = pynvml.nvmlDeviceGetMemoryInfo(mh), pynvml.nvmlDeviceGetBAR1MemoryInfo(mh)
        e = _ci_engines(h, gi, ci)
        rows += [_row(f"{index:>3}{gi:>5}{ci:>4}{k:>4}  ", f"{mem.used // MiB:>16}MiB / {mem.total // MiB:>5}MiB    ",
                      f"{e.sm:>3}{0:>7} ", f"{e.ce:>3}{e.enc:>4}{e.dec:>5}{e.ofa:>5}{e.jpg:>5} "),
                 _row(" " * 18, f"{bar1.bar1Used // MiB:>18}MiB / {bar1.bar1Total // MiB:>5}MiB  ", " " * 11, " " * 23),
                 _bar(MIG_COLS)]
    return rows


def mig_table(per_gpu: list[list[str]]) -> list[str]:
    head = [_bar(FULL), f"| {'MIG devices:':<88}|", _bar(MIG_COLS),
            _row(" GPU  GI  CI  MIG ", " " * 21 + "Memory-Usage ", "        Vol", "        Shared         "),
            _row("      ID  ID  Dev ", " " * 23 + "BAR1-Usage ", " SM     Unc", " CE ENC  DEC  OFA  JPG "),
            _row(" " * 18, " " * 34, "        ECC", " " * 23), _bar(MIG_COLS, fill="=", left="|", right="|")]
    rows = [r for gpu in per_gpu for r in gpu]
    return head + (rows or [f"|{'  No MIG devices found':<89}|", _bar(FULL)])


def process_rows(index: int, h: Any, devices: list[tuple[int, Any, int, int]] | None) -> list[str]:
    """Compute processes (type C), per MIG device in MIG mode (NVML lists them per MIG device handle);
    ``devices`` None: the GPU is not in MIG mode."""
    where = [(mh, str(gi), str(ci)) for _, mh, gi, ci in devices] if devices is not None else [(h, "N/A", "N/A")]
    rows = []
    for handle, gi, ci in where:
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            try:
                name = _s(pynvml.nvmlSystemGetProcessName(p.pid))
            except pynvml.NVMLError:
                name = "N/A"
            used = "N/A" if p.usedGpuMemory is None else f"{p.usedGpuMemory // MiB}MiB"
            rows.append(f"|{index:>5}{gi:>5}{ci:>5}{p.pid:>17}{'C':>7}   {name[:36]:<36}{used:>10} |")
    return rows


def processes_table(rows: list[str]) -> list[str]:
    return [" " * 89, _bar(FULL), f"| {'Processes:':<88}|",
            f"|{'  GPU   GI   CI              PID   Type   Process name':<78}GPU Memory |",
            f"|{'        ID   ID':<78}Usage      |", _bar(FULL, fill="=", left="|", right="|"),
            *(rows or [f"|{'  No running processes found':<89}|"]),
            _bar(FULL)]


def default_table() -> str:
    """The whole output of a plain ``nvidia-smi`` (the simulated library is loaded and initialised)."""
    lines, migs, procs = header(), [], []
    any_mig = False
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mig = _mig_mode(h)
        lines += gpu_rows(i, h, mig)
        devices = list(mig_devices(h)) if mig == pynvml.NVML_DEVICE_MIG_ENABLE else None
        any_mig |= devices is not None
        migs.append(mig_rows(i, h, devices or []))
        procs += process_rows(i, h, devices)
    if any_mig:
        lines += [""] + mig_table(migs)
    return "\n".join(lines + processes_table(procs)) + "\n"

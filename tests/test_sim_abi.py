"""The simulated NVML library is a C library under the real pynvml, and behaves as NVIDIA documents
(or, where the docs are unclear, as a recorded real driver answered: tests/fixtures/*-probe.json)."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml as N
import pytest

from migd.catalog.models import Placement
from migd.hardware.nvml.backend import NvmlBackend
from migd.hardware.types import HardwareError
from migd.sim import world
from migd.sim.library import SimLibrary, load
from migd.sim.state import StateStore, new_state

FIXTURES = Path(__file__).parent / "fixtures"
# bench/nvml_probe.py, `nvidia-smi mig -lgip` and `-lgipp` on lent machines, MIG off, driver 580.159.04
RECORDED = {"single-h100": "h100-sxm5-580.159.04", "hgx-h200": "h200-580.159.04"}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Any]:
    """``node(fleet, mig=True, **state)`` -> (backend, store, library) over a fresh state file."""
    made: list[NvmlBackend] = []

    def make(fleet: str, mig: bool = True, **extra: Any) -> tuple[NvmlBackend, StateStore, SimLibrary]:
        state = new_state(fleet, mig_enabled=mig)
        for k, v in extra.items():
            setattr(state, k, v)
        store = StateStore(tmp_path / f"{fleet}.json", state)
        lib = load(store)
        made.append(NvmlBackend(smi_argv=[sys.executable, "-m", "migd.sim.smi", "--sim-state", str(store.path)]))
        return made[-1], store, lib

    yield make
    for b in made:
        try:
            b.close()
        except HardwareError:
            pass


def test_pynvml_talks_to_c_function_pointers(node: Any) -> None:
    _, _, lib = node("single-h100")
    assert N.nvmlLib is lib
    fn = lib.nvmlDeviceGetCount_v2
    assert isinstance(fn, ctypes._CFuncPtr) and fn.argtypes is None  # what CDLL hands out
    with pytest.raises(ctypes.ArgumentError):
        fn({"not": "a C value"})  # ctypes refuses it, as with the real library
    with pytest.raises(N.NVMLError_NotSupported):  # every symbol resolves, as in a real libnvidia-ml;
        N.nvmlDeviceGetBoardId(N.nvmlDeviceGetHandleByIndex(0))  # one not modelled answers NOT_SUPPORTED


@pytest.mark.parametrize("create", ["gi", "ci"])
def test_struct_by_value_is_rejected_loudly(node: Any, create: str, capfd: pytest.CaptureFixture[str]) -> None:
    backend, store, lib = node("single-a100")
    dev = N.nvmlDeviceGetHandleByIndex(0)
    if create == "gi":
        pl = N.c_nvmlGpuInstancePlacement_t(4, 4)
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 9, pl)  # by value: the old backend's bug
        assert store.read().gpus[0].gis == []
        assert backend.create_gpu_instance(0, 9, Placement(4, 4)) == 2  # by reference: accepted
    else:
        gi = N.nvmlDeviceGetGpuInstanceById(dev, backend.create_gpu_instance(0, 9, Placement(4, 4)))
        cpl = N.c_nvmlComputeInstancePlacement_t(1, 1)
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, 0, cpl)
        assert store.read().gpus[0].gis[0].cis == []
        backend.create_compute_instance(0, 2, 0, Placement(1, 1))
    err = capfd.readouterr().err
    assert "NVML ABI violation" in err and "struct passed by value" in err
    assert "0x400000004" in err or "0x100000001" in err  # size<<32 | start, read as a pointer
    assert lib.mem.violations


def test_versioned_struct_and_null_pointers_are_checked(node: Any) -> None:
    _, _, lib = node("single-h100")
    dev = N.nvmlDeviceGetHandleByIndex(0)
    info = N.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 0  # as a C caller that forgot `.version = nvmlGpuInstanceProfileInfo_v2`
    assert lib.nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, ctypes.byref(info)) == N.NVML_ERROR_INVALID_ARGUMENT
    info.version = N.nvmlGpuInstanceProfileInfo_v2
    assert lib.nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, ctypes.byref(info)) == N.NVML_SUCCESS
    assert lib.nvmlDeviceGetCount_v2(None) == N.NVML_ERROR_INVALID_ARGUMENT
    assert any("version is 0x0" in v for v in lib.mem.violations)


def test_listing_needs_the_buffer_capacity_in_count(node: Any) -> None:
    backend, _, _ = node("single-a100")
    backend.create_gpu_instance(0, 19, Placement(3, 1))
    dev = N.nvmlDeviceGetHandleByIndex(0)
    refs = (N.c_nvmlGpuInstance_t * 7)()
    zero = ctypes.c_uint(0)
    with pytest.raises(N.NVMLError_InsufficientSize):
        N.nvmlDeviceGetGpuInstances(dev, 19, refs, ctypes.byref(zero))
    cap = ctypes.c_uint(7)
    N.nvmlDeviceGetGpuInstances(dev, 19, refs, ctypes.byref(cap))
    assert cap.value == 1
    assert [g.placement for g in backend.list_gpu_instances(0)] == [Placement(3, 1)]


def test_old_driver_missing_v3_symbol_is_a_clear_error(node: Any) -> None:
    backend, _, _ = node("single-a100", missing_symbols=["nvmlDeviceGetComputeRunningProcesses_v3"])
    with pytest.raises(HardwareError) as e:
        backend.gpu_processes(0)
    assert "older than nvidia-ml-py" in str(e.value) and e.value.code == N.NVML_ERROR_FUNCTION_NOT_FOUND


def _holder(state: Path) -> subprocess.Popen[str]:
    """Another process with NVML initialised (a monitoring agent), via `migd-sim exec`."""
    code = "import pynvml, sys; pynvml.nvmlInit(); print('ready', flush=True); sys.stdin.read()"
    p = subprocess.Popen([sys.executable, "-m", "migd.sim.cli", "exec", "--sim-state", str(state), "--",
                          sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.integration
def test_ampere_mode_change_immediate_when_idle_in_use_when_held(node: Any) -> None:
    backend, store, _ = node("single-a100", mig=False)
    assert backend.set_mig_mode(0, True) is True  # bare metal, idle: the driver resets the GPU itself
    holder = _holder(store.path)
    try:
        dev = N.nvmlDeviceGetHandleByIndex(0)
        assert N.nvmlDeviceSetMigMode(dev, 0) == N.NVML_ERROR_IN_USE  # activationStatus, call succeeded
        assert N.nvmlDeviceGetMigMode(dev) == [1, 0]  # pending
        with pytest.raises(HardwareError, match="being used by some other process"):
            backend.reset_gpu(0)  # nvidia-smi -r refuses while the other client holds NVML
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    backend.reset_gpu(0)  # migd releases its own NVML session around the reset
    assert not backend.gpu(0).mig_current


@pytest.mark.integration
def test_passthrough_vm_needs_reset(node: Any) -> None:
    backend, _, _ = node("a100-vm", mig=False)
    assert N.nvmlDeviceSetMigMode(N.nvmlDeviceGetHandleByIndex(0), 1) == N.NVML_ERROR_RESET_REQUIRED
    assert backend.set_mig_mode(1, True) is False
    assert (backend.gpu(1).mig_current, backend.gpu(1).mig_pending) == (False, True)
    backend.reset_gpu(1)
    assert backend.gpu(1).mig_current


@pytest.mark.integration
def test_events_and_gpm_survive_a_reset(node: Any) -> None:
    backend, store, lib = node("a100-vm", mig=False)
    assert backend.wait_event(10) is None  # registers the event set
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    assert not lib.eventsets  # released before the reset ...
    while backend.wait_event(10) is not None:  # ... and registered anew (the reset's own event may come first)
        pass
    world.raise_xid(store, 0, 79)
    ev = backend.wait_event(1000)
    assert ev is not None and (ev.kind, ev.xid) == ("xid", 79)


def test_driver_assigned_ids_and_mig_memory(node: Any) -> None:
    backend, store, _ = node("single-a100")
    ids = [backend.create_gpu_instance(0, 19, Placement(s, 1)) for s in range(7)]
    assert ids == [7, 8, 9, 10, 11, 12, 13]  # not 1, 2, 3...
    for gi in ids:
        backend.destroy_gpu_instance(0, gi)
    low, high = (backend.create_gpu_instance(0, 9, Placement(s, 4)) for s in (0, 4))
    for gi in (low, high):
        backend.create_compute_instance(0, gi, 2)
    mem = {d.gi_id: d.memory_total_bytes // 2**20 for d in backend.list_mig_devices(0)}
    assert mem == {low: 40192 + 128, high: 40192 + 256}  # not the profile's memorySizeMB
    world.start_process(store, 0, high, 0, used_mib=None)
    (p,) = [p for d in backend.list_mig_devices(0) for p in d.processes]
    assert p.used_memory_bytes is None  # NVML_VALUE_NOT_AVAILABLE reaches migd as "unknown"


def test_gpm_samples_freed_on_every_path(node: Any) -> None:
    backend, store, lib = node("single-h100")
    gis = [backend.create_gpu_instance(0, 19, Placement(s, 1)) for s in range(3)]
    for _ in range(5):
        backend.gpm_sample(0, gis, interval_s=0.0)
    assert lib.samples == {}
    world.fail_call(store, "nvmlGpmSampleAlloc", N.NVML_ERROR_MEMORY, nth=4)
    with pytest.raises(HardwareError):
        backend.gpm_sample(0, gis, interval_s=0.0)
    assert lib.samples == {}  # the three allocated before the failure were freed
    world.fail_call(store, "nvmlGpmMigSampleGet", N.NVML_ERROR_UNKNOWN, nth=2)
    with pytest.raises(HardwareError):
        backend.gpm_sample(0, gis, interval_s=0.0)
    assert lib.samples == {}
    s = N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleFree(s)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlGpmMigSampleGet(N.nvmlDeviceGetHandleByIndex(0), gis[0], s)  # a freed sample is invalid


def test_event_setup_skips_unsupported_gpus_and_frees_failed_sets(node: Any) -> None:
    backend, store, lib = node("mixed")
    world.fail_call(store, "nvmlDeviceRegisterEvents", N.NVML_ERROR_UNKNOWN, gpu=2)
    with pytest.raises(HardwareError):
        backend.wait_event(10)
    assert lib.eventsets == {}  # the half-registered set was freed, not leaked
    world.fail_call(store, "nvmlDeviceRegisterEvents", N.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    assert backend.wait_event(10) is None
    assert backend.unwatched_gpus == {1: "NVML_ERROR_NOT_SUPPORTED"} and len(lib.eventsets) == 1
    world.raise_xid(store, 3, 31, gi=None)
    ev = backend.wait_event(1000)
    assert ev is not None and (ev.gpu_index, ev.xid) == (3, 31)  # the other GPUs stay watched


@pytest.mark.parametrize("fleet", sorted(RECORDED))
def test_answers_match_a_recorded_real_gpu(node: Any, fleet: str) -> None:
    """MIG off on an H100 80GB HBM3 and on an H200, driver 580.159.04: the profile table (memory sizes
    are the driver's: the H200's differ from an older driver's lgip), remaining capacity and an empty
    instance list are answered (nvml.h says NOT_SUPPORTED for the last two)."""
    real = json.loads((FIXTURES / f"{RECORDED[fleet]}-probe.json").read_text())["gpus"][0]
    node(fleet, mig=False)
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert N.nvmlDeviceGetName(h) == real["name"]
    assert hex(N.nvmlDeviceGetPciInfo(h).pciDeviceId) == real["pci_device_id"]
    assert N.nvmlDeviceGetMemoryInfo(h).total // 2**20 == real["memory_total_mib"]
    assert N.nvmlDeviceGetMigMode(h) == real["mig_mode"]
    assert N.nvmlDeviceGetMaxMigDeviceCount(h) == real["max_mig_devices"]
    assert N.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19) == real["remaining_capacity_19"]
    assert "Not Supported" in real["fan_speed"]
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetFanSpeed(h)
    refs, cap = (N.c_nvmlGpuInstance_t * 7)(), ctypes.c_uint(7)
    N.nvmlDeviceGetGpuInstances(h, 19, refs, ctypes.byref(cap))
    assert cap.value == real["gpu_instances_19"]
    assert N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == int(real["gpm_supported"])
    wanted = N.nvmlEventTypeXidCriticalError | N.nvmlEventMigConfigChange
    assert N.nvmlDeviceGetSupportedEventTypes(h) & wanted == real["supported_event_types"] & wanted
    for enum, row in real["profiles"].items():
        if isinstance(row, str):
            code = N.NVML_ERROR_INVALID_ARGUMENT if "Invalid Argument" in row else N.NVML_ERROR_NOT_SUPPORTED
            with pytest.raises(N.NVMLError) as e:
                N.nvmlDeviceGetGpuInstanceProfileInfo(h, int(enum))
            assert e.value.value == code, enum
            continue
        info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, int(enum))
        got = {k: getattr(info, k) for k in row}
        got["name"] = got["name"].decode() if isinstance(got["name"], bytes) else got["name"]
        assert got == row, enum  # `version` included: the driver wrote it back as 0
    for pid, placements in real["placements"].items():
        count = ctypes.c_uint(0)
        N.nvmlDeviceGetGpuInstancePossiblePlacements(h, int(pid), None, ctypes.byref(count))
        buf = (N.c_nvmlGpuInstancePlacement_t * count.value)()
        N.nvmlDeviceGetGpuInstancePossiblePlacements(h, int(pid), buf, ctypes.byref(count))
        assert [[p.start, p.size] for p in buf] == placements, pid


@pytest.mark.integration
def test_a_forked_child_checks_its_own_memory(node: Any) -> None:
    """The crash matrix forks appliers: pointers into memory only the child has must be accepted."""
    node("single-a100")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            area = mmap.mmap(-1, 1 << 20)  # a mapping the parent never had
            pl = N.c_nvmlGpuInstancePlacement_t.from_buffer(area)
            pl.start, pl.size = 4, 4
            N.nvmlInit()
            N.nvmlDeviceCreateGpuInstanceWithPlacement(N.nvmlDeviceGetHandleByIndex(0), 9, ctypes.byref(pl))
            N.nvmlShutdown()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_ctrl_c_inside_a_library_call_reaches_the_caller(node: Any, request: pytest.FixtureRequest) -> None:
    """ctypes swallows exceptions in callbacks (the call would look successful): the simulator fails
    the call and raises Ctrl-C in the caller once the call returned, where the program sees it."""
    backend, _, lib = node("single-h100")
    gi = backend.create_gpu_instance(0, 19, Placement(0, 1))
    # A program started as a background job of a non-interactive shell inherits SIGINT ignored, and
    # then Python delivers no Ctrl-C at all (interrupt_main does nothing): the program under test is
    # one that takes Ctrl-C, whatever launched the test run.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))

    def interrupted() -> float:
        raise KeyboardInterrupt

    lib.clock = interrupted
    sample = N.nvmlGpmSampleAlloc()
    with pytest.raises(KeyboardInterrupt):
        try:
            N.nvmlGpmMigSampleGet(N.nvmlDeviceGetHandleByIndex(0), gi, sample)
        except N.NVMLError_Unknown:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the re-posted interrupt lands here
                pass
    N.nvmlGpmSampleFree(sample)


def test_ctrl_c_during_a_slow_call_is_raised_as_the_call_returns(node: Any, request: pytest.FixtureRequest) -> None:
    """With C, a SIGINT during a call is raised in the caller once that call returns.  A caller that
    goes straight into the next slow call must see it there, not after its whole loop (an earlier
    re-post from a helper thread kept landing inside the next call, deferring a second Ctrl-C in a
    rollback until the rollback had finished)."""
    backend, store, _ = node("single-a100")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    world.set_mutation_delay(store, 0.2)
    created = []
    threading.Timer(0.1, os.kill, args=(os.getpid(), signal.SIGINT)).start()  # lands in the first call
    with pytest.raises(KeyboardInterrupt):
        for start in range(7):
            created.append(backend.create_gpu_instance(0, 19, Placement(start, 1)))
    world.set_mutation_delay(store, 0)
    # The first creation took effect (the driver had done it) and the interrupt came as it returned:
    # before create_gpu_instance read the new GI's id, and before any second creation.
    assert created == [] and len(store.read().gpus[0].gis) == 1


def _rows(text: str) -> list[list[str]]:
    """The number columns of an `nvidia-smi mig -lgip` table, two lines per profile joined."""
    lines = [ln.strip("| ").split() for ln in text.splitlines() if ln.startswith("|") and "MIG" not in ln[:3]]
    body = [ln for ln in lines if ln and (ln[0].isdigit() or ln[0] == "MIG")]
    return [a + b for a, b in zip(body[::2], body[1::2], strict=True)]


@pytest.mark.integration
@pytest.mark.parametrize("fleet", sorted(RECORDED))
def test_fake_nvidia_smi_lists_profiles_as_a_real_gpu_did(tmp_path: Path, fleet: str) -> None:
    state = tmp_path / "h.json"
    smi = [sys.executable, "-m", "migd.sim.cli", "exec", "--sim-state", str(state), "--sim", fleet, "--",
           "nvidia-smi", "mig"]
    lgip = subprocess.run([*smi, "-lgip"], capture_output=True, text=True, check=True).stdout
    real = _rows((FIXTURES / f"{RECORDED[fleet]}-lgip.txt").read_text())
    assert [r for r in _rows(lgip) if r[0] == "0"] == real  # (the H200 fleet has 8 GPUs; GPU 0 recorded)
    lgipp = subprocess.run([*smi, "-lgipp"], capture_output=True, text=True, check=True).stdout
    first = [ln for ln in lgipp.splitlines() if ln.startswith("GPU  0 ")]
    assert " ".join(first).split() == (FIXTURES / f"{RECORDED[fleet]}-lgipp.txt").read_text().split()


@pytest.mark.integration
def test_listing_survives_an_instance_vanishing_underneath(node: Any) -> None:
    """Another process may destroy a MIG device between enumeration and query (its handle is then
    invalid, nvml.h): the listing re-enumerates instead of failing `migctl status` mid-apply."""
    backend, store, _ = node("single-a100")
    for s in range(3):
        backend.create_compute_instance(0, backend.create_gpu_instance(0, 19, Placement(s, 1)), 0)
    world.fail_call(store, "nvmlDeviceGetMemoryInfo", N.NVML_ERROR_INVALID_ARGUMENT)
    assert len(backend.list_mig_devices(0)) == 3
    for _ in range(60):
        world.fail_call(store, "nvmlDeviceGetMemoryInfo", N.NVML_ERROR_INVALID_ARGUMENT)
    t0 = time.monotonic()
    with pytest.raises(HardwareError, match="kept changing"):
        backend.list_mig_devices(0)  # bounded in time: a handle that stays invalid is an error
    assert time.monotonic() - t0 < 10


def test_gpm_metrics_get_reads_the_header_and_the_entries_it_names(node: Any) -> None:
    """nvmlGpmMetricsGet reads version, numMetrics, the two samples and numMetrics entries: a buffer
    holding just those is answered in full (the driver cannot know the caller's allocation), more
    entries than the struct holds or a wrong version are refused."""
    backend, _, _ = node("single-h100")
    gi = backend.create_gpu_instance(0, 19, Placement(0, 1))
    dev = N.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmMigSampleGet(dev, gi, s1)
    time.sleep(0.11)
    N.nvmlGpmMigSampleGet(dev, gi, s2)
    offset = N.c_nvmlGpmMetricsGet_t.metrics.offset
    metric = ctypes.sizeof(N.c_nvmlGpmMetric_t)
    short = ctypes.create_string_buffer(offset + 2 * metric)  # room for two entries, not 477
    raw = (ctypes.c_uint * 2).from_buffer(short, 0)
    raw[0], raw[1] = N.NVML_GPM_METRICS_GET_VERSION, 2
    ptrs = (ctypes.c_void_p * 2).from_buffer(short, 8)
    ptrs[0], ptrs[1] = ctypes.cast(s1, ctypes.c_void_p).value, ctypes.cast(s2, ctypes.c_void_p).value
    entries = (N.c_nvmlGpmMetric_t * 2).from_buffer(short, offset)
    entries[0].metricId, entries[1].metricId = N.NVML_GPM_METRIC_SM_UTIL, 9999
    get = N._nvmlGetFunctionPointer("nvmlGpmMetricsGet")
    assert get(ctypes.c_void_p(ctypes.addressof(short))) == N.NVML_SUCCESS
    assert entries[0].nvmlReturn == N.NVML_SUCCESS and entries[1].nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED
    raw[1] = N.c_nvmlGpmMetricsGet_t.metrics.size // metric + 1
    assert get(ctypes.c_void_p(ctypes.addressof(short))) == N.NVML_ERROR_INVALID_ARGUMENT
    raw[0], raw[1] = N.NVML_GPM_METRICS_GET_VERSION + 1, 2
    assert get(ctypes.c_void_p(ctypes.addressof(short))) == N.NVML_ERROR_INVALID_ARGUMENT
    N.nvmlGpmSampleFree(s1)
    N.nvmlGpmSampleFree(s2)

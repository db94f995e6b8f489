"""What a sampling cycle, an idle event wait and a listing cost, counted on the simulated
NVML library under the real pynvml: the state is parsed only after a write, an event wait sleeps
until a write instead of polling, GPM samples roll, profile tables are read once per MIG mode."""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from migd.catalog.models import Placement
from migd.hardware.nvml import telemetry
from migd.hardware.nvml.backend import NvmlBackend
from migd.isolation.events import EventCounters
from migd.isolation.marks import FaultMarks
from migd.isolation.watch import FaultWatch
from migd.metrics.sampler import Sampler
from migd.sim import state as state_module
from migd.sim import world
from migd.sim.backend import sim_backend
from migd.sim.entry_telemetry import activity
from migd.sim.library import SimLibrary, loaded
from migd.sim.state import StateStore
from tests.helpers import PROFILES, REPO, Migctl


def lib() -> SimLibrary:
    library = loaded()
    assert library is not None
    return library


def spent(before: Counter[str]) -> Counter[str]:
    after = Counter(lib().calls)
    after.subtract(before)
    return +after


def in_another_process(code: str) -> None:
    """Run ``code`` (with ``store`` bound to the state file) in a separate Python process."""
    subprocess.run([sys.executable, "-c", f"from migd.sim import world\nfrom migd.sim.state import StateStore\n"
                    f"store = StateStore({str(lib().store.path)!r})\n{code}"], check=True, cwd=REPO, timeout=60)


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[NvmlBackend]:
    m = Migctl(tmp_path, "dgx-h100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    backend = sim_backend(m.state, "dgx-h100")
    yield backend
    backend.close()


@pytest.mark.integration
def test_the_state_is_read_again_only_after_a_write(h100: NvmlBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = []
    path = str(lib().store.path)

    real = state_module.open_regular

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file) == path:
            reads.append(1)
        return real(file, *args, **kwargs)
    monkeypatch.setattr(state_module, "open_regular", counting_open)
    h100.list_gpus()
    assert h100.gpu_processes(3) == [] and not reads  # 100+ calls, no write: the file is not read
    in_another_process("world.start_process(store, 3, gi=7, ci=0)")  # another process writes
    assert [p.gi_id for p in h100.gpu_processes(3)] == [7] and len(reads) == 1  # seen at once, read once
    h100.list_gpus()
    assert len(reads) == 1


def test_a_page_found_readable_is_not_probed_again(h100: NvmlBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pointer check probes /proc/self/mem once per page, not on every call; an address in no
    page a buffer used (a struct passed by value) is still probed and refused."""
    probes: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        probes.append(offset)
        return real_pread(fd, n, offset)
    monkeypatch.setattr("migd.sim.cmem.os.pread", counting_pread)
    mem = lib().mem
    buf = ctypes.create_string_buffer(64)
    addr = ctypes.addressof(buf)
    assert mem.readable(addr, 64)
    assert probes in ([], [addr])  # probed now, or before if an earlier buffer lay in the same page
    n = len(probes)
    assert mem.readable(addr + 8, 16) and mem.readable(addr, 64) and len(probes) == n
    assert not mem.readable(0x100000001, 16) and not mem.readable(0x100000001, 16)  # size<<32 | start
    assert probes[n:] == [0x100000001, 0x100000001]
    h100.list_gpus()
    n = len(probes)
    h100.list_gpus()  # the same calls again: pynvml's buffers lie in pages probed the first time
    assert len(probes) - n < 10


@pytest.mark.integration
def test_an_idle_event_wait_sleeps_until_another_process_writes(h100: NvmlBackend,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    looks = []
    store = lib().store
    original = store.transaction
    monkeypatch.setattr(store, "transaction", lambda *a, **k: looks.append(1) or original(*a, **k))
    assert h100.wait_event(10) is None  # registers the event set
    looks.clear()
    t0 = time.monotonic()
    assert h100.wait_event(1000) is None
    assert time.monotonic() - t0 >= 0.95 and len(looks) <= 3  # polling every 20 ms looked ~50 times
    threading.Timer(0.3, in_another_process, args=("world.raise_xid(store, 5, 31, gi=7, ci=0)",)).start()
    t0 = time.monotonic()
    ev = h100.wait_event(10_000)
    assert ev is not None and (ev.gpu_index, ev.xid, ev.gi_id) == (5, 31, 7)
    assert time.monotonic() - t0 < 5  # woken by the write, not by the 10 s timeout


def test_a_sampling_cycle_reads_only_what_changes(h100: NvmlBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = Sampler(h100, threading.RLock(), lambda: {}, gpm_interval_s=0.1)
    waits: list[float] = []  # the GPM sleeps of the second cycle (its time would say so only on an idle machine)
    try:
        sampler.sample_once()  # opens every view: the layout read, first GPM samples
        time.sleep(0.15)
        before = Counter(lib().calls)
        monkeypatch.setattr(telemetry, "time", SimpleNamespace(monotonic=time.monotonic, sleep=waits.append))
        snap = sampler.sample_once()
        monkeypatch.undo()
        cycle = spent(before)
    finally:
        sampler.close()
    assert sum(len(g.instances) for g in snap.gpus) == 56
    # per GPU: MIG mode, one process listing; per MIG device: memory; per GPU instance: one GPM
    # sample and one metrics read; one device count
    assert cycle == Counter({"nvmlDeviceGetCount_v2": 1, "nvmlDeviceGetMigMode": 8,
                             "nvmlDeviceGetComputeRunningProcesses_v3": 8, "nvmlDeviceGetMemoryInfo": 56,
                             "nvmlGpmMigSampleGet": 56, "nvmlGpmMetricsGet": 56}), cycle
    assert waits == []  # the previous cycle's samples are old enough: no GPM wait


def test_a_sampling_cycle_on_gpus_with_mig_off_reuses_their_handles(tmp_path: Path) -> None:
    """Seen on a real H100 (MIG off, bench/sampler_probe.py): each cycle asked for the GPU's handle
    again before listing its processes; the view already holds it."""
    backend = sim_backend(tmp_path / "state.json", "dgx-h100")
    sampler = Sampler(backend, threading.RLock(), lambda: {})
    try:
        sampler.sample_once()
        before = Counter(lib().calls)
        snap = sampler.sample_once()
        cycle = spent(before)
    finally:
        sampler.close()
        backend.close()
    assert [g.info.mig_current for g in snap.gpus] == [False] * 8
    assert cycle == Counter({"nvmlDeviceGetCount_v2": 1, "nvmlDeviceGetMigMode": 8,
                             "nvmlDeviceGetComputeRunningProcesses_v3": 8}), cycle


def test_gpm_activity_spans_the_whole_interval_between_cycles(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-h100")
    assert m("apply", str(PROFILES / "night.yaml")).code == 0
    backend = sim_backend(m.state, "single-h100")
    store = StateStore(m.state)
    world.start_process(store, 0, gi=0, ci=0)  # a busy 7g: its GPM activity follows activity()
    gpu_uuid, start = store.read().gpus[0].uuid, store.read().gpus[0].gis[0].start
    ticks = iter(range(1000, 100_000, 100))  # the GPU's clock: each GPM sample reads it once
    lib().clock = lambda: float(next(ticks))
    sampler = Sampler(backend, threading.RLock(), lambda: {}, gpm_interval_s=0.0)
    try:
        first = sampler.sample_once().gpus[0].instances[0].activity
        second = sampler.sample_once().gpus[0].instances[0].activity
    finally:
        sampler.close()
        backend.close()
        lib().clock = time.time

    def mean_sm(t0: float, t1: float) -> float:  # SM activity is 0.9 x the instance's busy ratio
        n = 2000
        return 0.9 * sum(activity(gpu_uuid, start, t0 + (t1 - t0) * (k + 0.5) / n) for k in range(n)) / n
    assert first is not None and second is not None
    assert math.isclose(first.sm_active or 0, mean_sm(1000, 1100), abs_tol=1e-3)  # sample at open, then one
    assert math.isclose(second.sm_active or 0, mean_sm(1100, 1200), abs_tol=1e-3)  # from the last to a new one


def test_the_fault_watch_remembers_processes_with_one_listing_per_gpu(h100: NvmlBackend) -> None:
    world.start_process(lib().store, 2, gi=9, ci=0)
    watch = FaultWatch(h100, threading.RLock(), EventCounters(), FaultMarks())
    watch.remember()  # first: learns the UUIDs
    before = Counter(lib().calls)
    watch.remember()
    assert sum(spent(before).values()) <= 3 * 8 + 1  # handle, listing (twice if any): was 465, every MIG device
    assert watch._procs[2] == {9: {5_000_001}}


def test_profile_tables_are_read_once_per_mig_mode(make_backend: Any) -> None:
    backend, _, _ = make_backend("single-a100", mig_enabled=True)
    gi = backend.create_gpu_instance(0, 19, Placement(0, 1))
    backend.create_compute_instance(0, gi, 0)
    backend.list_gpu_instances(0)
    before = Counter(lib().calls)
    assert [g.placement for g in backend.list_gpu_instances(0)] == [Placement(0, 1)]
    again = spent(before)
    assert not {k for k in again if "ProfileInfo" in k}, again  # immutable for the MIG mode's lifetime
    backend.destroy_compute_instance(0, gi, 0)
    backend.destroy_gpu_instance(0, gi)
    assert backend.set_mig_mode(0, False)
    assert backend.set_mig_mode(0, True)
    backend.create_gpu_instance(0, 19, Placement(2, 1))
    before = Counter(lib().calls)
    backend.list_gpu_instances(0)
    assert spent(before)["nvmlDeviceGetGpuInstanceProfileInfoV"] > 0  # a new MIG mode: read afresh

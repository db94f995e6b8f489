"""One thread samples NVML; scrapes only ever read its last snapshot.

So a scrape never calls NVML and never waits for an apply.  The sampler takes the
daemon's reconfiguration lock while it reads, so it never sees a half-applied layout.
Per-instance activity comes from GPM on Hopper and newer (two samples >= 100 ms apart);
on Ampere NVML has no per-instance utilization under MIG, so those series are absent and
``activity_source="none"`` says why; migd never exports a made-up 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from migd.hardware.backend import GpmMetrics, GpuBackend, GpuInfo, HardwareError
from migd.loop import BackgroundLoop

log = logging.getLogger("migd.sampler")


@dataclass(frozen=True)
class InstanceSample:
    gi_id: int
    ci_id: int
    profile: str
    placement_start: int
    placement_size: int
    mig_uuid: str
    owner: str
    memory_used_bytes: int
    memory_total_bytes: int
    processes: int
    activity: GpmMetrics | None  # None: no GPM on this GPU (Ampere) or the sample failed
    activity_source: str  # "gpm" | "none"


@dataclass(frozen=True)
class GpuSample:
    info: GpuInfo
    instances: tuple[InstanceSample, ...]
    processes: int  # on a non-MIG GPU


@dataclass(frozen=True)
class Unread:
    """A GPU this cycle could not read; the others were sampled as usual."""

    index: int
    lost: bool  # NVML said GPU_IS_LOST (fallen off the bus)
    error: str


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    duration_s: float
    gpus: tuple[GpuSample, ...]
    unread: tuple[Unread, ...] = ()


@dataclass
class NvmlErrorCounter:
    """Counts NVML errors by function and error name (fed by the backend's error callback)."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, fn: str, code: int) -> None:
        from migd.hardware.nvml import error_name
        with self._lock:
            self.counts[(fn, error_name(code))] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)


class Sampler(BackgroundLoop):
    thread_name = "migd-sampler"

    def __init__(self, backend: GpuBackend, lock: Any, owners: Callable[[], dict[str, dict[int, str]]],
                 interval_s: float = 15.0, gpm_interval_s: float = 0.1) -> None:
        super().__init__(log, "sampling")
        self.backend = backend
        self.lock = lock
        self.owners = owners
        self.interval_s = interval_s
        self.gpm_interval_s = gpm_interval_s
        self.snapshot: Snapshot | None = None
        self.last_success: float | None = None
        self.cycles = 0
        self.cpu_seconds_last = 0.0

    def sample_once(self) -> Snapshot:
        t0, c0 = time.monotonic(), time.process_time()  # process CPU: the per-GPU workers count too
        owners = self.owners()
        with self.lock:
            n = self.backend.gpu_count()
            with ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="migd-sample") as pool:
                results = list(pool.map(lambda i: self._try_gpu(i, owners), range(n)))
        samples = tuple(r for r in results if isinstance(r, GpuSample))
        unread = tuple(r for r in results if isinstance(r, Unread))
        snap = Snapshot(time.time(), time.monotonic() - t0, samples, unread)
        self.snapshot, self.last_success = snap, snap.taken_at
        self.cycles += 1
        self.cpu_seconds_last = time.process_time() - c0
        return snap

    def _try_gpu(self, index: int, owners: dict[str, dict[int, str]]) -> GpuSample | Unread:
        """One GPU's sample; a GPU that cannot be read (lost) leaves the others' series untouched."""
        try:
            g = self.backend.gpu(index)
            return self._gpu(g, owners.get(g.uuid, {}))
        except HardwareError as e:
            return Unread(index, e.lost, str(e))

    def _gpu(self, g: GpuInfo, owners: dict[int, str]) -> GpuSample:
        if not g.mig_current:
            return GpuSample(g, (), len(self.backend.gpu_processes(g.index)))
        gis = {gi.id: gi for gi in self.backend.list_gpu_instances(g.index)}
        devs = self.backend.list_mig_devices(g.index)
        activity: dict[int, GpmMetrics] = {}
        if g.model is not None and g.model.is_hopper_or_newer and gis and self.backend.gpm_supported(g.index):
            try:
                activity = self.backend.gpm_sample(g.index, sorted(gis), self.gpm_interval_s)
            except HardwareError as e:
                log.warning("GPU %d: GPM sample failed: %s", g.index, e)
        out = []
        for d in devs:
            gi = gis.get(d.gi_id)
            if gi is None:
                continue
            prof = g.model.profile_by_id(gi.profile_id) if g.model else None
            ci = next((c for c in gi.compute_instances if c.id == d.ci_id), None)
            cprof = prof.ci_by_id(ci.profile_id) if prof and ci else None
            act = activity.get(d.gi_id)
            out.append(InstanceSample(
                gi_id=d.gi_id, ci_id=d.ci_id, profile=cprof.name if cprof else (prof.name if prof else "?"),
                placement_start=gi.placement.start, placement_size=gi.placement.size, mig_uuid=d.uuid,
                owner=owners.get(gi.placement.start, ""), memory_used_bytes=d.memory_used_bytes,
                memory_total_bytes=d.memory_total_bytes, processes=len(d.processes), activity=act,
                activity_source="gpm" if act is not None else "none"))
        return GpuSample(g, tuple(out), 0)

    def step(self) -> float:
        self.sample_once()
        return self.interval_s

    def error_pause_s(self) -> float:
        return self.interval_s  # the last snapshot is kept; its timestamp shows it is stale

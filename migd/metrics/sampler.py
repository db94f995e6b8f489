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
from dataclasses import dataclass, field
from typing import Any

from migd.background import BackgroundLoop
from migd.hardware.inventory import Unreadable
from migd.hardware.ports import GpuView, ViewSource
from migd.hardware.types import GpmMetrics, GpuInfo, GpuInstance, HardwareError, MigDevice
from migd.metrics.snapshot import CiSample, GiSample, GpuSample, Snapshot
from migd.report import gpu_doc

log = logging.getLogger("migd.sampler")


@dataclass
class NvmlErrorCounter:
    """Counts NVML errors by function and error name (fed by the backend's error callback)."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, fn: str, error: str) -> None:
        with self._lock:
            self.counts[(fn, error)] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)


class Sampler(BackgroundLoop):
    """Reads each GPU's layout once (a :class:`GpuView`) and per cycle only what changes: the MIG
    mode, the GPU's processes, each MIG device's memory, one rolling GPM sample and metrics read per
    GPU instance (185 NVML calls for 8 GPUs x 7 instances instead of ~1,770).  ``invalidate`` (an
    apply, a MIG-config-change event) and any error or mode change make the next read of a GPU start
    afresh."""

    thread_name = "migd-sampler"

    def __init__(self, backend: ViewSource, lock: Any, owners: Callable[[], dict[str, dict[int, str]]],
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
        self._views: dict[int, GpuView] = {}
        self._stale = False  # read afresh: a layout may have changed (under _cycle)
        self._cycle = threading.Condition()  # a snapshot taken; guards the two counts below
        self._asked = 0  # invalidations asked for
        self._covered = 0  # of those, the ones the last snapshot began after
        self.on_snapshot: list[Callable[[Snapshot], None]] = []  # called in this thread after each cycle

    def invalidate(self, *_: object) -> None:
        """The layout may have changed: every GPU is read afresh, now rather than after the sampling
        interval, so the instance series (and owners' shares) follow an apply within a cycle's time."""
        with self._cycle:
            self._asked += 1
            self._stale = True
        self.wake()

    def current(self, wait_s: float) -> Snapshot | None:
        """The last snapshot, once it was taken after every invalidation asked for so far (a reader
        right after an apply sees its layout), waiting at most ``wait_s`` for that: never an NVML
        call of its own, so any number of readers cost NVML nothing."""
        with self._cycle:
            self._cycle.wait_for(lambda: self._covered >= self._asked and self.snapshot is not None, wait_s)
            return self.snapshot

    def close(self) -> None:
        with self.lock:
            self._drop_all()

    def _drop_all(self) -> None:
        for index in list(self._views):
            self._drop(index)

    def _drop(self, index: int) -> None:
        view = self._views.pop(index, None)
        if view is not None:
            try:
                self.backend.close_view(view)
            except HardwareError as e:
                log.warning("GPU %d: %s", index, e)

    def sample_once(self) -> Snapshot:
        """One cycle over every GPU, in this thread: the views are opened first (each takes its first
        GPM sample), so a cycle after a layout change waits for GPM once, not once per GPU."""
        t0, c0 = time.monotonic(), time.process_time()
        with self.lock:
            owners = self.owners()  # under the lock: an apply writes a new layout's owners before it lets go
            with self._cycle:  # every invalidation so far: this cycle reads afresh after it
                asked, stale, self._stale = self._asked, self._stale, False
            if stale:
                self._drop_all()
            n = self.backend.gpu_count()
            for index in [i for i in self._views if i >= n]:
                self._drop(index)
            opened = {i: self._open(i) for i in range(n) if i not in self._views}
            results = [self._try_gpu(i, owners, opened) for i in range(n)]
        samples = tuple(r for r in results if isinstance(r, GpuSample))
        unread = tuple(r for r in results if isinstance(r, Unreadable))
        snap = Snapshot(time.time(), time.monotonic() - t0, samples, unread)
        with self._cycle:
            self.snapshot, self.last_success = snap, snap.taken_at
            self._covered = max(self._covered, asked)
            self._cycle.notify_all()
        self.cycles += 1
        self.cpu_seconds_last = time.process_time() - c0
        return snap

    def _open(self, index: int) -> HardwareError | None:
        try:
            self._views[index] = self.backend.open_view(index)
            return None
        except HardwareError as e:
            return e

    def _try_gpu(self, index: int, owners: dict[str, dict[int, str]],
                 opened: dict[int, HardwareError | None]) -> GpuSample | Unreadable:
        """One GPU's sample; a GPU that cannot be read (lost) leaves the others' series untouched.
        An error with a view of an earlier cycle (a handle the layout invalidated) is retried once
        afresh; ``opened``: the views this cycle opened, or why one could not be."""
        error = opened.get(index)
        if error is not None:
            return Unreadable.of(index, error)
        cached = index not in opened
        try:
            return self._gpu(self._view(index, fresh=False), owners)
        except HardwareError as e:
            self._drop(index)
            if not cached or e.lost:
                return Unreadable.of(index, e)
        try:
            return self._gpu(self._view(index, fresh=True), owners)
        except HardwareError as e:
            self._drop(index)
            return Unreadable.of(index, e)

    def _view(self, index: int, fresh: bool) -> GpuView:
        view = self._views.get(index)
        if view is not None and not fresh:
            if self.backend.view_mode(view) == (view.info.mig_current, view.info.mig_pending):
                return view
            log.info("GPU %d: MIG mode changed; reading its layout afresh", index)
        self._drop(index)
        view = self._views[index] = self.backend.open_view(index)
        return view

    def _gpu(self, view: GpuView, owners_by_uuid: dict[str, dict[int, str]]) -> GpuSample:
        g = view.info
        if not g.mig_current:
            procs = self.backend.view_processes(view)  # MIG off: the view's handle
            return GpuSample(g, (), len(procs), gpu_doc(g, (), (), procs, {}))
        owners = owners_by_uuid.get(g.uuid, {})
        found = self.backend.view_devices(view)
        devices: dict[int, list[MigDevice]] = {}
        for d in found:
            devices.setdefault(d.gi_id, []).append(d)
        activity: dict[int, GpmMetrics] = {}
        if view.gpm:
            try:
                activity = self.backend.view_activity(view, self.gpm_interval_s)
            except HardwareError as e:
                log.warning("GPU %d: GPM sample failed: %s", g.index, e)
                self._drop(g.index)  # its buffers or handle may be stale: this GPU is read afresh next cycle
        return GpuSample(g, tuple(_gi_sample(g, gi, devices.get(gi.id, []), owners.get(gi.placement.start, ""),
                                             activity.get(gi.id)) for gi in view.instances), 0,
                         gpu_doc(g, view.instances, found, (), owners))

    def step(self) -> float:
        snap = self.sample_once()
        for callback in self.on_snapshot:
            callback(snap)
        return self.interval_s

    def error_pause_s(self) -> float:
        return self.interval_s  # the last snapshot is kept; its timestamp shows it is stale


def _gi_sample(g: GpuInfo, gi: GpuInstance, devices: list[MigDevice], owner: str,
               activity: GpmMetrics | None) -> GiSample:
    """One GI with its CIs; memory is the GI's, read through its first MIG device."""
    prof = g.model.profile_by_id(gi.profile_id) if g.model else None
    cis = []
    for d in devices:
        ci = next((c for c in gi.compute_instances if c.id == d.ci_id), None)
        cprof = prof.ci_by_id(ci.profile_id) if prof and ci else None
        cis.append(CiSample(d.ci_id, cprof.name if cprof else (prof.name if prof else "?"), d.uuid,
                            len(d.processes)))
    first = devices[0] if devices else None
    return GiSample(
        gi_id=gi.id, profile=prof.name if prof else "?", placement_start=gi.placement.start,
        placement_size=gi.placement.size, compute_slices=prof.slices if prof else 0,
        memory_slices=prof.memory_slices if prof else gi.placement.size, owner=owner,
        memory_used_bytes=first.memory_used_bytes if first else None,
        memory_total_bytes=first.memory_total_bytes if first else None, activity=activity,
        cis=tuple(cis))

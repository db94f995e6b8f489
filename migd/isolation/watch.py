"""Fault watch: NVML events on every GPU, attributed to instances, with isolation checks.

An Xid with a valid gpuInstanceId belongs to that instance; 0xFFFFFFFF means GPU-wide.
After an instance-scoped Xid the other instances of that GPU must still answer and keep
their processes; if one does not, MIG's isolation did not hold and a breach is recorded.
A GPU-wide fatal Xid marks the GPU unhealthy: reconfiguring it is refused until an
operator clears it (``migctl clear-fault GPU``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from migd.hardware.ports import GpuBackend
from migd.hardware.types import EventKind, GpuEvent, HardwareError
from migd.isolation.events import EventCounters
from migd.isolation.marks import FaultMarks
from migd.isolation.xids import FATAL_GPU_XIDS, FaultMark
from migd.loop import BackgroundLoop

log = logging.getLogger("migd.faults")


class FaultWatch(BackgroundLoop):
    thread_name = "migd-faults"
    join_timeout_s = 5.0

    def __init__(self, backend: GpuBackend, lock: Any, events: EventCounters, unhealthy: FaultMarks,
                 on_config_change: Callable[[], None] | None = None) -> None:
        super().__init__(log, "fault watch")
        self.backend = backend
        self.lock = lock
        self.events = events
        self.unhealthy = unhealthy  # the daemon's marks: set here, cleared by an operator
        self.on_config_change = on_config_change
        self._procs: dict[int, dict[int, set[int]]] = {}  # gpu -> gi -> pids, as last seen
        self._uuids: dict[int, str] = {}  # gpu index -> UUID, as last seen (a lost GPU tells none)
        self._last_remember = 0.0
        self.breaches: list[str] = []

    def remember(self) -> None:
        """Record which processes run in which instance, to tell later whether a fault took them.
        One process listing of the parent GPU per GPU (nvml.h nvmlProcessInfo_t: "If MIG is enabled,
        stores a valid GPU instance ID"), not a walk over every MIG device: this runs every 5 s."""
        with self.lock:
            for i in range(self.backend.gpu_count()):
                try:  # one GPU that cannot be read (lost) must not blind the watch on the others
                    self._uuid(i)
                    per: dict[int, set[int]] = {}
                    for p in self.backend.gpu_processes(i):
                        if p.gi_id is not None:
                            per.setdefault(p.gi_id, set()).add(p.pid)
                    self._procs[i] = per
                except HardwareError as e:
                    log.debug("GPU %d not read for the fault watch: %s", i, e)

    def _uuid(self, index: int) -> str:
        if index not in self._uuids:
            try:
                self._uuids[index] = self.backend.gpu(index).uuid
            except HardwareError:
                return f"GPU-index-{index}"
        return self._uuids[index]

    def handle(self, ev: GpuEvent) -> None:
        uuid = self._uuid(ev.gpu_index)
        now = time.time()
        xid = ev.xid if ev.kind is EventKind.XID else None
        self.events.event(ev.gpu_index, uuid, ev.kind.value, now, xid, ev.gi_id if xid is not None else None)
        if ev.kind is EventKind.MIG_CONFIG_CHANGE:
            if self.on_config_change is not None:
                self.on_config_change()
            return
        if ev.gi_id is None:
            log.error("GPU %d: GPU-wide Xid %s", ev.gpu_index, ev.xid)
            if ev.xid in FATAL_GPU_XIDS:
                self.unhealthy.mark(uuid, FaultMark(ev.xid or 0, now))
                log.critical("GPU %d marked unhealthy after Xid %s: reconfiguration refused until cleared",
                             ev.gpu_index, ev.xid)
            return
        log.error("GPU %d: Xid %s in GPU instance %d", ev.gpu_index, ev.xid, ev.gi_id)
        self._check_neighbours(ev)

    def _check_neighbours(self, ev: GpuEvent) -> None:
        before = self._procs.get(ev.gpu_index, {})
        with self.lock:
            try:
                health = self.backend.probe_mig_devices(ev.gpu_index)
                now_procs: dict[int, set[int]] = {}
                for d in self.backend.list_mig_devices(ev.gpu_index) if all(
                        v is None for v in health.values()) else []:
                    now_procs.setdefault(d.gi_id, set()).update(p.pid for p in d.processes)
            except HardwareError as e:
                health, now_procs = {}, {}
                log.error("GPU %d: cannot check instances after Xid: %s", ev.gpu_index, e)
        hurt = []
        for (gi, ci), err in sorted(health.items()):
            if gi == ev.gi_id:
                continue
            if err is not None:
                hurt.append(f"GI {gi}/CI {ci} stopped answering ({err})")
            elif now_procs and before.get(gi, set()) - now_procs.get(gi, set()):
                lost = sorted(before[gi] - now_procs.get(gi, set()))
                hurt.append(f"GI {gi} lost processes {lost}")
        if hurt:
            msg = f"GPU {ev.gpu_index}: Xid {ev.xid} in GI {ev.gi_id} affected other instances: " + "; ".join(hurt)
            log.critical("isolation breach: %s", msg)
            self.breaches.append(msg)
            self.events.breach(ev.gpu_index, self._uuid(ev.gpu_index))
        self.remember()

    def step(self) -> float:
        if time.monotonic() - self._last_remember > 5:
            self.remember()
            self._last_remember = time.monotonic()
        ev = self.backend.wait_event(500)  # blocks up to 500 ms: no pause needed between steps
        if ev is not None:
            self.handle(ev)
        return 0.0

    def start(self) -> None:
        self.remember()
        self._last_remember = time.monotonic()
        super().start()

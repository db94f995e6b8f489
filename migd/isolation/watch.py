"""Fault watch: NVML events on every GPU, attributed to instances, with isolation checks.

An Xid with a valid gpuInstanceId belongs to that instance; 0xFFFFFFFF means GPU-wide.
After an instance-scoped Xid the other instances of that GPU must still answer and keep
their processes; if one does not, MIG's isolation did not hold and a breach is recorded.
A GPU-wide fatal Xid marks the GPU unhealthy: reconfiguring it is refused until an
operator clears it (``migctl clear-fault GPU``).

The watch reads NVML (process listings, the neighbour probe) only under the daemon's hardware lock, so
it never reads a layout half made; but it never waits for that lock: an apply holds it through all its
changes, and a watch queued behind it read the next fatal Xid only once the apply had reconfigured the
GPU.  A reading the lock holds back is skipped (the process listing) or put off (a neighbour check,
with the processes as they were at its Xid) until the lock is free; the event wait itself needs no
lock.  An apply asks the watch to catch up before its first change (``FaultMarks.caught_up``): the
watch then waits for events without a timeout's delay and answers once none is pending.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from migd.background import BackgroundLoop
from migd.hardware.ports import GpuBackend
from migd.hardware.types import EventKind, GpuEvent, HardwareError
from migd.isolation.events import EventCounters
from migd.isolation.marks import FaultMarks
from migd.isolation.xids import FATAL_GPU_XIDS, FaultMark

log = logging.getLogger("migd.faults")
# One event wait when no apply waits for the watch to catch up: an apply's catch-up waits out the
# wait in progress (up to this long; was 500 ms, 0.2 s on average added to every change).
WAIT_MS = 100


@contextmanager
def _turn(lock: Any) -> Iterator[bool]:
    """The hardware lock if it is free now (True), else nothing (False): the watch never waits on it."""
    mine = bool(lock.acquire(blocking=False))
    try:
        yield mine
    finally:
        if mine:
            lock.release()


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
        # instance Xids whose neighbour check waits for the hardware lock, each with the processes before it
        self._deferred: list[tuple[GpuEvent, dict[int, set[int]]]] = []
        self._turns = threading.Condition()  # catch-up requests (apply threads) and their answers
        self._asked = self._answered = 0

    def remember(self) -> None:
        """Record which processes run in which instance, to tell later whether a fault took them.
        One process listing of the parent GPU per GPU (nvml.h nvmlProcessInfo_t: "If MIG is enabled,
        stores a valid GPU instance ID"), not a walk over every MIG device: this runs every 5 s."""
        with self.lock:
            self._remember_locked()

    def _remember_locked(self) -> None:
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
        self._deferred.append((ev, self._procs.get(ev.gpu_index, {})))
        self._check_deferred()

    def _check_deferred(self) -> None:
        """The neighbour checks, in order, while the hardware lock is free (the rest wait for a step
        that finds it free: an apply holds it through its changes)."""
        while self._deferred:
            with _turn(self.lock) as mine:
                if not mine:
                    return
                ev, before = self._deferred.pop(0)
                try:
                    health = self.backend.probe_mig_devices(ev.gpu_index)
                    now_procs: dict[int, set[int]] = {}
                    for d in self.backend.list_mig_devices(ev.gpu_index) if all(
                            v is None for v in health.values()) else []:
                        now_procs.setdefault(d.gi_id, set()).update(p.pid for p in d.processes)
                except HardwareError as e:
                    health, now_procs = {}, {}
                    log.error("GPU %d: cannot check instances after Xid: %s", ev.gpu_index, e)
            self._judge(ev, before, health, now_procs)
            self._last_remember = 0.0  # who runs where, read again at the next step

    def _judge(self, ev: GpuEvent, before: dict[int, set[int]], health: dict[tuple[int, int], str | None],
               now_procs: dict[int, set[int]]) -> None:
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

    def caught_up(self, timeout_s: float) -> bool:
        """Whether the watch read and handled, within ``timeout_s``, every event the driver delivered
        before this call (an apply thread asks, right before its first change)."""
        with self._turns:
            self._asked += 1
            asked = self._asked
        self.wake()  # (out of an error's pause)
        with self._turns:
            self._turns.wait_for(lambda: self._answered >= asked or self._stop.is_set(), timeout_s)
            return self._answered >= asked

    def step(self) -> float:
        self._check_deferred()
        if time.monotonic() - self._last_remember > 5:
            with _turn(self.lock) as mine:
                if mine:  # (else at the next step)
                    self._remember_locked()
                    self._last_remember = time.monotonic()
        with self._turns:
            asked = self._asked
        # blocks up to WAIT_MS (no pause needed between steps); at once while an apply waits to hear
        ev = self.backend.wait_event(0 if asked > self._answered else WAIT_MS)
        if ev is not None:
            self.handle(ev)
            return 0.0
        with self._turns:  # none pending: every event delivered before those requests is handled
            self._answered = max(self._answered, asked)
            self._turns.notify_all()
        return 0.0

    def start(self) -> None:
        """Listening once this returns: the event set is registered here, not at the thread's first wait
        (NVML delivers nothing from before a registration: an Xid in between was never seen)."""
        self.remember()
        self._last_remember = time.monotonic()
        try:
            self.backend.watch_events()
        except HardwareError as e:
            log.warning("fault watch: NVML events not registered at start (%s); registering at its first wait", e)
        self.unhealthy.read_by(self.caught_up)
        super().start()

    def stop(self) -> None:
        self.unhealthy.read_by(None)
        super().stop()
        with self._turns:  # an apply waiting to hear goes on with the marks set so far
            self._turns.notify_all()

"""What the running daemon knows about itself, live: where each GPU stands, the last apply, the
counts, the hold, the fault marks.  Written only by the daemon's decision loop (under its lock),
read by the control socket and the metrics collector through :meth:`Status.view`, which makes the
``migd.daemon/v1`` document (``migd.api.daemon``).  Times stay datetimes (or Unix times for metrics)
until written.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone, tzinfo
from typing import Any

from migd.api.access import AccessView
from migd.api.daemon import (
    Active,
    Applying,
    Blocked,
    DaemonDoc,
    Fault,
    GpuView,
    LastApply,
    Next,
    Outcome,
    Progress,
    Reason,
    SimClock,
)
from migd.api.demand import DemandView, Source
from migd.api.slurm import SlurmSnapshot
from migd.apply.result import ApplyResult, GpuStatus
from migd.isolation.marks import FaultMarks
from migd.state.override import Override
from migd.wire import to_json

# systemd's watchdog is fed while some part of migd made progress within this long (daemon/watchdog.py);
# every bounded wait (a Slurm command, a registration) must end sooner (the unit has WatchdogSec=120s).
WATCHDOG_STALL_S = 120.0


def outcome_of(result: ApplyResult) -> Outcome:
    """The one outcome an apply is counted as: its worst GPU's."""
    statuses = {r.status for r in result.results}
    for status, outcome in ((GpuStatus.FAILED, Outcome.FAILED), (GpuStatus.ROLLED_BACK, Outcome.ROLLED_BACK),
                            (GpuStatus.CANCELLED, Outcome.CANCELLED), (GpuStatus.BLOCKED, Outcome.BLOCKED),
                            (GpuStatus.FAULTED, Outcome.BLOCKED),
                            (GpuStatus.APPLIED, Outcome.SUCCESS)):
        if status in statuses:
            return outcome
    return Outcome.UNCHANGED


@dataclass
class GpuProgress:
    uuid: str
    progress: Progress
    since: float  # Unix time this progress began
    reason: str = ""
    logged: float = 0.0  # a wait: when it was last logged (start, change, then at a bounded rate)
    failures: int = 0  # failed: attempts in a row that failed (the backoff's count)
    failed_at: float | None = None  # failed: Unix time of the latest of them
    next_try: float | None = None  # failed: Unix time the change is tried again (the backoff's end)
    pids: tuple[int, ...] = ()  # waiting: the processes it waits for
    selected: bool = True  # False: the active profile does not select it (a manual profile for some GPUs)

    def view(self) -> GpuView:
        return GpuView(self.uuid, self.progress, self.since, self.reason or None, self.failures or None,
                       self.failed_at, self.next_try, self.pids or None, None if self.selected else False)


@dataclass
class ProfileTime:
    """Seconds each profile has been the applied one (``migd_profile_active_seconds_total``): the
    clock runs for the profile last found fully applied, from the moment it was found so."""

    seconds: dict[str, float] = field(default_factory=dict)
    current: str | None = None
    since: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def switch(self, profile: str | None, now: float | None = None) -> None:
        with self.lock:
            self._settle(time.monotonic() if now is None else now)
            self.current = profile

    def totals(self, now: float | None = None) -> dict[str, float]:
        with self.lock:
            self._settle(time.monotonic() if now is None else now)
            return dict(self.seconds)

    def _settle(self, now: float) -> None:
        if self.current is not None:
            self.seconds[self.current] = self.seconds.get(self.current, 0.0) + max(0.0, now - self.since)
        self.since = now


@dataclass
class Status:
    started: float = field(default_factory=time.time)
    config_path: str = ""
    timezone: tzinfo = timezone.utc  # the schedule's zone: local times are written in it
    desired_profile: str | None = None
    applied_profile: str | None = None
    override: Override | None = None
    next_transition: tuple[datetime, str] | None = None  # (when, profile)
    gpus: dict[int, GpuProgress] = field(default_factory=dict)  # GPU index -> progress
    last_apply: LastApply | None = None
    last_reload_error: str | None = None
    restart_needed: list[str] = field(default_factory=list)  # settings a reload changed but cannot apply
    apply_count: dict[Outcome, int] = field(default_factory=dict)
    unhealthy: FaultMarks = field(default_factory=FaultMarks)  # gpu uuid -> GPU-wide fault (fault watch)
    slurm: SlurmSnapshot | None = None  # Slurm mode: the node's switch state (migd.slurm/v2)
    demand: DemandView | None = None  # demand mode: which layout the node follows and why
    access: AccessView | None = None  # access by owner: to whom each owner's instances are open
    profile_names: tuple[str, ...] = ()  # the configured profiles (their time series start at 0)
    busy_timeout_s: float = 0.0  # how long a transition may wait for busy instances (config)
    profile_time: ProfileTime = field(default_factory=ProfileTime)
    applying: Applying | None = None  # a manual apply waiting for busy instances (replaced, never changed)
    clock: SimClock | None = None  # migd's own clock (--now, --time-scale), None on the wall clock

    def settle(self, profile: str) -> None:
        """Every GPU holds ``profile``: it is the applied one from now on."""
        if profile != self.applied_profile:
            self.profile_time.switch(profile)
        self.applied_profile = profile

    def with_progress(self, *kinds: Progress) -> dict[int, GpuProgress]:
        return {i: g for i, g in sorted(self.gpus.items()) if g.progress in kinds}

    @property
    def drifted(self) -> list[int]:
        """GPUs not in the active profile's layout (drift reported, waiting, a failed change, or left as they
        are for a fault mark: one is faulted only when the profile would change it)."""
        return sorted(self.with_progress(Progress.DRIFTED, Progress.WAITING, Progress.FAILED, Progress.FAULTED))

    @property
    def blocked_since(self) -> float | None:
        return min((g.since for g in self.with_progress(Progress.WAITING).values()), default=None)

    @property
    def blocked_reason(self) -> str | None:
        waits = self.with_progress(Progress.WAITING)
        return "; ".join(g.reason for g in waits.values()) or None  # each reason names its GPU

    def view(self) -> DaemonDoc:
        """``migd.daemon/v1`` now: ``active`` says which profile holds and why; ``next`` gives the next
        transition in UTC and in the schedule's time zone; ``gpus`` says where each GPU stands."""
        nxt = None
        if self.next_transition is not None:
            at, name = self.next_transition
            nxt = Next(name, at.isoformat(), at.astimezone(self.timezone).isoformat())
        o, waiting = self.override, self.with_progress(Progress.WAITING)
        last = self.last_apply
        return DaemonDoc(
            self.started, self.config_path, getattr(self.timezone, "key", str(self.timezone)), self._active(),
            self.desired_profile, self.applied_profile,
            None if o is None else o.view(),
            (nxt.at, nxt.profile) if nxt else None, nxt, tuple(self.drifted), self.blocked_since, self.blocked_reason,
            None if last is None else replace(last, seconds=round(last.seconds, 3)),
            {str(i): Blocked(g.since, g.reason) for i, g in waiting.items()},
            {str(i): g.view() for i, g in sorted(self.gpus.items())}, self.last_reload_error,
            tuple(self.restart_needed), {k.value: v for k, v in sorted(self.apply_count.items())},
            self.unhealthy_reasons(), self.slurm.view() if self.slurm else None, self.demand, self.access,
            self.applying, self.clock,
            self.faults())

    def _active(self) -> Active | None:
        if self.override is not None:
            held = self.override.view()
            return Active(held.profile, Reason.MANUAL, held.source, held.until, held.since)
        if self.demand is not None and self.demand.source is Source.PLANNER and self.desired_profile is not None:
            return Active(self.desired_profile, Reason.DEMAND, self.demand.planner, self.demand.until)
        if self.desired_profile is not None:
            return Active(self.desired_profile, Reason.SCHEDULE, None, None)
        return None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = to_json(self.view())
        return doc

    def unhealthy_reasons(self) -> dict[str, str]:
        return self.unhealthy.reasons()

    def faults(self) -> dict[str, Fault] | None:
        """The fault marks as numbers (None: none), for ``faults`` in migd.daemon/v1 and the isolation reply."""
        index = {g.uuid: i for i, g in self.gpus.items()}
        return {u: Fault(m.xid, m.at, index.get(u)) for u, m in self.unhealthy.snapshot().items()} or None

"""What the daemon knows about itself, and its wire format ``migd.daemon/v1``.

Read by the control socket (``migctl daemon``) and the metrics collector; written only by the
daemon's decision loop.  Times stay datetimes (or Unix times for metrics) until written.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, ClassVar

from migd.api.access import AccessView
from migd.api.demand import DemandView, Source
from migd.api.override import HeldView, Override
from migd.api.plan import SignalSent
from migd.api.slurm import SlurmSnapshot, SlurmView
from migd.api.wire import OMIT_NONE, to_json
from migd.apply.result import ApplyResult, GpuStatus
from migd.isolation.marks import FaultMarks
from migd.kinds import Word

SCHEMA = "migd.daemon/v1"
# systemd's watchdog is fed while some part of migd made progress within this long (daemon/watchdog.py);
# every bounded wait (a Slurm command, a registration) must end sooner (the unit has WatchdogSec=120s).
WATCHDOG_STALL_S = 120.0


class Outcome(Word):
    """One apply attempt, as counted in ``migd_applies_total{result}``."""

    SUCCESS = "success"
    UNCHANGED = "unchanged"  # a manual apply that found every GPU already as asked
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    BLOCKED = "blocked"  # busy instances held back some or all GPUs (refused, or waiting): not a failure
    CANCELLED = "cancelled"  # stopped on request (migctl's Ctrl-C, SIGTERM): GPUs put back, not a failure
    ERROR = "error"  # refused before any GPU changed (plan, lock, hook, hardware)

    @property
    def failed(self) -> bool:
        """What pages (``MigdApplyFailed``): a change that failed or was refused by an error.  A blocked
        or cancelled apply did what the busy policy or the operator asked."""
        return self in (Outcome.FAILED, Outcome.ROLLED_BACK, Outcome.ERROR)


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


class Progress(Word):
    """Where one GPU stands against the active profile."""

    CONVERGED = "converged"
    DRIFTED = "drifted"  # differs, and reconcile: report leaves it
    WAITING = "waiting"  # its change waits for busy instances
    FAILED = "failed"  # its last change was rolled back or failed
    FAULTED = "faulted"  # a GPU-wide fault mark refuses reconfiguration
    LOST = "lost"  # NVML says GPU_IS_LOST: fallen off the bus, until a reset or reboot
    UNREADABLE = "unreadable"  # another NVML error while reading it; tried again next pass


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


@dataclass(frozen=True)
class LastApply:
    """``result`` is the apply's worst GPU's, as counted in ``migd_applies_total``; what it did per GPU is
    in the fields added in v1 (left out when unknown): ``trigger`` (``start``, ``transition``, ``reconcile``,
    ``retry``, ``manual``, ``resume``, ``reload``), ``changed`` (GPUs it changed), ``waiting`` (GPU -> the
    PIDs it was left waiting for) and ``signalled`` (the signals ``force`` sent)."""

    time: float
    result: Outcome
    seconds: float
    profile: str | None
    trigger: str | None = field(default=None, metadata=OMIT_NONE)
    changed: int | None = field(default=None, metadata=OMIT_NONE)
    waiting: dict[str, tuple[int, ...]] | None = field(default=None, metadata=OMIT_NONE)
    signalled: tuple[SignalSent, ...] | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class Applying:
    """A manual apply in progress (``migctl apply`` through migd), while it waits for busy instances:
    what, from where, since when (Unix time), its busy policy, the GPUs it waits for (index -> PIDs) and
    when that wait ends (Unix time: refused with ``wait``, the processes stopped with ``force``)."""

    profile: str
    source: str
    since: float
    on_busy: str
    waiting: dict[str, tuple[int, ...]]
    until: float | None


@dataclass(frozen=True)
class SimClock:
    """A clock of migd's own (``--now``, ``--time-scale``: demo, tests): at Unix time ``real`` it read
    ``at`` (ISO 8601), and it runs ``scale`` times as fast.  Every Unix time in the document is real; this
    turns one into migd's clock (the schedule's, as ``next`` and ``active.until`` are)."""

    at: str
    real: float
    scale: float

    def of(self, epoch: float) -> datetime:
        return datetime.fromisoformat(self.at) + timedelta(seconds=(epoch - self.real) * self.scale)


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
        """GPUs not in the active profile's layout (drift reported, waiting, or a failed change)."""
        return sorted(self.with_progress(Progress.DRIFTED, Progress.WAITING, Progress.FAILED))

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
            self.applying, self.clock)

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


class Reason(Word):
    """Why the active profile holds."""

    SCHEDULE = "schedule"
    MANUAL = "manual"  # migctl apply through migd, until the next transition (or migctl resume)
    DEMAND = "demand"  # the demand planner's want, its lease running


@dataclass(frozen=True)
class Active:
    """``until``: a manual apply's end as an ISO time, a demand want's lease as a Unix time; ``since``:
    when a manual apply was made (manual only)."""

    profile: str
    reason: Reason
    source: str | None  # manual: the profile's file; demand: the planner node
    until: str | float | None
    since: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class Next:
    profile: str
    at: str  # UTC, ISO 8601
    local: str  # in the schedule's time zone


@dataclass(frozen=True)
class Blocked:
    since: float
    reason: str


@dataclass(frozen=True)
class GpuView:
    """``failures``, ``failed_at`` and ``next_try`` only for a failed GPU waiting out its backoff (added in
    v1 with the backoff; left out otherwise); ``pids`` only for a GPU waiting for busy instances: the
    processes it waits for; ``selected`` (false) only for a GPU the active profile does not select, left
    as it is (both added in v1)."""

    uuid: str
    state: Progress
    since: float
    reason: str | None
    failures: int | None = field(default=None, metadata=OMIT_NONE)
    failed_at: float | None = field(default=None, metadata=OMIT_NONE)
    next_try: float | None = field(default=None, metadata=OMIT_NONE)
    pids: tuple[int, ...] | None = field(default=None, metadata=OMIT_NONE)
    selected: bool | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class DaemonDoc:
    """``migd.daemon/v1``, as ``migctl daemon -o json`` gives it.  Fields are only ever added within v1;
    ``override``, ``next_transition`` and ``blocked_gpus`` repeat what ``active``, ``next`` and ``gpus``
    say, for v1's first readers (docs/migctl.md)."""

    SCHEMA: ClassVar[str] = SCHEMA
    started: float
    config_path: str
    timezone: str
    active: Active | None
    desired_profile: str | None
    applied_profile: str | None
    override: HeldView | None
    next_transition: tuple[str, ...] | None  # [at, profile]
    next: Next | None
    drift_gpus: tuple[int, ...]
    blocked_since: float | None
    blocked_reason: str | None
    last_apply: LastApply | None
    blocked_gpus: dict[str, Blocked]
    gpus: dict[str, GpuView]
    last_reload_error: str | None
    restart_needed: tuple[str, ...]
    apply_count: dict[str, int]
    unhealthy: dict[str, str]
    slurm: SlurmView | None
    demand: DemandView | None
    access: AccessView | None = None  # (added in v1 with access by owner; older migd leaves it out)
    applying: Applying | None = field(default=None, metadata=OMIT_NONE)  # (added in v1: a manual apply waiting)
    clock: SimClock | None = field(default=None, metadata=OMIT_NONE)  # (added in v1: only on a clock of migd's own)

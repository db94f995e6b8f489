"""What the daemon knows about itself, and its wire format ``migd.daemon/v1``.

Read by the control socket (``migctl daemon``) and the metrics collector; written only by the
daemon's decision loop.  Times stay datetimes (or Unix times for metrics) until written.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from typing import Any

from migd.api.demand import DemandView, Source
from migd.api.override import Override
from migd.api.slurm import SlurmSnapshot
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

    def to_json(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "state": self.progress.value, "since": self.since, "reason": self.reason or None}


@dataclass(frozen=True)
class LastApply:
    time: float
    result: Outcome
    seconds: float
    profile: str | None

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "result": self.result.value, "seconds": round(self.seconds, 3),
                "profile": self.profile}


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
    profile_names: tuple[str, ...] = ()  # the configured profiles (their time series start at 0)
    busy_timeout_s: float = 0.0  # how long a transition may wait for busy instances (config)
    profile_time: ProfileTime = field(default_factory=ProfileTime)

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

    def to_json(self) -> dict[str, Any]:
        """``migd.daemon/v1``, written field by field: fields are only ever added within v1.

        ``active`` says which profile holds and why; ``next`` gives the next transition in UTC and
        in the schedule's time zone; ``gpus`` says where each GPU stands."""
        tz, nxt = self.timezone, None
        if self.next_transition is not None:
            at, name = self.next_transition
            nxt = {"profile": name, "at": at.isoformat(), "local": at.astimezone(tz).isoformat()}
        active = None
        if self.override is not None:
            active = {"profile": self.override.profile.name, "reason": "manual", **self.override.to_json()}
        elif self.demand is not None and self.demand.source is Source.PLANNER and self.desired_profile is not None:
            active = {"profile": self.desired_profile, "reason": "demand", "source": self.demand.planner,
                      "until": self.demand.until}
        elif self.desired_profile is not None:
            active = {"profile": self.desired_profile, "reason": "schedule", "source": None, "until": None}
        waiting = self.with_progress(Progress.WAITING)
        return {
            "schema": SCHEMA, "started": self.started, "config_path": self.config_path,
            "timezone": getattr(tz, "key", str(tz)), "active": active, "desired_profile": self.desired_profile,
            "applied_profile": self.applied_profile,
            "override": self.override.to_json() if self.override else None,
            "next_transition": [nxt["at"], nxt["profile"]] if nxt else None, "next": nxt,
            "drift_gpus": self.drifted,
            "blocked_since": self.blocked_since, "blocked_reason": self.blocked_reason,
            "last_apply": self.last_apply.to_json() if self.last_apply else None,
            "blocked_gpus": {str(i): {"since": g.since, "reason": g.reason} for i, g in waiting.items()},
            "gpus": {str(i): g.to_json() for i, g in sorted(self.gpus.items())},
            "last_reload_error": self.last_reload_error, "restart_needed": list(self.restart_needed),
            "apply_count": {k.value: v for k, v in sorted(self.apply_count.items())},
            "unhealthy": self.unhealthy_reasons(), "slurm": self.slurm.to_json() if self.slurm else None,
            "demand": self.demand.to_json() if self.demand else None}

    def unhealthy_reasons(self) -> dict[str, str]:
        return self.unhealthy.reasons()

"""The daemon's brain: keep every GPU in the layout the schedule says is active now.

The loop is level-triggered: each pass works out the active profile from the latest past
fire time (never from "a transition just fired"), so a transition missed while the node
was down, blocked or asleep is applied at the next pass, and one that already holds is a
no-op: none is skipped and none is applied twice.  Drift (a hand-made change, a reset, a
reboot) is the same computation, corrected or only reported as configured.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any

from migd.apply.executor import Applier, ApplyOptions, ApplyResult, BusyError, GpuUnhealthy
from migd.apply.hooks import HookError
from migd.apply.lock import LockBusy
from migd.daemon.config import Config
from migd.daemon.sdnotify import Notifier
from migd.hardware.backend import GpuBackend, HardwareError
from migd.isolation.audit import Finding, audit
from migd.planner import GpuPlan, PlanError
from migd.profiles.model import Profile
from migd.yamlsrc import ValidationError

log = logging.getLogger("migd")
UTC = timezone.utc


class Clock:
    """Wall clock, optionally started at ``start`` and running ``scale`` times faster (demo, tests)."""

    def __init__(self, start: datetime | None = None, scale: float = 1.0) -> None:
        self._real0 = time.time()
        self._virt0 = (start or datetime.now(UTC)).astimezone(UTC)
        self._start = self._virt0
        self.scale = scale

    def restart(self) -> None:
        """Count from here: with a scaled clock, start-up time must not eat virtual time."""
        if self.scale != 1.0:
            self._virt0, self._real0 = self._start, time.time()

    def now(self) -> datetime:
        return self._virt0 + timedelta(seconds=(time.time() - self._real0) * self.scale)

    def real(self, virtual_s: float) -> float:
        return virtual_s / self.scale


@dataclass(frozen=True)
class Override:
    """A manual apply, holding until the next scheduled transition (``until``; None: no more)."""

    profile: Profile  # as applied, even if a configured profile has its name
    until: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile.name, "source": self.profile.source,
                "until": self.until.isoformat() if self.until else None}


@dataclass
class Blocked:
    """A GPU whose change waits for busy instances (the other GPUs went ahead)."""

    since: float
    reason: str
    logged: float  # when the wait was last logged: at its start, on a change, then at a bounded rate


@dataclass
class Status:
    """What the daemon knows about itself; read by the control socket and the metrics collector."""

    started: float = field(default_factory=time.time)
    config_path: str = ""
    desired_profile: str | None = None
    applied_profile: str | None = None
    override: Override | None = None
    next_transition: tuple[str, str] | None = None  # (UTC ISO time, profile)
    drift_gpus: list[int] = field(default_factory=list)
    blocked_since: float | None = None
    blocked_reason: str | None = None
    last_apply: dict[str, Any] | None = None
    last_reload_error: str | None = None
    apply_count: dict[str, int] = field(default_factory=dict)  # result -> count
    unhealthy: dict[str, str] = field(default_factory=dict)  # gpu uuid -> reason (fault watch)
    timezone: tzinfo = UTC  # the schedule's zone: local times are written in it
    blocked: dict[int, Blocked] = field(default_factory=dict)  # GPU index -> what it waits for

    def to_json(self) -> dict[str, Any]:
        """``migd.daemon/v1``, written field by field: fields are only ever added within v1.

        ``active`` says which profile holds and why; ``next`` gives the next transition in UTC and
        in the schedule's time zone."""
        tz, nxt = self.timezone, None
        if self.next_transition is not None:
            at = datetime.fromisoformat(self.next_transition[0])
            nxt = {"profile": self.next_transition[1], "at": at.isoformat(), "local": at.astimezone(tz).isoformat()}
        active = None
        if self.override is not None:
            active = {"profile": self.override.profile.name, "reason": "manual", **self.override.to_json()}
        elif self.desired_profile is not None:
            active = {"profile": self.desired_profile, "reason": "schedule", "source": None, "until": None}
        return {
            "schema": "migd.daemon/v1", "started": self.started, "config_path": self.config_path,
            "timezone": getattr(tz, "key", str(tz)), "active": active, "desired_profile": self.desired_profile,
            "applied_profile": self.applied_profile,
            "override": self.override.to_json() if self.override else None,
            "next_transition": list(self.next_transition) if self.next_transition else None, "next": nxt,
            "drift_gpus": list(self.drift_gpus), "blocked_since": self.blocked_since,
            "blocked_reason": self.blocked_reason, "last_apply": self.last_apply,
            "blocked_gpus": {str(i): {"since": b.since, "reason": b.reason} for i, b in sorted(self.blocked.items())},
            "last_reload_error": self.last_reload_error, "apply_count": dict(self.apply_count),
            "unhealthy": dict(self.unhealthy)}


@dataclass(frozen=True)
class ManualApply:
    """What migctl may choose for an apply the daemon does on its behalf (hooks stay the daemon's)."""

    on_busy: str = "refuse"
    dry_run: bool = False
    busy_timeout_s: float | None = None  # None: the daemon's busy_timeout
    lock_timeout_s: float = 30.0
    parallel: bool = True

    @classmethod
    def from_request(cls, req: dict[str, Any]) -> ManualApply:
        """Checked values from a control-socket request; ValueError names a bad one."""
        on_busy = req.get("on_busy", "refuse")
        if on_busy not in ("refuse", "wait", "force"):
            raise ValueError(f"on_busy {on_busy!r}")
        numbers = {k: req.get(k) for k in ("busy_timeout_s", "lock_timeout_s")}
        for k, v in numbers.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise ValueError(f"{k} {v!r}")
        return cls(on_busy=on_busy, dry_run=bool(req.get("dry_run")), busy_timeout_s=numbers["busy_timeout_s"],
                   lock_timeout_s=30.0 if numbers["lock_timeout_s"] is None else float(numbers["lock_timeout_s"]),
                   parallel=bool(req.get("parallel", True)))


class Daemon:
    def __init__(self, config: Config, backend: GpuBackend, state_dir: Path, clock: Clock,
                 notifier: Notifier | None = None,
                 reload_config: Callable[[], Config] | None = None) -> None:
        self.config = config
        self.backend = backend
        self.applier = Applier(backend, state_dir)
        self.clock = clock
        self.notifier = notifier or Notifier("")
        self._reload_config = reload_config
        self.status = Status(config_path=config.path, timezone=config.timezone)
        self.lock = threading.RLock()  # the reconfiguration lock: the sampler and control socket share it
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.reload_requested = threading.Event()
        self.cancel = threading.Event()  # SIGTERM: stop waiting, roll back the step in progress
        self.config_changed = threading.Event()  # NVML reported a MIG config change: look for drift now
        self.audit_findings: list[Finding] = []
        self.on_apply: list[Callable[[ApplyResult | None, str, float], None]] = []

    # -- decisions --------------------------------------------------------------------------------
    def desired(self) -> Profile | None:
        now = self.clock.now()
        ov = self.status.override
        if ov is not None:
            if ov.until is None or now < ov.until:
                return ov.profile
            log.info("manual override of %s ended at the scheduled transition", ov.profile.name)
            self.status.override = None
        entry = self.config.schedule.active(now)
        return self.config.profiles[entry.profile] if entry else None

    def _options(self, on_busy: str) -> ApplyOptions:
        return ApplyOptions(on_busy=on_busy, busy_timeout_s=0.0, hooks=self.config.hooks,
                            lock_timeout_s=30.0, cancel=self.cancel,
                            unhealthy=lambda: dict(self.status.unhealthy))

    def reconcile(self, reason: str) -> None:
        # The decision is taken under the reconfiguration lock: a manual apply holding it publishes
        # its override before releasing it, so its own MIG-config-change events cannot make this
        # pass re-apply the scheduled profile (undo) and the next one the override (redo).
        with self.lock:
            profile = self.desired()
            nxt = self.config.schedule.next_fire(self.clock.now())
            self.status.next_transition = (nxt[0].isoformat(), nxt[1].profile) if nxt else None
            if profile is None:
                log.info("no schedule entry has fired yet; leaving GPUs as they are")
                return
            if self.status.desired_profile != profile.name:
                log.info("profile %s is now active (%s)", profile.name, reason)
            self.status.desired_profile = profile.name
            try:
                plans = self.applier.plan(profile)
            except (ValidationError, PlanError, HardwareError) as e:
                self._record(None, "error", 0.0)
                log.error("cannot plan profile %s: %s", profile.name, e)
                return
            drift = [p.gpu.index for p in plans if p.changes]
            self.status.drift_gpus = drift
            self._audit(plans)
            if not drift:
                self._settled(profile.name)
                return
            if reason == "reconcile" and self.config.reconcile == "report":
                log.warning("drift from profile %s on GPU %s (reconcile: report, not corrected)",
                            profile.name, ",".join(map(str, drift)))
                return
            self._apply(profile, reason)

    def _apply(self, profile: Profile, reason: str) -> None:
        """Apply the active profile; each GPU goes as far as it can (busy ones wait, the rest change)."""
        on_busy = self.config.on_busy
        waited = time.time() - self.status.blocked_since if self.status.blocked_since else 0.0
        if on_busy == "force" and waited < self.clock.real(self.config.busy_timeout_s):
            on_busy = "refuse"  # force only after busy_timeout: give running work its chance first
        opts = self._options("refuse" if on_busy == "wait" else on_busy)
        opts.partial = True
        t0 = time.monotonic()
        try:
            result = self.applier.apply(profile, opts)
        except (BusyError, GpuUnhealthy, HookError, LockBusy, HardwareError, ValidationError, PlanError) as e:
            log.error("apply of %s failed: %s", profile.name, e)
            self._record(None, "error", time.monotonic() - t0)
            return
        self._track_blocked(profile.name, result)
        changed = any(r.status not in ("unchanged", "blocked") for r in result.results)
        if changed or result.ok:  # a retry that finds the same GPUs still busy is not another apply
            self._finish(profile, result, reason, t0)

    def _track_blocked(self, name: str, result: ApplyResult) -> None:
        """Per-GPU waits: logged when they start or change, after busy_timeout at most every 10 min."""
        now = time.time()
        blocked = {r.index: r.error or "" for r in result.results if r.status == "blocked"}
        for i in sorted(set(self.status.blocked) - set(blocked)):
            log.info("GPU %d: no longer waits for busy instances", i)
            del self.status.blocked[i]
        timeout = self.clock.real(self.config.busy_timeout_s)
        for i, why in blocked.items():
            b = self.status.blocked.get(i)
            if b is None or b.reason != why:
                log.warning("GPU %d: transition to %s waits for busy instances: %s", i, name, why)
                self.status.blocked[i] = Blocked(b.since if b else now, why, now)
            elif now - b.since >= timeout and (b.logged < b.since + timeout or now - b.logged >= 600.0):
                log.error("GPU %d: transition to %s still blocked after busy_timeout (%gs): %s", i, name,
                          self.config.busy_timeout_s, why)
                b.logged = now
        self.status.blocked_since = min((b.since for b in self.status.blocked.values()), default=None)
        self.status.blocked_reason = "; ".join(f"GPU {i}: {b.reason}" for i, b in
                                               sorted(self.status.blocked.items())) or None

    def _finish(self, profile: Profile, result: ApplyResult, reason: str, t0: float) -> None:
        """Count, log and audit one apply, scheduled or manual alike."""
        statuses = {r.status for r in result.results}
        outcome = ("failed" if "failed" in statuses else "rolled_back" if "rolled_back" in statuses
                   else "blocked" if "blocked" in statuses else "success")
        self._record(result, outcome, time.monotonic() - t0)
        for r in result.results:
            if r.status in ("rolled_back", "failed"):
                log.error("GPU %d: %s applying %s: %s", r.index, r.status, profile.name, r.error)
        if result.ok:
            self._settled(profile.name)
            log.info("applied profile %s (%s) in %.2fs", profile.name, reason, result.seconds)
        try:
            self._audit(self.applier.plan(profile))
        except (ValidationError, PlanError, HardwareError) as e:
            log.error("post-apply audit failed: %s", e)

    def _audit(self, plans: list[GpuPlan]) -> None:
        try:
            findings = audit(self.backend, {p.gpu.index: p for p in plans})
        except HardwareError as e:
            log.error("isolation audit failed: %s", e)
            return
        old = {(f.gpu, f.check, f.message) for f in self.audit_findings}
        for f in findings:
            if f.severity == "error" and (f.gpu, f.check, f.message) not in old:
                log.error("isolation audit: %s", f.message)
        self.audit_findings = findings

    def _settled(self, name: str) -> None:
        """Every GPU holds the layout: nothing drifts, nothing waits any more."""
        self.status.applied_profile = name
        self.status.drift_gpus = []
        if self.status.blocked:
            log.info("no GPU waits for busy instances any more")
        self.status.blocked.clear()
        self.status.blocked_since = self.status.blocked_reason = None
        self.notifier.status(f"profile {name} applied")

    def _record(self, result: ApplyResult | None, outcome: str, seconds: float) -> None:
        self.status.apply_count[outcome] = self.status.apply_count.get(outcome, 0) + 1
        self.status.last_apply = {"time": time.time(), "result": outcome, "seconds": round(seconds, 3),
                                  "profile": result.profile if result else self.status.desired_profile}
        for cb in self.on_apply:
            cb(result, outcome, seconds)

    def drift_suspected(self) -> None:
        """NVML reported a MIG configuration change: check for drift now, not at the next interval."""
        self.config_changed.set()
        self.wake.set()

    # -- requests from the control socket -------------------------------------------------------
    def manual_apply(self, profile: Profile, req: ManualApply) -> ApplyResult:
        """A hand-made apply holds until the next scheduled transition, then the schedule resumes.

        The override is published before the lock is released (see :meth:`reconcile`)."""
        with self.lock:
            opts = self._options(req.on_busy)
            opts.dry_run, opts.parallel, opts.lock_timeout_s = req.dry_run, req.parallel, req.lock_timeout_s
            opts.busy_timeout_s = self.config.busy_timeout_s if req.busy_timeout_s is None else req.busy_timeout_s
            t0 = time.monotonic()
            result = self.applier.apply(profile, opts)
            if req.dry_run:
                return result
            if result.ok:
                nxt = self.config.schedule.next_fire(self.clock.now())
                self.status.override = Override(profile, nxt[0] if nxt else None)
            self._finish(profile, result, "manual", t0)
        return result

    # -- lifecycle --------------------------------------------------------------------------------
    def reload(self) -> None:
        self.notifier.reloading()
        try:
            if self._reload_config is None:
                raise ValidationError(self.config.path, None, None, "", "reload is not available")
            new = self._reload_config()
        except (ValidationError, OSError) as e:
            self.status.last_reload_error = str(e)
            log.error("reload rejected, keeping the running configuration: %s", e)
            self.notifier.send("READY=1", f"STATUS=reload rejected: {e}")
            return
        self.config = new
        self.status.timezone = new.timezone
        self.status.last_reload_error = None
        log.info("configuration reloaded from %s (%d profiles)", new.path, len(new.profiles))
        self.notifier.send("READY=1", "STATUS=configuration reloaded")
        self.wake.set()

    def run(self) -> None:
        self.clock.restart()
        for r in self.applier.recover():
            log.warning("GPU %d: %s after an interrupted apply", r.index, r.status.replace("_", " "))
        self.reconcile("start")
        self.notifier.ready(f"profile {self.status.applied_profile or self.status.desired_profile or '-'}")
        last = time.monotonic()
        while not self.stop.is_set():
            self.wake.wait(self._sleep_s())
            self.wake.clear()
            if self.notifier.watchdog_interval_s:
                self.notifier.watchdog()
            if self.stop.is_set():
                break
            if self.reload_requested.is_set():
                self.reload_requested.clear()
                self.reload()
                self.reconcile("reload")
                last = time.monotonic()
                continue
            due = time.monotonic() - last >= self.clock.real(self.config.reconcile_interval_s)
            if self.config_changed.is_set():
                self.config_changed.clear()
                due = True
            nxt = self.status.next_transition
            fired = nxt is not None and self.clock.now() >= datetime.fromisoformat(nxt[0])
            blocked = self.status.blocked_since is not None
            if due or fired or blocked:
                self.reconcile("transition" if fired else "reconcile")
                last = time.monotonic()
        self.notifier.stopping()

    def _sleep_s(self) -> float:
        waits = [self.clock.real(self.config.reconcile_interval_s)]
        if self.notifier.watchdog_interval_s:
            waits.append(self.notifier.watchdog_interval_s)
        nxt = self.status.next_transition
        if nxt is not None:
            waits.append(self.clock.real((datetime.fromisoformat(nxt[0]) - self.clock.now()).total_seconds()))
        if self.status.blocked_since is not None:  # retry a blocked GPU, backing off from 1 s to 30 s
            waits.append(min(30.0, max(1.0, (time.time() - self.status.blocked_since) / 10)))
        return max(0.05, min(waits))

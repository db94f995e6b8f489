"""The daemon's brain: keep every GPU in the layout the schedule says is active now.

The loop is level-triggered: each pass works out the active profile from the latest past
fire time (never from "a transition just fired"), so a transition missed while the node
was down, blocked or asleep is applied at the next pass, and one that already holds is a
no-op: none is skipped and none is applied twice.  Drift (a hand-made change, a reset, a
reboot) is the same computation, corrected or only reported as configured.

Each pass decides once: under the reconfiguration lock and the apply lock it picks the
profile, reads and plans every GPU once, applies exactly that plan, and audits what the
apply read back.  A manual apply through the control socket is the same path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from migd.api.commands import DAEMON_LOCK_TIMEOUT_S, ManualApply
from migd.api.demand import Source
from migd.apply.executor import Applier
from migd.apply.result import ApplyOptions, ApplyResult, Flag, OnBusy
from migd.config.migdyaml import Config, ReconcileMode, restart_note, restart_only
from migd.config.schedule import Entry
from migd.daemon.accesspass import access_control
from migd.daemon.accesspass import view as access_view
from migd.daemon.account import in_flight
from migd.daemon.answers import Reloaded, Resumed, rejection
from migd.daemon.clock import Clock, iso_on
from migd.daemon.holds import hold, rehold
from migd.daemon.hwlock import HardwareLock
from migd.daemon.progress import Tracker
from migd.daemon.retry import Retries
from migd.daemon.sdnotify import Notifier
from migd.daemon.slurmpass import Lent, slurm_switch
from migd.daemon.transaction import REFUSALS, Parts, Transaction
from migd.daemon.wakeups import Events
from migd.daemon.watchdog import Heartbeat
from migd.errors import ValidationError
from migd.hardware.inventory import survey
from migd.hardware.ports import GpuBackend
from migd.isolation.audit import Finding
from migd.paths import StateFile
from migd.printable import clipped
from migd.profiles.model import Profile, describe_gpus
from migd.slurm.transition import GateHooks
from migd.state.live import Status
from migd.state.override import OverrideStore

__all__ = ["Clock", "Daemon", "ManualApply", "Reloaded", "Resumed"]
log = logging.getLogger("migd")


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
        self.overrides = OverrideStore(StateFile.OVERRIDE.at(Path(state_dir)))
        self.status = Status(config_path=config.path, timezone=config.timezone, override=self.overrides.load(),
                             profile_names=tuple(sorted(config.profiles)), busy_timeout_s=config.busy_timeout_s,
                             clock=clock.view())
        self.retries = Retries(clock.real)  # GPUs whose change failed: left alone until their next try
        self.progress = Tracker(self.status, lambda: self.clock.real(self.config.busy_timeout_s), self.retries.failure)
        self.heartbeat = Heartbeat()  # progress marks; the watchdog thread feeds systemd while they come
        self.lock = threading.RLock()  # the decision lock: one pass or control request at a time
        self.hw_lock = HardwareLock()  # NVML's turns: the sampler and fault watch share it; Slurm waits let go
        self.events = Events()  # what other threads tell the loop (signals, the control socket, the fault watch)
        self.slurm = slurm_switch(config, backend, self.applier, Path(state_dir), clock.now,
                                  Lent(GateHooks(self.heartbeat.beat, lambda: self.events.stopping),
                                       self.hw_lock.unheld))
        self.access = access_control(config, backend, self.applier)
        self.transaction = Transaction(Parts(
            self.applier, self.hw_lock, self.status, self.progress, self.retries, self.slurm, self.events,
            self.notifier, lambda: self.config, lambda: self.access, clock.real, self._hold))
        self.on_apply = self.transaction.p.on_apply  # (result, outcome, seconds) after every apply: metrics

    @property
    def audit_findings(self) -> list[Finding]:
        """The last isolation audit, of what the last pass or apply read back."""
        return self.transaction.findings

    # -- decisions --------------------------------------------------------------------------------
    def desired(self) -> Profile | None:
        now = self.clock.now()
        ov = self.status.override
        if ov is not None:
            if ov.until is None or now < ov.until:
                return ov.profile
            log.info("manual override of %s ended at the scheduled transition", ov.profile.name)
            self.status.override = None
            self.overrides.clear()
        demand = self.slurm.demand if self.slurm is not None else None
        if demand is not None:  # the planner's want while its lease runs; Slurm unreadable: no change
            self.status.demand = view = demand.follow(self.status.desired_profile)
            if view.profile is not None or view.source is Source.HELD:
                return demand.profile(view.profile, self.config.profiles) if view.profile else None
        entry = self.config.schedule.active(now)
        return self.config.profiles[entry.profile] if entry else None

    def _options(self, on_busy: OnBusy) -> ApplyOptions:
        return ApplyOptions(on_busy=on_busy, busy_timeout_s=0.0, hooks=self.config.hooks,
                            lock_timeout_s=DAEMON_LOCK_TIMEOUT_S, cancel=self.events.cancel,
                            progress=self.heartbeat.beat, faults=self.status.unhealthy, unheld=self.hw_lock.unheld)

    def _scheduled_options(self) -> ApplyOptions:
        """Busy GPUs wait (the others go ahead); force only after busy_timeout gave running work its chance."""
        on_busy = self.config.on_busy
        since = self.status.blocked_since
        waited = time.time() - since if since is not None else 0.0
        if on_busy is OnBusy.WAIT or (on_busy is OnBusy.FORCE and waited < self.clock.real(self.config.busy_timeout_s)):
            on_busy = OnBusy.REFUSE
        opts = self._options(on_busy)
        opts.partial = True
        return opts

    def reconcile(self, reason: str) -> None:
        with self.lock:
            try:
                self._reconcile(reason)
            finally:  # every pass (the start's first): capability nodes as owners' grants say
                if self.access is not None:
                    with self.hw_lock:
                        self.access.reconcile()
                    self.status.access = access_view(self.access)

    def _reconcile(self, reason: str) -> None:
        if self.slurm is not None and self.slurm.demand is not None:
            self.slurm.demand.plan(self.config.profiles, self.backend)
        profile = self.desired()
        nxt = self._derive_next()
        if self.slurm is not None:
            self.slurm.reserve_ahead(nxt[0] if nxt else None)
        self.retries.woke()
        if profile is None:
            log.info("no profile is active yet (no schedule entry has fired, or Slurm cannot say which the "
                     "demand planner wants); leaving GPUs as they are")
            self.retries.failures = {}  # (nothing is applied: no GPU waits for a retry)
            return
        if self.status.desired_profile != profile.name:
            if reason == "reconcile":  # the schedule moved on before its own trigger woke migd: its change
                reason = "transition"  # is a transition (applied in report mode too), never drift corrected
            log.info("profile %s is now active (%s)", profile.name, reason)
        self.status.desired_profile = profile.name
        correct = reason != "reconcile" or self.config.reconcile is ReconcileMode.CORRECT
        try:
            self.transaction.change(profile, reason, self._scheduled_options(), correct=correct)
        except REFUSALS:
            pass  # logged and counted by _change; the next pass tries again

    def _hold(self, profile: Profile) -> None:
        self.status.override = hold(self.overrides, profile, self._next_transition, self.clock.now())
        self.status.desired_profile = profile.name  # active now: the next pass has no news to log

    def _reschedule_hold(self) -> None:
        """All that is derived from the schedule, derived again (start, reload) before anyone is told."""
        self._derive_next()
        if self.status.override is not None:
            self.status.override = rehold(self.overrides, self.status.override, self._next_transition,
                                          self.clock.now())

    def _derive_next(self) -> tuple[datetime, Entry] | None:
        nxt = self.config.schedule.next_fire(self.clock.now())  # what status shows as the next transition
        self.status.next_transition = (nxt[0], nxt[1].profile) if nxt else None
        return nxt

    def _next_transition(self, now: datetime) -> datetime | None:
        return nxt[0] if (nxt := self.config.schedule.next_fire(now)) else None

    def drift_suspected(self) -> None:
        """NVML reported a MIG configuration change: check for drift now, not at the next interval."""
        self.events.config_changed()

    # -- requests from the control socket -------------------------------------------------------
    def clear_fault(self, gpu: str) -> list[str]:
        """An operator checked a GPU (index or UUID) and clears its fault mark: it may be reconfigured."""
        gpus = survey(self.backend).gpus
        uuids = [g.uuid for g in gpus if gpu in (str(g.index), g.uuid)]
        if not uuids:
            raise ValidationError("clear-fault", None, None, "GPU", f"no GPU {clipped(gpu)!r} on this node (it has "
                                  f"{describe_gpus(gpus)})")
        cleared = [u for u in uuids if self.status.unhealthy.clear(u)]
        log.warning("fault mark cleared on %s by an operator", ", ".join(cleared) or "nothing")
        if cleared:
            self.events.wake()
        return cleared

    def resume(self) -> Resumed:
        """Lift a manual apply's hold and return to the scheduled profile now, on the same planned,
        minimal path as a scheduled transition (busy GPUs wait for their instances as they would then)."""
        with self.lock:
            ov = self.status.override
            if ov is not None:
                log.warning("manual apply of %s lifted by an operator (migctl resume): back on the schedule",
                            ov.profile.name)
                self.status.override = None
                self.overrides.clear()
            profile = self.desired()
            lifted = ov.profile.name if ov else None
            if profile is None:
                return Resumed(lifted, None, None)
            self.status.desired_profile = profile.name
            return Resumed(lifted, profile.name, self.transaction.change(profile, "resume", self._scheduled_options()))

    def manual_apply(self, profile: Profile, req: ManualApply, abort: Flag | None = None) -> ApplyResult:
        """The same decision path as a scheduled change; the result holds until the next transition.
        ``abort``: set when the requester withdraws (migctl's Ctrl-C): every GPU is put back, nothing held."""
        with self.lock:
            opts = self._options(req.on_busy)
            opts.abort, opts.on_wait = abort, in_flight(self.status, profile, req.on_busy.value)
            opts.dry_run, opts.parallel, opts.lock_timeout_s = req.dry_run, req.parallel, req.lock_timeout_s
            opts.mode_only = req.mode_only
            opts.busy_timeout_s = self.config.busy_timeout_s if req.busy_timeout_s is None else req.busy_timeout_s
            try:
                return self.transaction.change(profile, "manual", opts, manual=True)
            finally:
                self.status.applying = None

    # -- lifecycle --------------------------------------------------------------------------------
    def reload(self) -> Reloaded:
        """Read the configuration and profiles again; a bad file is rejected and the old config kept."""
        self.notifier.reloading()
        try:
            if self._reload_config is None:
                raise ValidationError(self.config.path, None, None, "", "reload is not available")
            new = self._reload_config()
            access = access_control(new, self.backend, self.applier)  # (refused: the old one stays set)
        except Exception as e:  # noqa: BLE001 - the daemon serves on with what it has (answers.rejection)
            said = rejection(e)
            self.status.last_reload_error = said
            log.error("reload rejected, keeping the running configuration: %s", said)
            self.notifier.send("READY=1", f"STATUS=reload rejected: {said}")
            return Reloaded(said, "")
        stale = restart_only(self.config, new)
        if stale:
            log.warning("reloaded, but %s changed: that takes effect only after a restart (systemctl restart "
                        "migd)", ", ".join(stale))
        self.config = new
        self.access = access
        self._reschedule_hold()
        self.status.timezone = new.timezone
        self.status.profile_names, self.status.busy_timeout_s = tuple(sorted(new.profiles)), new.busy_timeout_s
        self.status.last_reload_error = None
        self.status.restart_needed = stale
        log.info("configuration reloaded (%s)", new.summary)
        self.notifier.send("READY=1", "STATUS=configuration reloaded" + restart_note(stale))
        self.events.wake()
        return Reloaded(None, new.summary + restart_note(stale))

    def reload_now(self) -> Reloaded:
        """``migctl reload``: done before the reply, so the operator learns whether it was accepted; the
        loop then decides on the new configuration as after SIGHUP."""
        with self.lock:
            done = self.reload()
        if done.error is None:  # (the loop woken by reload() itself may have looked already)
            self.events.reloaded()
        return done

    def start(self) -> None:
        """What the loop does once before its first wait: recover, take up a kept hold, first pass."""
        self.clock.restart()
        self.status.clock = self.clock.view()
        if self.status.clock is not None:  # migd's own clock starts here: "running since" is not before it
            self.status.started = max(self.status.started, self.status.clock.real)
            self.status.unhealthy.shown = iso_on(self.status.clock)  # a fault mark's words on it too
        try:
            for r in self.applier.recover():
                log.warning("GPU %d: %s after an interrupted apply", r.index, r.status.replace("_", " "))
        except REFUSALS as e:
            log.error("cannot recover an interrupted apply yet: %s", e)
        self._reschedule_hold()
        if self.slurm is not None:
            self.slurm.probe()
        if self.status.override is not None:
            ov = self.status.override
            log.info("manual apply of %s (%s) still holds until %s", ov.profile.name, ov.profile.source,
                     ov.until.isoformat() if ov.until else "no further scheduled transition")
        self.reconcile("start")
        self.notifier.ready(f"profile {self.status.applied_profile or self.status.desired_profile or '-'}")

    @property
    def slurm_pending(self) -> bool:
        """A Slurm switch ended and Slurm has not yet confirmed the node's resume (retried each pass)."""
        return self.slurm is not None and self.slurm.resuming

    @property
    def planning_due(self) -> bool:
        """This node plans for its partition (slurm.demand) and its interval has passed."""
        demand = self.slurm.demand if self.slurm is not None else None
        return demand is not None and demand.planning and demand.due()

"""One pass's change, as one transaction: read and plan every GPU once under the apply lock, apply exactly
that plan (through Slurm's drain and GRES on a Slurm node), then count, log and audit what the apply read
back.  A scheduled pass, a retry, ``migctl resume`` and a manual apply through the control socket all
come through :meth:`Transaction.change`; what to apply and with which options is the daemon's decision
(service.py), never this module's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from migd.access.enforce import AccessControl
from migd.api.daemon import LastApply, Outcome
from migd.apply.executor import Applier
from migd.apply.planning import touched
from migd.apply.result import ApplyOptions, ApplyResult, BusyError, GpuStatus
from migd.config.migdyaml import Config
from migd.daemon.accesspass import view as access_view
from migd.daemon.account import last_apply, say
from migd.daemon.hwlock import HardwareLock
from migd.daemon.progress import Tracker
from migd.daemon.retry import Choice, Retries, choose
from migd.daemon.sdnotify import Notifier
from migd.daemon.slurmpass import SlurmSwitch
from migd.daemon.wakeups import Events
from migd.exits import EXPECTED
from migd.hardware.inventory import Unreadable
from migd.hardware.types import GpuState
from migd.isolation.audit import Finding, Severity, audit_readings
from migd.plan.planner import GpuPlan
from migd.profiles.model import Profile
from migd.state.live import Status, outcome_of

log = logging.getLogger("migd")
# What stops one pass without stopping the daemon: the failures migctl reports as exit codes
# (OSError included: a full or read-only state dir).
REFUSALS = EXPECTED


@dataclass
class Parts:
    """What a change works with: the daemon's, passed as parts (``config`` and ``access`` as getters,
    since a reload replaces them; ``hold`` keeps a manual apply until the next transition)."""

    applier: Applier
    hw_lock: HardwareLock
    status: Status
    progress: Tracker
    retries: Retries
    slurm: SlurmSwitch | None
    events: Events
    notifier: Notifier
    config: Callable[[], Config]
    access: Callable[[], AccessControl | None]
    real: Callable[[float], float]  # seconds on migd's clock -> real seconds
    hold: Callable[[Profile], None]
    on_apply: list[Callable[[ApplyResult | None, Outcome, float], None]] = field(default_factory=list)


class Transaction:
    def __init__(self, parts: Parts) -> None:
        self.p = parts
        self.findings: list[Finding] = []  # the last isolation audit

    def change(self, profile: Profile, reason: str, opts: ApplyOptions, *, manual: bool = False,
               correct: bool = True) -> ApplyResult:
        """Read and plan every GPU once under the apply lock, then apply exactly that plan
        (a scheduled pass that finds nothing to do returns a result without GPU results)."""
        p, t0 = self.p, time.monotonic()
        choice = Choice([], [], reason)  # what is being applied: a refusal is its GPUs' failure
        plans: list[GpuPlan] = []
        unreadable: list[Unreadable] = []
        try:
            with p.applier.lock(opts.lock_timeout_s), p.hw_lock:
                if p.slurm is not None and p.slurm.resuming:
                    p.slurm.conclude()
                for r in p.applier.recover_locked():
                    log.warning("GPU %d: %s after an interrupted apply", r.index, r.status.replace("_", " "))
                plans, unreadable = p.applier.plan_each(profile, mode_only=opts.mode_only, must_select=manual)
                lost = touched(profile, unreadable)  # left alone, reported
                if opts.dry_run:
                    result = p.applier.apply_plans(profile, plans, opts)
                    result.unreadable = lost
                    return result
                if p.slurm is not None and not any(x.changes for x in plans):
                    p.slurm.idle(profile, plans, opts)
                choice = choose(p.retries, p.status, plans, p.applier.owners.load(), profile.name, reason,
                                correct, manual)
                if not choice.pending and not manual:  # (drift only reported, failed GPUs waiting their turn)
                    return self._nothing_to_do(profile, plans, unreadable, lost)
                result = self._apply(profile, choice.plans, opts, manual)
                result.unreadable = lost
                p.retries.done(profile.name, result, manual)
                if manual and result.ok:
                    p.hold(profile)  # published before the locks are released
        except REFUSALS as e:
            self._refused(profile, e, choice, (plans, unreadable), manual, t0)
            raise
        finally:
            self._show_parts()
        self._after(profile, result, choice, (plans, unreadable), manual, t0)
        return result

    def _nothing_to_do(self, profile: Profile, plans: list[GpuPlan], unreadable: list[Unreadable],
                       lost: list[Unreadable]) -> ApplyResult:
        self.p.progress.update(profile.name, plans, None, unreadable)
        self.audit([x.seen for x in plans if x.seen is not None], plans)  # as planned from
        self.check_settled(profile.name)
        return ApplyResult(profile.name, plans, [], unreadable=lost)

    def _show_parts(self) -> None:
        p = self.p
        if p.slurm is not None:
            p.status.slurm = p.slurm.snapshot()
        access = p.access()
        if access is not None:  # what an apply could not set shows at once, not at the next pass
            p.status.access = access_view(access)

    def _after(self, profile: Profile, result: ApplyResult, choice: Choice,
               planned: tuple[list[GpuPlan], list[Unreadable]], manual: bool, t0: float) -> None:
        p = self.p
        if not manual or p.status.override is not None and p.status.override.profile is profile:
            p.progress.update(profile.name, planned[0], result, planned[1])
        if manual:  # the loop works out its wait again: a GPU left waiting (on a Slurm job, say) is looked at
            p.events.wake()  # within seconds, one not applied is judged against the active profile at once
        if manual or result.changed or result.ok:  # a retry finding the same GPUs busy is not another apply
            self._finish(profile, result, choice.reason, t0)

    def _refused(self, profile: Profile, e: Exception, choice: Choice,
                 planned: tuple[list[GpuPlan], list[Unreadable]], manual: bool, t0: float) -> None:
        """Said and counted once; a scheduled apply refused once planned is its GPUs' failure (a backoff)."""
        blocked = isinstance(e, BusyError)  # the busy policy did its job: said, counted, never paged
        if blocked or manual or not choice.pending:
            log.log(logging.WARNING if blocked else logging.ERROR, "%s of %s %s: %s",
                    "manual apply" if manual else "apply", profile.name, "blocked" if blocked else "refused", e)
        else:
            self.p.retries.refused(profile.name, choice.pending, str(e))
            self.p.progress.update(profile.name, planned[0], None, planned[1])
        self.record(last_apply(None, Outcome.BLOCKED if blocked else Outcome.ERROR, time.monotonic() - t0,
                               profile.name, choice.reason, e), None)

    def _apply(self, profile: Profile, plans: list[GpuPlan], opts: ApplyOptions, manual: bool) -> ApplyResult:
        """The planned change, through Slurm's drain and GRES on a Slurm node (the apply lock is held)."""
        p = self.p
        if p.slurm is None or not any(x.changes for x in plans):
            return p.applier.apply_plans(profile, plans, opts)
        config = p.config()
        policy = opts.on_busy if manual else config.on_busy  # (opts map wait to retries)
        result = p.slurm.apply(profile, plans, opts, policy,
                               p.real(opts.busy_timeout_s if manual else config.busy_timeout_s))
        if manual and p.slurm.waiting:
            p.hold(profile)  # the passes that follow finish this switch when the jobs end
        return result

    def _finish(self, profile: Profile, result: ApplyResult, reason: str, t0: float) -> None:
        """Count, log and audit one apply, scheduled or manual alike, from what the apply read back."""
        outcome = outcome_of(result)  # (a GPU that failed was said by Retries.done, once)
        self.record(last_apply(result, outcome, time.monotonic() - t0, profile.name, reason), result)
        say(profile.name, result, outcome, reason)
        changed = {r.index for r in result.results if r.status is GpuStatus.APPLIED}
        self.audit(list(result.readings().values()), [x for x in result.plans if x.gpu.index not in changed])
        if profile.name == self.p.status.desired_profile:  # (a manual apply that did not take is not the applied one)
            self.check_settled(profile.name)

    def audit(self, readings: list[GpuState], plans: list[GpuPlan]) -> None:
        findings = audit_readings(readings, {x.gpu.index: x for x in plans})
        old = {(f.gpu, f.check, f.message) for f in self.findings}
        for f in findings:
            if f.severity is Severity.ERROR and (f.gpu, f.check, f.message) not in old:
                log.error("isolation audit: %s", f.message)
        self.findings = findings

    def check_settled(self, name: str) -> None:
        if self.p.progress.converged():
            self.p.status.settle(name)
            self.p.notifier.status(f"profile {name} applied")

    def record(self, last: LastApply, result: ApplyResult | None) -> None:
        status = self.p.status
        status.apply_count[last.result] = status.apply_count.get(last.result, 0) + 1
        status.last_apply = last
        for cb in self.p.on_apply:
            cb(result, last.result, last.seconds)

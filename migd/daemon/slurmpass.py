"""The daemon's apply step on a Slurm node: the same plans and transactional apply, wrapped in
drain -> wait for GPU jobs -> apply -> publish GRES -> resume (migd/slurm/transition.py).

A pass never blocks waiting for jobs: while jobs hold GPUs the pass returns "waiting" and the
next pass looks again.  If Slurm does not take the new GRES, the gate has restored the old files
and this puts the old layout back, so the node serves exactly what it served before.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from migd.api.slurm import Phase, SlurmSnapshot, SwitchBefore
from migd.apply.executor import Applier, before_of
from migd.apply.journal import LayoutDoc
from migd.apply.relabel import owners_only
from migd.apply.result import ApplyOptions, ApplyResult, GpuResult, GpuStatus, OnBusy
from migd.catalog.models import GpuModel
from migd.config.migdyaml import Config
from migd.daemon.demandpass import DemandPass
from migd.hardware.inventory import survey
from migd.hardware.ports import GpuBackend, read_state
from migd.hardware.types import GpuState, HardwareError
from migd.paths import StateFile
from migd.plan.planner import GpuPlan, PlanError
from migd.profiles.model import Profile
from migd.slurm.ctl import SlurmCtl, SlurmError, command_runner
from migd.slurm.transition import GateHooks, Interrupted, SlurmGate

log = logging.getLogger(__name__)


def slurm_switch(config: Config, backend: GpuBackend, applier: Applier, state_dir: Path,
                 now: Callable[[], datetime], lent: Lent | None = None) -> SlurmSwitch | None:
    """The Slurm step for a config with a ``slurm:`` section (None without one)."""
    s = config.slurm
    if s is None:
        return None
    lent = lent or Lent()
    run = command_runner(dict(s.env))
    ctl = SlurmCtl(s.node, run, s.command_timeout_s)
    switch = SlurmSwitch(SlurmGate(s, ctl, run, backend.minor_number, StateFile.SLURM.at(state_dir), now, lent.hooks),
                         applier, lent.unheld)
    if s.demand is not None:
        switch.demand = DemandPass(s, s.demand, ctl, state_dir)
    return switch


@dataclass(frozen=True)
class Lent:
    """What the daemon lends the Slurm step: ``unheld`` lets go of the hardware lock while Slurm is
    waited on (so the sampler and the fault watch go on however long slurmctld takes), ``hooks``
    mark progress for the watchdog and tell it SIGTERM came."""

    hooks: GateHooks = GateHooks()
    unheld: Callable[[], AbstractContextManager[object]] = nullcontext


class SlurmSwitch:
    def __init__(self, gate: SlurmGate, applier: Applier,
                 unheld: Callable[[], AbstractContextManager[object]] = nullcontext) -> None:
        self.gate = gate
        self.applier = applier
        self._unheld = unheld
        self.demand: DemandPass | None = None  # layouts from Slurm's queue (slurm.demand), if configured

    def snapshot(self) -> SlurmSnapshot:
        """For status JSON and metrics: the node, its switch phase and what it waits for."""
        return SlurmSnapshot.of(self.gate.s.node, self.gate.state)

    def probe(self) -> None:
        """At start: a Slurm that cannot write JSON is said now, not first at the switch a running job holds
        up (``squeue --json`` fails: the switch cannot tell which jobs hold GPUs, and waits)."""
        with self._unheld():
            why = self.gate.ctl.json_unavailable()
        if why is not None:
            planner = self.demand is not None and self.demand.s.planner == self.gate.s.node
            log.warning("Slurm: %s: until it can, squeue --json fails and a switch while jobs run on this node "
                        "waits%s (docs/slurm.md)", why, ", and the demand planner decides nothing" if planner else "")

    def reserve_ahead(self, transition: datetime | None) -> None:
        try:
            with self._unheld():
                self.gate.reserve_ahead(transition)
        except SlurmError as e:
            log.error("Slurm: cannot reserve the node ahead of the transition: %s", e)

    @property
    def mid_switch(self) -> bool:
        """A switch was started (by this or a previous migd) and not finished."""
        return self.gate.state.phase in (Phase.DRAINING, Phase.SWITCHING)

    @property
    def resuming(self) -> bool:
        """A switch ended and Slurm has not confirmed the node's resume yet: retried at each pass."""
        return self.gate.state.phase is Phase.RESUMING

    def conclude(self) -> None:
        with self._unheld():
            self.gate.conclude()

    @property
    def waiting(self) -> bool:
        """The node is drained for a switch and jobs still hold its GPUs."""
        return self.gate.state.phase is Phase.DRAINING

    def apply(self, profile: Profile, plans: list[GpuPlan], opts: ApplyOptions, policy: OnBusy,
              force_after_s: float) -> ApplyResult:
        """The apply under Slurm.  While the node drains (or cannot drain yet) every GPU that would
        change is BLOCKED with Slurm's reason, as busy instances are elsewhere; the next pass looks again.
        Slurm is waited on with the hardware lock let go; the GPUs are changed with it held."""
        if not self._ready(profile, policy, force_after_s):
            moved = owners_only(plans, self.applier.owners.load())  # (waits with the rest)
            return ApplyResult(profile.name, plans, [
                GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.BLOCKED, len(p.ops), f"Slurm: {self.gate.state.reason}")
                if p.changes or p.gpu.index in moved else GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.UNCHANGED)
                for p in plans], owners_only=moved)
        owners = self.applier.owners.load()
        self.gate.record_before({p.gpu.uuid: SwitchBefore(LayoutDoc.of(before_of(p)), owners.get(p.gpu.uuid, {}))
                                 for p in plans if p.changes})
        result = self.applier.apply_plans(profile, plans, opts)
        if not result.changed:
            with self._unheld():
                self.gate.finish(False, f"apply of {profile.name} changed nothing; the node serves its previous "
                                 "layout")
            return result
        try:
            why = self._publish(profile, list(result.readings().values()))
        except Interrupted:  # migd is stopping: the GPUs wait, as recorded, for the next start
            return dataclasses.replace(result, results=[
                dataclasses.replace(r, status=GpuStatus.BLOCKED, error="Slurm: migd stopped before Slurm took the "
                                    "new GRES; the next start finishes the switch")
                if r.status is GpuStatus.APPLIED else r for r in result.results])
        if why is None:
            with self._unheld():
                self.gate.finish(result.ok, f"switched to {profile.name}" if result.ok else
                                 f"switched to {profile.name} in part: {self._failed(result)}")
            return result
        undone = self._undo(profile, opts, why)
        return dataclasses.replace(result, results=[
            dataclasses.replace(r, status=GpuStatus.ROLLED_BACK if undone else GpuStatus.FAILED,
                                error=self.gate.state.ended_reason or why)
            if r.status is GpuStatus.APPLIED else r for r in result.results])

    def _ready(self, profile: Profile, policy: OnBusy, force_after_s: float) -> bool:
        try:
            with self._unheld():
                return self.gate.ready(profile.name, policy, force_after_s)
        except SlurmError as e:  # drained already, or not: say which step failed (the command is in e)
            what = "cannot list the node's jobs" if self.gate.state.phase is Phase.DRAINING else "cannot drain"
            log.error("Slurm: %s for %s: %s", what, profile.name, e)
            self.gate.state.reason = f"{what}: {e}"
            return False

    def _publish(self, profile: Profile, states: list[GpuState], name: str | None = None) -> str | None:
        """None once Slurm took the GRES, else why not (the gate restored the files).  SIGTERM during the
        wait leaves the switch recorded as it stands: the next start publishes again, or undoes it."""
        try:
            with self._unheld():
                self.gate.publish(name or profile.name, states)
        except SlurmError as e:
            return f"Slurm did not take the new GRES of {name or profile.name}: {e}"
        except Interrupted as e:
            log.warning("Slurm: %s; the switch to %s is left recorded (%s) and the next start finishes it", e,
                        profile.name, self.gate.s.node)
            raise
        return None

    def _undo(self, profile: Profile, opts: ApplyOptions, why: str, republish: bool = False) -> bool:
        """Put the GPUs back as recorded before the switch (this migd's, or a previous one's), then end
        the switch: resumed when GPUs and GRES agree again, else held drained saying why.  ``republish``:
        the files on disk are the refused ones (a previous migd wrote them), so the GRES of the restored
        layout is published again."""
        try:
            models = {g.uuid: g.model for g in survey(self.applier.backend).gpus}  # (one reading of the node)
            befores = {u: (b.layout.desired(_model(models, u)), dict(b.owners))
                       for u, b in self.gate.state.before.items()}
            undone = self.applier.restore_layouts(befores, opts, f"{profile.name} (undone)").ok
        except (HardwareError, PlanError, ValueError, KeyError) as e:
            log.critical("Slurm: the layout from before the switch cannot be put back: %s", e)
            undone = False
        back = "previous layout restored" if undone else "RESTORING THE PREVIOUS LAYOUT FAILED"
        agree = undone
        if undone and republish:
            states = [read_state(self.applier.backend, g) for g in survey(self.applier.backend).gpus]
            try:
                again = self._publish(profile, states, f"{profile.name} (undone)")
            except Interrupted:  # (recorded as switching: the next start looks again)
                return undone
            agree, back = again is None, back if again is None else f"{back}; {again}"
        with self._unheld():
            self.gate.finish(False, f"{why}; {back}", agree=agree)
        return undone

    def idle(self, profile: Profile, plans: list[GpuPlan], opts: ApplyOptions) -> None:
        """A pass whose layout already holds: finish a switch left open, or check Slurm agrees (while
        Slurm is unreachable, one complaint is enough: not while a resume is unconfirmed)."""
        if self.mid_switch:
            self.settle(profile, plans, opts)
        elif not self.resuming:
            self.check_sync(plans)

    def check_sync(self, plans: list[GpuPlan]) -> None:
        with self._unheld():
            self.gate.check_sync([p.seen for p in plans if p.seen is not None])

    def settle(self, profile: Profile, plans: list[GpuPlan], opts: ApplyOptions) -> None:
        """The layout is already as asked but a switch was left open (migd stopped between the apply
        and the resume): publish the GRES of what is there and resume; if Slurm refuses it, the files
        and the GPUs both go back to what they were before the switch."""
        try:
            why = self._publish(profile, [p.seen for p in plans if p.seen is not None])
        except Interrupted:
            return
        if why is None:
            with self._unheld():
                self.gate.finish(True, f"switched to {profile.name} (finished after a restart)")
        elif self.gate.state.before:
            self._undo(profile, opts, why, republish=True)
        else:  # (a v1 state file: the layout before the switch was not recorded)
            with self._unheld():
                self.gate.finish(False, why, agree=False)

    @staticmethod
    def _failed(result: ApplyResult) -> str:
        return "; ".join(f"GPU {r.index}: {r.status}" for r in result.results if r.status is not GpuStatus.APPLIED)


def _model(models: dict[str, GpuModel | None], uuid: str) -> GpuModel:
    model = models.get(uuid)
    if model is None:
        raise KeyError(f"GPU {uuid} is not present")
    return model

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
from datetime import datetime
from pathlib import Path

from migd.api.slurm import Phase, SlurmSnapshot
from migd.apply.executor import Applier
from migd.apply.result import ApplyOptions, ApplyResult, GpuResult, GpuStatus, OnBusy
from migd.daemon.config import Config
from migd.hardware.ports import GpuBackend
from migd.plan.planner import GpuPlan
from migd.profiles.model import Profile
from migd.slurm.ctl import SlurmCtl, SlurmError, command_runner
from migd.slurm.transition import SlurmGate

log = logging.getLogger(__name__)


def slurm_switch(config: Config, backend: GpuBackend, applier: Applier, state_dir: Path,
                 now: Callable[[], datetime]) -> SlurmSwitch | None:
    """The Slurm step for a config with a ``slurm:`` section (None without one)."""
    s = config.slurm
    if s is None:
        return None
    run = command_runner(dict(s.env))
    ctl = SlurmCtl(s.node, run, s.command_timeout_s)
    return SlurmSwitch(SlurmGate(s, ctl, run, backend.minor_number, state_dir / "slurm.json", now),
                       applier)


class SlurmSwitch:
    def __init__(self, gate: SlurmGate, applier: Applier) -> None:
        self.gate = gate
        self.applier = applier

    def snapshot(self) -> SlurmSnapshot:
        """For status JSON and metrics: the node, its switch phase and what it waits for."""
        return SlurmSnapshot.of(self.gate.s.node, self.gate.state)

    def reserve_ahead(self, transition: datetime | None) -> None:
        try:
            self.gate.reserve_ahead(transition)
        except SlurmError as e:
            log.error("Slurm: cannot reserve the node ahead of the transition: %s", e)

    @property
    def mid_switch(self) -> bool:
        """A switch was started (by this or a previous migd) and not finished."""
        return self.gate.state.phase in (Phase.DRAINING, Phase.SWITCHING)

    @property
    def waiting(self) -> bool:
        """The node is drained for a switch and jobs still hold its GPUs."""
        return self.gate.state.phase is Phase.DRAINING

    def apply(self, profile: Profile, plans: list[GpuPlan], opts: ApplyOptions, policy: OnBusy,
              force_after_s: float) -> ApplyResult:
        """The apply under Slurm.  While the node drains (or cannot drain yet) every GPU that would
        change is BLOCKED with Slurm's reason, as busy instances are elsewhere; the next pass looks again."""
        try:
            ready = self.gate.ready(profile.name, policy, force_after_s)
        except SlurmError as e:  # drained already, or not: say which step failed (the command is in e)
            what = "cannot list the node's jobs" if self.gate.state.phase is Phase.DRAINING else "cannot drain"
            log.error("Slurm: %s for %s: %s", what, profile.name, e)
            self.gate.state.reason = f"{what}: {e}"
            ready = False
        if not ready:
            return ApplyResult(profile.name, plans, [
                GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.BLOCKED if p.changes else GpuStatus.UNCHANGED,
                          len(p.ops), f"Slurm: {self.gate.state.reason}" if p.changes else None) for p in plans])
        owners = self.applier.owners.load()
        result = self.applier.apply_plans(profile, plans, opts)
        if not result.changed:
            self.gate.finish(False, f"apply of {profile.name} changed nothing; the node serves its previous layout")
            return result
        try:
            self.gate.publish(profile.name, list(result.readings().values()))
        except SlurmError as e:
            undo = self.applier.restore(result.plans, owners, opts, f"{profile.name} (undone)")
            why = f"Slurm did not take the new GRES: {e}"
            back = "previous layout restored" if undo.ok else "RESTORING THE PREVIOUS LAYOUT FAILED"
            self.gate.finish(False, f"{why}; {back}", agree=undo.ok)
            return dataclasses.replace(result, results=[
                dataclasses.replace(r, status=GpuStatus.ROLLED_BACK if undo.ok else GpuStatus.FAILED,
                                    error=f"{why}; {back}")
                if r.status is GpuStatus.APPLIED else r for r in result.results])
        self.gate.finish(result.ok, f"switched to {profile.name}" if result.ok else
                         f"switched to {profile.name} in part: {self._failed(result)}")
        return result

    def check_sync(self, plans: list[GpuPlan]) -> None:
        self.gate.check_sync([p.seen for p in plans if p.seen is not None])

    def settle(self, profile: Profile, plans: list[GpuPlan]) -> None:
        """The layout is already as asked but a switch was left open (migd stopped between the apply
        and the resume): publish the GRES of what is there and resume."""
        try:
            self.gate.publish(profile.name, [p.seen for p in plans if p.seen is not None])
            self.gate.finish(True, f"switched to {profile.name} (finished after a restart)")
        except SlurmError as e:
            self.gate.finish(False, f"Slurm did not take the GRES of {profile.name}: {e}")

    @staticmethod
    def _failed(result: ApplyResult) -> str:
        return "; ".join(f"GPU {r.index}: {r.status}" for r in result.results if r.status is not GpuStatus.APPLIED)

"""The demand mode on one node (docs/demand.md): plan, on the planner node; follow, on every node.

A node follows its planner's want while the want's lease runs, its schedule otherwise; when Slurm
cannot be read it keeps the layout it has (no change, not a guess).  A manual apply still wins
over both, as over the schedule.  A want may name a per-GPU mix of the candidates (``night*7/balanced``,
migd/demand/mix.py): the node applies the profile built from the candidates' own sections.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from migd.api.demand import DemandView, PlanSummary, Source
from migd.demand.mix import MixError, mix_profile, parse_mix, shapes
from migd.hardware.inventory import GpuLister, survey
from migd.paths import StateFile
from migd.profiles.model import Profile
from migd.slurm.ctl import SlurmCtl, SlurmError
from migd.slurm.demandconf import DemandMode, DemandSettings
from migd.slurm.demandplan import Planner
from migd.slurm.slurmconf import SlurmSettings
from migd.slurm.want import Want, stamp

log = logging.getLogger("migd")


class DemandPass:
    def __init__(self, slurm: SlurmSettings, settings: DemandSettings, ctl: SlurmCtl, state_dir: Path,
                 clock: Callable[[], float] = time.time) -> None:
        self.s, self.node, self.ctl = settings, slurm.node, ctl
        self.partition = slurm.partition or ""
        self._clock = clock
        self._state_dir = state_dir
        self.planner: Planner | None = None
        self.last_plan: PlanSummary | None = None
        self._said = ""

    @property
    def planning(self) -> bool:
        return self.s.planner == self.node

    def due(self) -> bool:
        return self.planner is None or self.planner.due()

    def plan(self, profiles: dict[str, Profile], gpus: GpuLister) -> None:
        """On the planner node, when due: read Slurm, decide, write (or, in dry-run, only report)."""
        if self.s.planner != self.node:
            return
        if self.planner is None:  # (candidates resolved on this node's GPUs, and on other counts of its model)
            models = [g.model for g in survey(gpus).gpus if g.model is not None]
            layouts = shapes(profiles, self.s.candidates, models, not self.s.mixes.whole(self.s.params.reserves))
            self.planner = Planner(self.s, self.partition, self.node, self.ctl, layouts,
                                   StateFile.DEMAND.at(self._state_dir), self._clock)
        if self.planner.due():
            self.last_plan = self.planner.tick()

    def follow(self, current: str | None) -> DemandView:
        """Which candidate this node should hold now, and why (``profile`` None: the schedule's)."""
        view = self._follow(current)
        said = f"{view.source.value}: {view.why}"
        if said != self._said:
            log.info("demand: %s", said)
            self._said = said
        return view

    def _follow(self, current: str | None) -> DemandView:
        if self.s.mode is DemandMode.DRY_RUN:
            return self._view(Source.SCHEDULE, None, "dry-run: the planner only reports; the schedule decides")
        try:
            extra = self.ctl.info().extra
        except SlurmError as e:
            return self._view(Source.HELD, current, f"cannot read this node's Slurm record ({e}); keeping "
                              f"{current or 'the GPUs as they are'}")
        want, now = Want.parse(extra), self._clock()
        if want is None:
            why = f"no wanted layout from planner {self.s.planner} in this node's Extra: following the schedule"
        elif want.planner != self.s.planner:
            why = f"Extra names planner {want.planner}, this node follows {self.s.planner}: following the schedule"
        elif want.beyond(now, self.s.lease_s):
            why = f"the planner's lease runs to {stamp(want.until)} (until={want.until:.0f}), beyond this node's " \
                  f"lease ({self.s.lease_s:g}s) from now: not followed; following the schedule"
        elif not want.holds(self.s.planner, now, self.s.lease_s):
            why = f"the planner's lease ended at {stamp(want.until)}: following the schedule"
        elif (bad := self._unknown(want.layout)) is not None:
            why = f"the planner wants {want.layout!r}, {bad}: following the schedule"
        else:
            return self._view(Source.PLANNER, want.layout, f"planner {want.planner} wants {want.layout}", want.until)
        return self._view(Source.SCHEDULE, None, why)

    def _unknown(self, layout: str) -> str | None:
        """Why ``layout`` is neither a candidate here nor a per-GPU mix of them (None: it is one)."""
        try:
            parse_mix(layout, self.s.candidates)
        except MixError as e:
            return f"not a candidate here nor a mix of them ({e})"
        return None

    def profile(self, name: str, profiles: dict[str, Profile]) -> Profile | None:
        """The profile to apply for a wanted layout: a profile of the configuration, or the one built for
        a per-GPU mix of the candidates (None: neither; the GPUs are left as they are)."""
        if name in profiles:
            return profiles[name]
        try:
            return mix_profile(name, profiles, self.s.candidates)
        except (MixError, KeyError):
            return None

    def _view(self, source: Source, profile: str | None, why: str, until: float | None = None) -> DemandView:
        return DemandView(self.s.mode.value, self.s.planner, source, profile, why, until, self.last_plan)

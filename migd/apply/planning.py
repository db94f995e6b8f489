"""Planning a profile onto this node: which GPUs it selects, each read once and planned to its section.

A GPU NVML cannot read (lost) is set aside and returned, never fatal to the others; a profile that
selects no GPU of the node is an error (a typo must be seen, not "applied").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from migd.apply.relabel import relabelled
from migd.hardware.inventory import Unreadable, survey
from migd.hardware.ports import GpuReader, read_state
from migd.hardware.types import GpuInfo, GpuState, HardwareError
from migd.plan.placement import Busy
from migd.plan.planner import GpuPlan, PlanError, busy_of, layout_of, plan_gpu
from migd.plan.requests import DesiredLayout
from migd.profiles.model import Profile
from migd.profiles.resolve import resolve_section

# GPU index -> its instances whose capability nodes processes hold (access by owner), one /proc read for all
Held = Callable[[Collection[int]], Mapping[int, Busy]]


def plan_each(backend: GpuReader, owners: dict[str, dict[int, str]], profile: Profile, mode_only: bool = False,
              must_select: bool = False, held: Held | None = None) -> tuple[list[GpuPlan], list[Unreadable]]:
    """One reading of every readable GPU the profile selects, and its plan; the GPUs NVML cannot read
    (lost), set aside rather than fatal to the rest.  ``owners``: the labels kept per GPU UUID.

    ``must_select``: a profile that selects no GPU of the node is an error (ValidationError); a GPU
    that could not be read might have been selected, so it is not one then."""
    plans: list[GpuPlan] = []
    inventory = survey(backend)
    unreadable = list(inventory.unreadable)
    for gpu in inventory.gpus:
        try:
            section = profile.section_for(gpu)
            if section is None:
                continue
            if gpu.model is None:
                raise section.loc.error(f"selects GPU {gpu.index} ({gpu.name}), which is not a known "
                                        "MIG-capable model")
            desired = resolve_section(section, gpu.model, mode_only)
            plans.append(_plan(read_state(backend, gpu), desired, owners.get(gpu.uuid, {}), f"{profile.source}: "))
        except HardwareError as e:
            unreadable.append(Unreadable.of(gpu.index, e))
    unreadable.sort(key=lambda u: u.index)
    if must_select and not plans and not touched(profile, unreadable):
        raise profile.selects_nothing(inventory.gpus)
    return _with_holders(plans, owners, held, f"{profile.source}: "), unreadable


def plan_layout(backend: GpuReader, gpu: GpuInfo, desired: DesiredLayout, owners: dict[int, str],
                where: str = "", held: Held | None = None) -> GpuPlan:
    """One GPU read now and planned to ``desired`` (``where``: the profile, for messages).  ``held``:
    processes holding an instance's capability nodes make it busy as running ones do."""
    return _with_holders([_plan(read_state(backend, gpu), desired, owners, where)], {gpu.uuid: owners}, held,
                         where)[0]


def _with_holders(plans: list[GpuPlan], owners: Mapping[str, Mapping[int, str]], held: Held | None,
                  where: str) -> list[GpuPlan]:
    """The plans that change a GPU's layout or owners, planned again from the same reading with the
    processes that hold its instances' nodes counted as busy (the others cannot be touched by them:
    /proc is read only when something would change, once for all those GPUs)."""
    if held is None:
        return plans
    moving = [p.gpu.index for p in plans
              if (p.changes or relabelled([p], owners)) and p.seen is not None and p.seen.instances]
    found = held(moving) if moving else {}
    return [_plan(p.seen, p.desired, owners.get(p.gpu.uuid, {}), where, found[p.gpu.index])
            if p.gpu.index in found and p.seen is not None else p for p in plans]


def _plan(seen: GpuState, desired: DesiredLayout, owners: Mapping[int, str], where: str,
          holding: Busy | None = None) -> GpuPlan:
    """A GPU's plan from one reading; ``holding``: its instances' nodes held open, busy as if in use."""
    gpu = seen.gpu
    if desired.mode_only and gpu.mig_current and gpu.model is not None:
        desired = layout_of(gpu.model, list(seen.instances), owners)  # MIG stays on: keep what is there
    busy = busy_of(seen)
    for gi, by_ci in (holding or {}).items():
        for ci, pids in by_ci.items():
            mine = busy.setdefault(gi, {})
            mine[ci] = tuple(sorted({*mine.get(ci, ()), *pids}))
    try:
        plan = plan_gpu(gpu, desired, list(seen.instances), busy, owners, seen.pids)
    except PlanError as e:
        raise PlanError(f"{where}GPU {gpu.index} ({gpu.model_key}): {e}") from None
    plan.seen = seen
    return plan


def touched(profile: Profile, unreadable: list[Unreadable]) -> list[Unreadable]:
    """The GPUs NVML cannot read that the profile may select (a request touching them is done in part)."""
    return [u for u in unreadable if profile.may_select(u.index)]

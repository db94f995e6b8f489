"""Planning a profile onto this node: which GPUs it selects, each read once and planned to its section.

A GPU NVML cannot read (lost) is set aside and returned, never fatal to the others; a profile that
selects no GPU of the node is an error (a typo must be seen, not "applied").
"""

from __future__ import annotations

from collections.abc import Callable

from migd.hardware.inventory import Unreadable, survey
from migd.hardware.ports import GpuReader, read_state
from migd.hardware.types import GpuInfo, HardwareError
from migd.plan.placement import Busy
from migd.plan.planner import GpuPlan, PlanError, busy_of, layout_of, plan_gpu
from migd.plan.requests import DesiredLayout
from migd.profiles.model import Profile
from migd.profiles.resolve import resolve_section

Held = Callable[[int], Busy]  # a GPU's instances whose capability nodes processes hold (access by owner)


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
            plans.append(plan_layout(backend, gpu, desired, owners.get(gpu.uuid, {}), where=f"{profile.source}: ",
                                     held=held))
        except HardwareError as e:
            unreadable.append(Unreadable.of(gpu.index, e))
    unreadable.sort(key=lambda u: u.index)
    if must_select and not plans and not touched(profile, unreadable):
        raise profile.selects_nothing(inventory.gpus)
    return plans, unreadable

def plan_layout(backend: GpuReader, gpu: GpuInfo, desired: DesiredLayout, owners: dict[int, str],
                where: str = "", held: Held | None = None) -> GpuPlan:
    """One GPU read now and planned to ``desired`` (``where``: the profile, for messages).  ``held``:
    processes holding an instance's capability nodes make it busy as running ones do."""
    seen = read_state(backend, gpu)
    if desired.mode_only and gpu.mig_current and gpu.model is not None:
        desired = layout_of(gpu.model, list(seen.instances), owners)  # MIG stays on: keep what is there
    busy = busy_of(seen)
    for gi, by_ci in (held(gpu.index) if held is not None and seen.instances else {}).items():
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

"""Exact placements and a minimal ordered plan, solved before any hardware is touched.

For each GPU the planner searches the non-overlapping placements of the requested instances
in the model's placement table (migd.plan.placement: branch and bound over memory-slice bitmasks),
scores each by the destroy/create operations it needs given what exists now, and keeps the
cheapest.  Instances that already sit in a compatible place are kept; destroying one with
running processes costs more than any other plan, so it happens only when unavoidable.  On an
empty GPU the answer is looked up in the model's first-fit table (migd.plan.firstfit).  Plans are
memoised by their inputs and request-only work by request; ``forget`` drops every memo.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import NamedTuple

from migd.catalog.models import GiProfile, GpuModel, Placement, media_conflict
from migd.hardware.types import GpuInfo, GpuInstance, GpuState
from migd.kinds import Word
from migd.plan.firstfit import first_fit
from migd.plan.placement import (
    Busy,
    Solution,
    ci_layout,
    ci_multisets,
    fresh_cis,
    fresh_layout,
    fresh_options,
    item_rank,
    place_cis,
    search,
    search_order,
)
from migd.plan.requests import DesiredInstance, DesiredLayout


class PlanError(Exception):
    """The request cannot be placed on this GPU; nothing was touched."""


class OpKind(Word):
    """The operations an apply runs, in the order a plan lists them (destroys, mode, creates)."""

    DESTROY_CI = "destroy_ci"
    DESTROY_GI = "destroy_gi"
    SET_MIG = "set_mig"
    RESET = "reset"  # only if the mode change stays pending
    CREATE_GI = "create_gi"
    CREATE_CI = "create_ci"


_VERBS = {OpKind.DESTROY_CI: "destroy CI", OpKind.DESTROY_GI: "destroy GI", OpKind.CREATE_GI: "create GI",
          OpKind.CREATE_CI: "create CI"}


class Op(NamedTuple):
    """One NVML operation of a plan.  A NamedTuple, not a frozen dataclass: a plan builds up to 30 of
    them and a frozen dataclass costs four times as much to construct."""

    kind: OpKind
    gpu: int
    gi_start: int | None = None  # GIs are named by placement start: ids are assigned by the driver
    gi_id: int | None = None
    ci_id: int | None = None
    profile_id: int | None = None
    placement: Placement | None = None
    mig: bool | None = None
    name: str = ""
    busy_pids: tuple[int, ...] = ()

    def describe(self) -> str:
        k = self.kind
        if k is OpKind.SET_MIG:
            return f"GPU {self.gpu}: set MIG mode {'enabled' if self.mig else 'disabled'}"
        if k is OpKind.RESET:
            return f"GPU {self.gpu}: reset, if the MIG mode change stays pending (GPU held, pass-through VM)"
        what = _VERBS[k]
        ids = f" id {self.gi_id}" + (f"/{self.ci_id}" if self.ci_id is not None else "") if self.gi_id is not None \
            else ""
        busy = f" [busy: pids {','.join(map(str, self.busy_pids))}]" if self.busy_pids else ""
        at = f" at {self.placement}" if self.placement is not None else ""
        gi = f" in GI@{self.gi_start}" if k in (OpKind.DESTROY_CI, OpKind.CREATE_CI) else ""
        return f"GPU {self.gpu}: {what} {self.name}{ids}{at}{gi}{busy}"

    @property
    def mutating_nvml(self) -> bool:
        return self.kind is not OpKind.RESET


class Target(NamedTuple):
    """One instance of the solved layout (a NamedTuple for the reason Op is one)."""

    gi_profile_id: int
    placement: Placement
    ci: tuple[tuple[int, Placement], ...]  # (CI profile id, placement)
    name: str
    owner: str | None


# Ops and Targets built from all their fields in order, without the NamedTuple's Python-level
# __new__ (half the cost; a plan builds up to 30): the planner's hot paths only.
_op = partial(tuple.__new__, Op)
_target = partial(tuple.__new__, Target)


@dataclass
class GpuPlan:
    gpu: GpuInfo
    desired: DesiredLayout
    targets: list[Target]
    ops: list[Op]
    kept: int = 0
    busy: Busy = field(default_factory=dict)
    current: list[GpuInstance] = field(default_factory=list)
    seen: GpuState | None = None  # the reading this plan was made from (audited when nothing changes)

    @property
    def changes(self) -> bool:
        return bool(self.ops)

    @property
    def blocked(self) -> list[Op]:
        """Destroys (or mode changes) that would hit running processes."""
        return [o for o in self.ops if o.busy_pids]


def busy_of(state: GpuState) -> Busy:
    """GI -> CI -> pids of the MIG devices that run processes."""
    busy: Busy = {}
    for d in state.devices:
        if d.processes:
            busy.setdefault(d.gi_id, {})[d.ci_id] = tuple(sorted(p.pid for p in d.processes))
    return busy


def _counted(names: Iterable[str]) -> str:
    """``7x1g.10gb`` or ``2g.20gb+2x1g.10gb``: profile names with their counts, in first-seen order."""
    return "+".join(f"{n}x{name}" if n > 1 else name for name, n in Counter(names).items())


def summary(instances: list[DesiredInstance] | tuple[DesiredInstance, ...]) -> str:
    return _counted(i.gi.name for i in instances) or "nothing"


def layout_text(current: list[GpuInstance], gpu: GpuInfo) -> str:
    """What a GPU holds, as :func:`summary` writes a request (``MIG disabled`` when it is off)."""
    if not gpu.mig_current:
        return "MIG disabled"
    return _counted(p.name if (p := gpu.model.profile_by_id(g.profile_id) if gpu.model else None) else
                    str(g.profile_id) for g in current) or "no instances"


def _feasibility(model: GpuModel, want: list[DesiredInstance], sequence: tuple[int, ...]) -> None:
    """Raises PlanError if ``want`` (GI profile ids ``sequence`` in search order) cannot fit
    ``model`` at all; the message names the request in its own order."""
    by_id = model.by_id
    for d in want:
        gi = d.gi
        if by_id.get(gi.profile_id) is not gi and by_id.get(gi.profile_id) != gi:
            # requests are resolved per model: this is a bug, not bad input
            raise PlanError(f"{gi.name} (GI profile id {gi.profile_id}) is not in the {model.key} table")
    if not _fits(model, sequence):
        raise PlanError(_refusal(model, [d.gi for d in want], summary(want)) or "")


@lru_cache(maxsize=4096)
def _fits(model: GpuModel, profile_ids: tuple[int, ...]) -> bool:
    """Whether GPU instances of these profiles (in search order, as firstfit names sequences) may
    coexist on ``model``: a per-model table, a function of the catalog alone, so ``forget`` keeps it."""
    return _refusal(model, [model.by_id[p] for p in profile_ids], "") is None


def _refusal(model: GpuModel, want: list[GiProfile], name: str) -> str | None:
    """Why ``want`` (named ``name``) cannot coexist on ``model``; None if it may.  A profile's own
    instance limit is said first: it is the number a user changes (``count: 8`` of 1g: "at most 7")."""
    for prof, n in Counter(want).items():
        if n > prof.instance_count:
            return f"{n} x {prof.name} exceed the {prof.instance_count} instance(s) {model.key} allows"
    mem = sum(p.memory_slices for p in want)
    if mem > model.memory_slices:
        return f"{name} needs {mem} memory slices, {model.key} has {model.memory_slices}"
    comp = sum(p.slices for p in want)
    if comp > model.compute_slices:
        return f"{name} needs {comp} compute slices, {model.key} has {model.compute_slices}"
    conflict = media_conflict(want)
    return None if conflict is None else f"on {model.key}: {conflict}"


def _destroy_ops(gpu: int, gi: GpuInstance, busy: Busy, name: str) -> list[Op]:
    pids = busy.get(gi.id, {})
    start = gi.placement.start
    ops = []
    for c in gi.compute_instances:  # a loop, not a comprehension: mostly one CI
        ops.append(_op((OpKind.DESTROY_CI, gpu, start, gi.id, c.id, c.profile_id, c.placement, None, name,
                        pids.get(c.id, ()))))
    all_pids = tuple(sorted({p for v in pids.values() for p in v})) if pids else ()
    ops.append(_op((OpKind.DESTROY_GI, gpu, start, gi.id, None, gi.profile_id, gi.placement, None, name, all_pids)))
    return ops


def plan_gpu(gpu: GpuInfo, desired: DesiredLayout, current: list[GpuInstance],
             busy: Busy | None = None, owners: Mapping[int, str] | None = None,
             gpu_pids: tuple[int, ...] = ()) -> GpuPlan:
    """Plan one GPU.  ``busy`` maps GI id -> CI id -> pids; ``gpu_pids`` are non-MIG processes."""
    busy = busy or {}
    model = gpu.model
    if model is None:
        raise PlanError(f"GPU {gpu.index}: {gpu.name} (PCI 0x{gpu.pci_device_id:08X}) is not a known MIG-capable "
                        "model")
    frozen_busy = tuple(sorted((gi, tuple(sorted(cis.items()))) for gi, cis in busy.items())) if busy else ()
    targets, ops, kept = _solve(model, gpu.index, gpu.mig_current, gpu.mig_pending, desired, tuple(current),
                                frozen_busy, tuple(sorted(owners.items())) if owners else (), gpu_pids)
    kept_current = current if not desired.mig or gpu.mig_current else []
    return GpuPlan(gpu, desired, list(targets), list(ops), kept, busy, list(kept_current))


@lru_cache(maxsize=1024)
def _solve(model: GpuModel, i: int, mig_current: bool, mig_pending: bool, desired: DesiredLayout,
           current: tuple[GpuInstance, ...],
           frozen_busy: tuple[tuple[int, tuple[tuple[int, tuple[int, ...]], ...]], ...],
           frozen_owners: tuple[tuple[int, str], ...],
           gpu_pids: tuple[int, ...]) -> tuple[tuple[Target, ...], tuple[Op, ...], int]:
    """The plan (targets, ops, GIs kept) as a pure function of hashable inputs, memoised: the daemon
    plans every GPU on every pass, mostly with nothing changed since the last one."""
    busy: Busy = {gi: dict(cis) for gi, cis in frozen_busy} if frozen_busy else {}
    ops: list[Op] = []
    if not desired.mig:
        if mig_current or mig_pending:
            for gi in current:
                ops += _destroy_ops(i, gi, busy, _name(model, gi.profile_id))
            ops.append(Op(OpKind.SET_MIG, i, mig=False, busy_pids=gpu_pids))
            if mig_current and model.mode_change_needs_reset:
                ops.append(Op(OpKind.RESET, i, busy_pids=gpu_pids))
        return (), tuple(ops), 0
    want = list(desired.instances)
    items = tuple(sorted(want, key=item_rank))  # the search order, once per plan
    sequence = tuple([d.gi.profile_id for d in items])
    _feasibility(model, want, sequence)
    existing = current if mig_current else ()
    by_key = {(g.profile_id, g.placement.start): g for g in existing} if existing else {}
    solution = None if by_key else fresh_layout(first_fit(model), items, sequence)
    if solution is None:
        solution = search(items, by_key, busy, dict(frozen_owners))
    if solution is None:
        raise PlanError(f"no non-overlapping placement of {summary(want)} exists on {model.key} "
                        f"(placement table in memory slices: " + ", ".join(
                            f"{p.name} {{{','.join(map(str, p.starts))}}}:{p.memory_slices}"
                            for p in model.profiles if p in {d.gi for d in want}) + ")")
    if not mig_current:
        if not mig_pending:
            ops.append(Op(OpKind.SET_MIG, i, mig=True, busy_pids=gpu_pids))
        if model.mode_change_needs_reset:
            ops.append(Op(OpKind.RESET, i, busy_pids=gpu_pids))
    targets, ci_destroys, creates, kept_ids = _changes(i, solution, by_key, busy)
    destroys: list[Op] = []
    for g in existing:
        if g.id not in kept_ids:
            destroys += _destroy_ops(i, g, busy, _name(model, g.profile_id))
    return tuple(targets), tuple(ci_destroys + destroys + ops + creates), len(kept_ids)


def forget(tables: bool = False) -> None:
    """Drop every memo keyed by a request or a GPU state (benchmarks measure first-time planning
    after this); with ``tables``, the per-model tables as well (built again on first use)."""
    for memo in (_solve, search_order, place_cis):
        memo.cache_clear()
    if tables:
        for table in (first_fit, _fits, fresh_cis, fresh_options):
            table.cache_clear()


def build_tables(model: GpuModel) -> None:
    """Fill ``model``'s tables ahead of the first plan: first-fit placements of every GI profile
    sequence, which GI profile multisets may coexist, and the CI layout of every CI multiset of
    every GI profile on an empty GI (requests naming CIs in another order add theirs on first use)."""
    for sequence in first_fit(model):
        _fits(model, sequence)
    for gi in model.profiles:
        for cis in ci_multisets(gi):
            fresh_options(gi, cis)  # and fresh_cis(cis)


def _name(model: GpuModel, profile_id: int) -> str:
    p = model.by_id.get(profile_id)
    return p.name if p is not None else "?"


def _changes(i: int, solution: Solution, by_key: dict[tuple[int, int], GpuInstance],
             busy: Busy) -> tuple[list[Target], list[Op], list[Op], set[int]]:
    """The targets by placement start, CI destroys inside kept GIs, creates (GIs and CIs), and the
    ids of the GIs kept."""
    ci_destroys: list[Op] = []
    creates: list[Op] = []
    targets: list[Target] = []
    kept_ids = set()
    create_gi, create_ci = OpKind.CREATE_GI, OpKind.CREATE_CI
    for d, o in zip(solution.items, solution.options, strict=True):
        gi_prof, pl, cis = d.gi, o.placement, o.cis
        start, gi_pid, names = pl.start, gi_prof.profile_id, gi_prof.ci_names
        targets.append(_target((gi_pid, pl, cis, d.label, d.owner)))
        g = by_key.get((gi_pid, start)) if by_key else None
        if g is None:
            creates.append(_op((create_gi, i, start, None, None, gi_pid, pl, None, gi_prof.name, ())))
            for pid, cpl in cis:
                creates.append(_op((create_ci, i, start, None, None, pid, cpl, None, names.get(pid, "?"), ())))
            continue
        kept_ids.add(g.id)
        if ci_layout(g) == cis:
            continue  # its CIs stay as they are
        have = {(c.profile_id, c.placement) for c in g.compute_instances}
        pids = busy.get(g.id, {})
        ci_destroys += [_op((OpKind.DESTROY_CI, i, start, g.id, c.id, c.profile_id, c.placement, None, gi_prof.name,
                             pids.get(c.id, ()))) for c in g.compute_instances
                        if (c.profile_id, c.placement) not in cis]
        creates += [_op((create_ci, i, start, None, None, pid, cpl, None, names.get(pid, "?"), ()))
                    for pid, cpl in cis if (pid, cpl) not in have]
    return targets, ci_destroys, creates, kept_ids


def layout_of(model: GpuModel, instances: list[GpuInstance], owners: Mapping[int, str] | None = None) -> \
        DesiredLayout:
    """The exact (pinned) layout that exists now: what rollback restores."""
    out = []
    for g in instances:
        prof = model.profile_by_id(g.profile_id)
        if prof is None:
            continue
        cis = tuple(prof.ci_by_id(c.profile_id) or prof.default_ci for c in g.compute_instances)
        out.append(DesiredInstance(gi=prof, cis=cis, owner=(owners or {}).get(g.placement.start),
                                   placement=g.placement,
                                   ci_placements=tuple(c.placement for c in g.compute_instances)))
    return DesiredLayout(mig=True, instances=tuple(out))

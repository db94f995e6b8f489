"""Exact placements and a minimal ordered plan, solved before any hardware is touched.

For each GPU the planner searches every non-overlapping placement of the requested
instances in the model's placement table (8 memory slices: exhaustive search is cheap),
scores each by the destroy/create operations it needs given what exists now, and keeps the
cheapest.  Instances that already sit in a compatible place are kept; destroying one with
running processes costs more than any other plan, so it happens only when unavoidable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from functools import lru_cache

from migd.hardware.backend import GpuInfo, GpuInstance, GpuState
from migd.hardware.catalog import CiProfile, GpuModel, Placement, media_conflict
from migd.kinds import Word
from migd.profiles.resolve import DesiredInstance, DesiredLayout

Busy = dict[int, dict[int, tuple[int, ...]]]  # GI id -> CI id -> pids running there
BUSY_COST = 1000.0  # destroying an instance with processes: only when nothing else works
OWNER_COST = 0.001  # prefer keeping a GI for the tenant that already has it


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


@dataclass(frozen=True)
class Op:
    kind: OpKind
    gpu: int
    _: KW_ONLY
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


@dataclass(frozen=True)
class Target:
    """One instance of the solved layout."""

    gi_profile_id: int
    placement: Placement
    ci: tuple[tuple[int, Placement], ...]  # (CI profile id, placement)
    name: str
    owner: str | None


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


def summary(instances: list[DesiredInstance] | tuple[DesiredInstance, ...]) -> str:
    c = Counter(i.gi.name for i in instances)
    return "+".join(f"{n}x{name}" if n > 1 else name for name, n in c.items()) or "nothing"


def _feasibility(model: GpuModel, want: list[DesiredInstance]) -> None:
    mem = sum(i.gi.memory_slices for i in want)
    if mem > model.memory_slices:
        raise PlanError(f"{summary(want)} needs {mem} memory slices, {model.key} has {model.memory_slices}")
    comp = sum(i.gi.slices for i in want)
    if comp > model.compute_slices:
        raise PlanError(f"{summary(want)} needs {comp} compute slices, {model.key} has {model.compute_slices}")
    for prof, n in Counter(i.gi for i in want).items():
        if n > prof.instance_count:
            raise PlanError(f"{n} x {prof.name} exceed the {prof.instance_count} instance(s) {model.key} allows")
    conflict = media_conflict(i.gi for i in want)
    if conflict is not None:
        raise PlanError(f"on {model.key}: {conflict}")


@lru_cache(maxsize=4096)
def _place_cis(want: tuple[CiProfile, ...], pinned: tuple[Placement, ...] | None,
               have: tuple[tuple[int, Placement], ...]) -> tuple[tuple[int, Placement], ...] | None:
    """CI placements inside one GI, keeping as many existing CIs as possible.  A pure function of
    hashable arguments, memoised: a search asks the same question for every leaf (issue 16)."""
    if pinned is not None:
        return tuple((c.profile_id, p) for c, p in zip(want, pinned, strict=True))
    order = sorted(range(len(want)), key=lambda i: -want[i].slices)
    best: list[tuple[int, list[Placement]]] = []

    def go(k: int, used: list[Placement], kept: int) -> None:
        if k == len(order):
            if not best or kept > best[0][0]:
                best[:] = [(kept, list(used))]
            return
        ci = want[order[k]]
        for pl in ci.placements:
            if not any(pl.overlaps(u) for u in used):
                go(k + 1, used + [pl], kept + ((ci.profile_id, pl) in have))
    go(0, [], 0)
    if not best:
        return None
    placed = dict(zip(order, best[0][1], strict=True))
    return tuple(sorted((want[i].profile_id, placed[i]) for i in range(len(want))))


@dataclass
class _Search:
    model: GpuModel
    want: list[DesiredInstance]
    current: dict[tuple[int, int], GpuInstance]  # (profile id, start) -> existing GI
    busy: Busy
    owners: Mapping[int, str]  # GI start -> recorded owner
    best_cost: float = float("inf")
    best: list[Target] | None = None

    def ci_cost(self, gi: GpuInstance, cis: tuple[tuple[int, Placement], ...]) -> float:
        have = {(c.profile_id, c.placement): c for c in gi.compute_instances}
        cost = 0.0
        for key, c in have.items():
            if key not in cis:
                cost += 1 + (BUSY_COST if c.id in self.busy.get(gi.id, {}) else 0)
        return cost + sum(1 for key in cis if key not in have)

    def gi_destroy_cost(self, gi: GpuInstance) -> float:
        return 1 + len(gi.compute_instances) + (BUSY_COST if self.busy.get(gi.id) else 0)

    def score(self, chosen: list[Placement]) -> tuple[float, list[Target]]:
        cost, targets, kept_ids = 0.0, [], set()
        for item, pl in zip(self.want, chosen, strict=True):
            existing = self.current.get((item.gi.profile_id, pl.start))
            have = tuple((c.profile_id, c.placement) for c in existing.compute_instances) if existing else ()
            cis = _place_cis(item.cis, item.ci_placements, have)
            if cis is None:
                return float("inf"), []
            if existing is not None:
                kept_ids.add(existing.id)
                cost += self.ci_cost(existing, cis)
                if item.owner != self.owners.get(pl.start, item.owner):
                    cost += OWNER_COST
            else:
                cost += 1 + len(cis)
            targets.append(Target(item.gi.profile_id, pl, cis, item.label, item.owner))
        cost += sum(self.gi_destroy_cost(g) for g in self.current.values() if g.id not in kept_ids)
        return cost, targets

    def item_cost(self, item: DesiredInstance, pl: Placement, fresh: float) -> float:
        """What placing ``item`` at ``pl`` costs by itself (destroys of GIs not kept come at the
        leaf); ``fresh``: its cost where no GI of its profile sits at that start (create GI + CIs)."""
        existing = self.current.get((item.gi.profile_id, pl.start))
        if existing is None:
            return fresh
        have = tuple((c.profile_id, c.placement) for c in existing.compute_instances)
        cis = _place_cis(item.cis, item.ci_placements, have)
        if cis is None:
            return float("inf")
        owner_moves = item.owner != self.owners.get(pl.start, item.owner)
        return self.ci_cost(existing, cis) + (OWNER_COST if owner_moves else 0.0)

    def run(self) -> None:
        """Depth-first over placements in ascending start order, so leaves come in the order of the
        tie-break key; a branch whose cost so far plus a lower bound of the rest cannot beat the
        best leaf is cut (branch and bound: same plans as the exhaustive search, issue 16)."""
        keyed = sorted(((-d.gi.memory_slices, _item_key(d)), d) for d in self.want)
        self.want = [d for _, d in keyed]
        keys = [k for (_, k), _ in keyed]
        fresh = [float("inf") if cis is None else 1.0 + len(cis)
                 for cis in (_place_cis(d.cis, d.ci_placements, ()) for d in self.want)]
        bound = _Bound(self, fresh)
        options = [[(pl, _mask(pl)) for pl in ((d.placement,) if d.placement is not None else d.gi.placements)]
                   for d in self.want]
        twins = [k > 0 and keys[k - 1] == keys[k] for k in range(len(self.want))]
        chosen: list[Placement] = []

        def go(k: int, used: int, kept: int, spent: float) -> None:
            if k == len(self.want):
                cost, targets = self.score(chosen)
                if cost < self.best_cost:
                    self.best_cost, self.best = cost, targets
                return
            floor = spent + bound.rest(k, used, kept)
            for pl, mask in options[k]:
                if floor >= self.best_cost - 1e-9:
                    return  # a leaf found below already beats (or ties, with a smaller key) all that is left
                if used & mask or (twins[k] and pl.start < chosen[k - 1].start):
                    continue
                c = self.item_cost(self.want[k], pl, fresh[k])
                keeps = kept | bound.index.get((self.want[k].gi.profile_id, pl.start), 0)
                if c == float("inf") or spent + c + bound.rest(k + 1, used | mask, keeps) >= self.best_cost - 1e-9:
                    continue  # cannot beat the best leaf (an equal one found later loses the tie on its key)
                chosen.append(pl)
                go(k + 1, used | mask, keeps, spent + c)
                chosen.pop()
        go(0, 0, 0, 0.0)


def _mask(pl: Placement) -> int:
    return ((1 << pl.size) - 1) << pl.start


class _Bound:
    """A lower bound of what the items from ``k`` on and the GIs they leave behind still cost: an
    existing GI overlapped by a chosen placement (not kept) is destroyed; per profile, items beyond
    the existing GIs still available are created; available GIs beyond the items left are destroyed."""

    def __init__(self, search: _Search, fresh: list[float]) -> None:
        want = search.want
        existing = list(search.current.values())
        self.index = {(g.profile_id, g.placement.start): 1 << n for n, g in enumerate(existing)}
        self.gis = [(1 << n, _mask(g.placement), g.profile_id, search.gi_destroy_cost(g))
                    for n, g in enumerate(existing)]
        self.cheapest_create: dict[int, float] = {}
        for d, f in zip(want, fresh, strict=True):
            self.cheapest_create[d.gi.profile_id] = min(f, self.cheapest_create.get(d.gi.profile_id, f))
        self.cheapest_destroy: dict[int, float] = {}
        for _, _, pid, cost in self.gis:
            self.cheapest_destroy[pid] = min(cost, self.cheapest_destroy.get(pid, cost))
        self.left = [Counter(d.gi.profile_id for d in want[k:]) for k in range(len(want) + 1)]
        self.suffix = [sum(fresh[k:]) for k in range(len(want) + 1)]  # exact when nothing exists yet

    def rest(self, k: int, used: int, kept: int) -> float:
        if not self.gis:
            return self.suffix[k]
        certain, avail = 0.0, Counter[int]()
        for bit, mask, pid, cost in self.gis:
            if kept & bit:
                continue
            if used & mask:
                certain += cost
            else:
                avail[pid] += 1
        left = self.left[k]
        creates = sum(max(0, n - avail[pid]) * self.cheapest_create[pid] for pid, n in left.items())
        destroys = sum(max(0, n - left[pid]) * self.cheapest_destroy[pid] for pid, n in avail.items())
        return certain + creates + destroys


def _item_key(d: DesiredInstance) -> tuple[object, ...]:
    """Identical items are interchangeable: the search places them in increasing start order only."""
    return (d.gi.profile_id, tuple(c.profile_id for c in d.cis), d.owner or "", d.placement or Placement(-1, 0),
            d.ci_placements or ())


def _destroy_ops(gpu: int, gi: GpuInstance, busy: Busy, name: str) -> list[Op]:
    pids = busy.get(gi.id, {})
    ops = [Op(OpKind.DESTROY_CI, gpu, gi_start=gi.placement.start, gi_id=gi.id, ci_id=c.id, profile_id=c.profile_id,
              placement=c.placement, name=name, busy_pids=pids.get(c.id, ())) for c in gi.compute_instances]
    all_pids = tuple(sorted({p for v in pids.values() for p in v}))
    return ops + [Op(OpKind.DESTROY_GI, gpu, gi_start=gi.placement.start, gi_id=gi.id, profile_id=gi.profile_id,
                     placement=gi.placement, name=name, busy_pids=all_pids)]


def plan_gpu(gpu: GpuInfo, desired: DesiredLayout, current: list[GpuInstance],
             busy: Busy | None = None, owners: Mapping[int, str] | None = None,
             gpu_pids: tuple[int, ...] = ()) -> GpuPlan:
    """Plan one GPU.  ``busy`` maps GI id -> CI id -> pids; ``gpu_pids`` are non-MIG processes."""
    busy = busy or {}
    model = gpu.model
    if model is None:
        raise PlanError(f"GPU {gpu.index}: {gpu.name} (PCI 0x{gpu.pci_device_id:08X}) is not a known MIG-capable "
                        "model")
    names = {pid: p.name for pid, p in model.by_id.items()}
    ops: list[Op] = []
    i = gpu.index
    if not desired.mig:
        if gpu.mig_current or gpu.mig_pending:
            for gi in current:
                ops += _destroy_ops(i, gi, busy, names.get(gi.profile_id, "?"))
            ops.append(Op(OpKind.SET_MIG, i, mig=False, busy_pids=gpu_pids))
            if gpu.mig_current and model.mode_change_needs_reset:
                ops.append(Op(OpKind.RESET, i, busy_pids=gpu_pids))
        return GpuPlan(gpu, desired, [], ops, busy=busy, current=list(current))

    want = list(desired.instances)
    _feasibility(model, want)
    existing = current if gpu.mig_current else []
    search = _Search(model, want, {(g.profile_id, g.placement.start): g for g in existing}, busy, owners or {})
    search.run()
    if search.best is None:
        raise PlanError(f"no non-overlapping placement of {summary(want)} exists on {model.key} "
                        f"(placement table in memory slices: " + ", ".join(
                            f"{p.name} {{{','.join(map(str, p.starts))}}}:{p.memory_slices}"
                            for p in model.profiles if p in {d.gi for d in want}) + ")")
    targets = sorted(search.best, key=lambda t: t.placement.start)
    if not gpu.mig_current:
        if not gpu.mig_pending:
            ops.append(Op(OpKind.SET_MIG, i, mig=True, busy_pids=gpu_pids))
        if model.mode_change_needs_reset:
            ops.append(Op(OpKind.RESET, i, busy_pids=gpu_pids))
    by_key = {(g.profile_id, g.placement.start): g for g in existing}
    kept_ids = set()
    creates: list[Op] = []
    for t in targets:
        g = by_key.get((t.gi_profile_id, t.placement.start))
        if g is None:
            creates.append(Op(OpKind.CREATE_GI, i, gi_start=t.placement.start, profile_id=t.gi_profile_id,
                              placement=t.placement, name=names[t.gi_profile_id]))
            have: dict[tuple[int, Placement], int] = {}
        else:
            kept_ids.add(g.id)
            have = {(c.profile_id, c.placement): c.id for c in g.compute_instances}
            for c in g.compute_instances:
                if (c.profile_id, c.placement) not in t.ci:
                    ops.append(Op(OpKind.DESTROY_CI, i, gi_start=g.placement.start, gi_id=g.id, ci_id=c.id,
                                  profile_id=c.profile_id, placement=c.placement, name=names[g.profile_id],
                                  busy_pids=busy.get(g.id, {}).get(c.id, ())))
        gi_prof = model.profile_by_id(t.gi_profile_id)
        if gi_prof is None:  # targets come from the model's own table
            raise PlanError(f"GPU {i}: GI profile id {t.gi_profile_id} is not in the {model.key} table")
        for pid, pl in t.ci:
            if (pid, pl) not in have:
                ci_prof = gi_prof.ci_by_id(pid)
                creates.append(Op(OpKind.CREATE_CI, i, gi_start=t.placement.start, profile_id=pid, placement=pl,
                                  name=ci_prof.name if ci_prof else "?"))
    destroys = [op for g in existing if g.id not in kept_ids
                for op in _destroy_ops(i, g, busy, names.get(g.profile_id, "?"))]
    ci_destroys = ops[:]
    mode_ops = [o for o in ci_destroys if o.kind in (OpKind.SET_MIG, OpKind.RESET)]
    ops = [o for o in ci_destroys if o.kind is OpKind.DESTROY_CI] + destroys + mode_ops + creates
    return GpuPlan(gpu, desired, targets, ops, kept=len(kept_ids), busy=busy, current=list(existing))


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

"""The demand rule: which nodes should change to which candidate layout, and why (docs/demand.md).

Benefit and cost are both in GPU-slice-hours.  The benefit of a change is the pending work (fair-
weighted, valued up to ``horizon_s``) that the fleet's supply could then start and cannot now, each
node's supply counted from when it will be ready (after its running jobs end: nothing is killed);
the cost is the slices the node leaves idle while it drains and switches.  Changes are taken best
first, one node at a time, while one pays enough (``min_gain_slice_h`` and ``gain_ratio``), the node
has held its layout ``min_dwell_s`` and has switches left today, and the maintenance limit allows.
Ties break by node then layout name: the same snapshot always gives the same decision.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace

from migd.demand.fair import fair_weights
from migd.demand.model import Layout, NodeView, Snapshot, slices_of

Supply = dict[str, float]  # MIG type -> slice-hours a node offers within the horizon


@dataclass(frozen=True)
class Params:
    horizon_s: float = 8 * 3600.0  # how far ahead pending work is valued (a working day's shift)
    recent_s: float = 3600.0  # jobs submitted this recently (pending or started) ...
    lookahead_s: float = 4 * 3600.0  # ... are expected to keep coming at that rate this long
    min_dwell_s: float = 3600.0  # hysteresis: a node holds a layout at least this long
    min_gain_slice_h: float = 7.0  # hysteresis: a change must gain this much (one GPU-hour) net
    gain_ratio: float = 2.0  # and its benefit be this many times its cost
    switch_s: float = 180.0  # one switch's own time: apply, GRES, Slurm restart, registration
    max_changes_per_day: int = 4
    max_in_maintenance: int | None = None  # nodes draining or switching at once (fleet waves)


@dataclass(frozen=True)
class Change:
    node: str
    old: str
    new: str
    benefit_slice_h: float
    cost_slice_h: float
    ready_in_s: float  # when its new layout can serve (its running jobs' end, then the switch)

    @property
    def reason(self) -> str:
        return (f"{self.node}: {self.old} -> {self.new}: gains {self.benefit_slice_h:.1f} slice-hours of pending "
                f"work for {self.cost_slice_h:.1f} idled while it drains (ready in {self.ready_in_s / 60:.0f} min)")


@dataclass(frozen=True)
class Decision:
    changes: tuple[Change, ...]
    demand: tuple[tuple[str, float], ...]  # fair-weighted slice-hours of work per MIG type within the horizon
    unservable: tuple[str, ...]  # MIG types asked for that no candidate layout offers
    held: tuple[tuple[str, str], ...]  # (node, why a paying change was not made)


class _Fleet:
    """Supply per type over the nodes against the demand per type and account, with one node's part
    swappable (a trial costs O(types x accounts), not O(nodes))."""

    def __init__(self, demand: Mapping[str, Mapping[str, float]]) -> None:
        self.demand = demand  # type -> account -> slice-hours
        self.by_type = {t: sum(a.values()) for t, a in demand.items()}
        self.asked: dict[str, float] = defaultdict(float)
        for per in demand.values():
            for account, work in per.items():
                self.asked[account] += work
        self.total: Supply = defaultdict(float)
        self.part: dict[str, Supply] = {}

    def put(self, node: str, supply: Supply) -> None:
        for t, n in self.part.get(node, {}).items():
            self.total[t] -= n
        self.part[node] = supply
        for t, n in supply.items():
            self.total[t] += n

    def score(self, node: str | None = None, supply: Supply | None = None) -> tuple[float, float]:
        """(the worst-served account's fraction of its work that can run, slice-hours of work that can
        run), with ``node``'s part replaced by ``supply``.  An account's share of a type's supply is
        its share of that type's demand."""
        old = self.part.get(node, {}) if node is not None else {}
        new = supply or {}
        got: dict[str, float] = defaultdict(float)
        total = 0.0
        for t, d in self.by_type.items():
            run = min(d, self.total[t] - old.get(t, 0.0) + new.get(t, 0.0))
            total += run
            for account, work in self.demand[t].items():
                got[account] += run * work / d
        worst = min((got[a] / w for a, w in self.asked.items() if w > 0), default=1.0)
        return worst, total


def _demand(snap: Snapshot, offered: set[str], capacity: float, params: Params) -> tuple[
        dict[str, dict[str, float]], tuple[str, ...]]:
    """Fair-weighted slice-hours of work per type within the horizon: the pending jobs', plus, for the
    jobs submitted in the last ``recent_s`` (pending or started), as much again for every ``recent_s``
    of ``lookahead_s`` (a persistence forecast: demand that just appeared is assumed to go on)."""
    again = params.lookahead_s / params.recent_s
    wants: list[tuple[str, str, float]] = []  # (account, type, slice-hours)
    for p in snap.pending:
        work = slices_of(p.mig_type) * p.count * min(p.time_limit_s, params.horizon_s) / 3600
        wants.append((p.account, p.mig_type, work * (1 + again if p.age_s <= params.recent_s else 1)))
    for n in snap.nodes:
        wants += [(r.account, r.mig_type, again * slices_of(r.mig_type) * r.count * min(r.limit_s, params.horizon_s)
                   / 3600) for r in n.running if r.submitted_s_ago <= params.recent_s]
    asks: dict[str, float] = defaultdict(float)
    for account, _, work in wants:
        asks[account] += work
    weight = fair_weights(asks, capacity * params.horizon_s / 3600)
    demand: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for account, mig_type, work in wants:
        if mig_type in offered and weight[account] * work > 0:
            demand[mig_type][account] += weight[account] * work
    unservable = tuple(sorted({p.mig_type for p in snap.pending} - offered))
    return {t: dict(a) for t, a in demand.items()}, unservable


def ready_in_s(node: NodeView, params: Params) -> float:
    return max((r.ends_in_s for r in node.running), default=0.0) + params.switch_s


def supply(node: NodeView, layout: Layout, params: Params, staying: bool) -> Supply:
    """Slice-hours ``node`` in ``layout`` offers within the horizon: each instance's time not taken by the
    running job on it (to its expected end), if it stays; all of ``layout`` from when it is ready, if
    it changes (or is changing) to it."""
    h = params.horizon_s
    if not staying:
        left = max(0.0, h - ready_in_s(node, params))
        return {t: slices_of(t) * n * left / 3600 for t, n in layout.capacity}
    out: Supply = {t: slices_of(t) * n * h / 3600 for t, n in layout.capacity}
    for r in node.running:
        if r.mig_type in out:
            out[r.mig_type] -= slices_of(r.mig_type) * r.count * min(r.ends_in_s, h) / 3600
    return out


def drain_cost(node: NodeView, slices: int, params: Params) -> float:
    """Slice-hours idled by a change: every slice from now until the node is ready, less the slices
    its running jobs keep busy meanwhile."""
    busy = sum(slices_of(r.mig_type) * r.count * r.ends_in_s for r in node.running)
    return max(0.0, slices * ready_in_s(node, params) - busy) / 3600


def decide(snap: Snapshot, layouts: Mapping[str, Layout], params: Params = Params()) -> Decision:
    """Which nodes change to which layout now (``Decision.changes``), and why the others do not."""
    snap = Snapshot(tuple(sorted(snap.pending, key=lambda p: (p.account, p.mig_type, p.job))),  # one order:
                    tuple(replace(n, running=tuple(sorted(n.running, key=lambda r: r.job)))  # the same sums
                          for n in sorted(snap.nodes, key=lambda n: n.name)))
    if not snap.nodes:
        return Decision((), (), (), ())
    offered = {t for lay in layouts.values() for t, _ in lay.capacity}
    slices = max(lay.slices for lay in layouts.values())  # a node's slices (the fullest layout's)
    demand, unservable = _demand(snap, offered, slices * len(snap.nodes), params)
    fleet = _Fleet(demand)
    for n in sorted(snap.nodes, key=lambda n: n.name):
        fleet.put(n.name, supply(n, layouts[n.layout], params, staying=not n.draining))
    busy = sum(1 for n in snap.nodes if n.draining)
    changes: list[Change] = []
    held: dict[str, str] = {}
    free = [n for n in sorted(snap.nodes, key=lambda n: n.name) if not n.draining]
    while demand:
        best = _best(free, layouts, fleet, slices, params, held)
        if best is None:
            break
        node, change, new_supply = best
        if params.max_in_maintenance is not None and busy >= params.max_in_maintenance:
            held[node.name] = (f"{change.reason}; waits: {busy} node(s) in maintenance, "
                               f"max_in_maintenance is {params.max_in_maintenance}")
            break
        changes.append(change)
        fleet.put(node.name, new_supply)
        free.remove(node)
        busy += 1
    return Decision(tuple(changes), tuple(sorted((t, sum(a.values())) for t, a in demand.items())), unservable,
                    tuple(sorted(held.items())))


def _best(nodes: list[NodeView], layouts: Mapping[str, Layout], fleet: _Fleet, slices: int, params: Params,
          held: dict[str, str]) -> tuple[NodeView, Change, Supply] | None:
    """The paying change that best lifts the worst-served account, then gains the most net (ties: node,
    then layout name); none that leaves the worst-served account worse off.  Nodes whose paying
    change hysteresis forbids are noted in ``held``."""
    worst, now = fleet.score()
    found: tuple[float, float, str, str] | None = None
    pick: tuple[NodeView, Change, Supply] | None = None
    for node in nodes:
        cost = drain_cost(node, slices, params)
        for name in sorted(layouts):
            if name == node.layout:
                continue
            new = supply(node, layouts[name], params, staying=False)
            after, served = fleet.score(node.name, new)
            benefit = served - now
            if benefit - cost < params.min_gain_slice_h or benefit < params.gain_ratio * cost or after < worst - 1e-9:
                continue
            change = Change(node.name, node.layout, name, benefit, cost, ready_in_s(node, params))
            why = _hysteresis(node, params)
            if why is not None:
                held.setdefault(node.name, f"{change.reason}; held: {why}")
                continue
            key = (-round(after, 6), -(benefit - cost), node.name, name)
            if found is None or key < found:
                found, pick = key, (node, change, new)
    return pick


def _hysteresis(node: NodeView, params: Params) -> str | None:
    if node.in_layout_s < params.min_dwell_s:
        return (f"in {node.layout} for {node.in_layout_s / 60:.0f} min of the {params.min_dwell_s / 60:.0f} min "
                f"minimum; earliest change in {(params.min_dwell_s - node.in_layout_s) / 60:.0f} min")
    if node.changes_today >= params.max_changes_per_day:
        return f"{node.changes_today} switches in 24 hours, max_changes_per_day is {params.max_changes_per_day}"
    return None

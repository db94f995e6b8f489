"""The demand rule: which nodes should change to which layout (a candidate, or a per-GPU mix of the
candidates: migd/demand/mix.py), and why (docs/demand.md).

Benefit and cost are both in GPU-slice-hours.  The benefit of a change is the pending work (fair-
weighted, valued up to ``horizon_s``, each job at its account's learned share of its time limit) that
the fleet's supply could then start and cannot now, each node's supply counted from when it will be
ready (after its running jobs end: nothing is killed) and less what Slurm's reservations for older
pending jobs of its other types hold of it (reserve.py; ``reserves``); the cost is the slices the node
leaves idle while it drains and switches.  Changes are taken best first, one node at a time:

1. a MIG type with pending work keeps at least one node whose layout can start its smallest job (as many
   as its first job in Slurm's order spans, where that one spans several: Slurm starts such a job on all
   of its nodes at once, so with fewer it never starts; a further place for such a job, its type having
   one, counts only while no type the change would slow has a pending job older than the type's oldest
   or would then expect to wait longer than the type, and is otherwise weighed as in item 2, where it
   gains nothing: slice-hours count the job's work, not its nodes): a change that gives one a place is
   made when
   the slices it idles while draining are no more than that type's pending work (not the thresholds
   below: a minority's work is small, and the majority's queue would fill the GPU it takes, so in
   slice-hours alone carving a place never pays, and the minority waits for ever), where the place opens
   soonest (when the node is ready, plus the part of the horizon the older jobs of the layout's other
   types hold it); none that takes away more places than it gives is made, and one that takes a place a
   type needs only if it gives another type its first; and one that takes the last place from a type
   seen (pending or running) within ``keep_place_s`` (a day by default) is held, unless it gives a
   waiting type its place: the seen type's next job would wait for a drain and a switch, and a type that
   ran today comes back (on a fleet loaded past its size and cut whole, a quiet hour otherwise gave a
   type's last node to the others minutes before its next jobs came, which then waited hours for a
   drain: docs/demand.md);
2. then the change that most shortens the longest expected wait of a MIG type (its oldest pending
   job's age plus the time the type's supply takes to run its work within the horizon), then best
   lifts the worst-served account, then the largest net gain, while one pays enough
   (``min_gain_slice_h`` and ``gain_ratio``); never one that lengthens that wait or leaves the
   worst-served account worse off.  Slice-hours alone are blind to when work runs: a type whose queue
   the horizon still covers looks fully served however late its jobs start, and its supply would be
   taken for a type whose (forecast) work is larger.  A change must offer more instances of a type a
   pending job waits for: the forecast (recent arrivals carried forward) weighs changes, it does not
   start one.  Drained for work no job had asked yet, a quiet night's nodes went to the last hour's
   training and held it, long jobs and all, when the morning's notebooks came (docs/demand.md).
   Such a change is made only if the jobs waiting now, replayed over the horizon (starts.py), wait
   less on average with it than without: slice-hours cannot see when each job starts, and a change
   that gains them for a queue long in work but short in jobs can start the many waiting jobs later;
3. held: a node that has not held its layout ``min_dwell_s`` or has no switches left today, and a
   change that would undo the node's previous one within ``reverse_s`` (demand that turned around);
4. never more nodes in maintenance than the limit.

Ties break by node then layout name: the same snapshot always gives the same decision.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace

from migd.demand.fair import fair_weights
from migd.demand.inputs import Layout, NodeView, Pending, Shapes, Snapshot, slices_of
from migd.demand.mix import moved_back
from migd.demand.needs import need, possible, spread_of, startable
from migd.demand.reserve import NONE, Ahead
from migd.demand.scoring import Fleet, Part, Queue, Score
from migd.demand.starts import Starts
from migd.demand.supply import Horizon, drain_cost, expected_s, from_ready, ready_in_s, supply


@dataclass(frozen=True)
class Params:
    horizon_s: float = 8 * 3600.0  # how far ahead pending work is valued (a working day's shift)
    recent_s: float = 3600.0  # jobs submitted this recently (pending or started) ...
    lookahead_s: float = 4 * 3600.0  # ... are expected to keep coming at that rate this long
    min_dwell_s: float = 3600.0  # hysteresis: a node holds a layout at least this long
    min_gain_slice_h: float = 7.0  # hysteresis: a change must gain this much (one GPU-hour) net
    gain_ratio: float = 1.0  # and its benefit be this many times its cost (1: no margin past min_gain; with
    # each change replayed against the waiting jobs (starts.py), dropping the twofold margin met more of
    # the bench's targets: docs/demand-tried.md)
    switch_s: float = 180.0  # one switch's own time: apply, GRES, Slurm restart, registration
    max_changes_per_day: int = 4
    max_in_maintenance: int | None = None  # nodes draining or switching at once (fleet waves)
    reverse_s: float = 6 * 3600.0  # a change undoing the node's previous one this soon is held
    keep_place_s: float = 24 * 3600.0  # a MIG type seen this recently keeps its last place (0: pending work only)
    reserves: bool = True  # older pending jobs hold whole nodes, as on every Slurm (reserve.py); False: the
    # bench's plain model, where nothing does

    def horizon(self, run_ratio: Mapping[str, float]) -> Horizon:
        return Horizon(self.horizon_s, self.switch_s, run_ratio)


@dataclass(frozen=True)
class Change:
    node: str
    old: str
    new: str
    benefit_slice_h: float
    cost_slice_h: float
    ready_in_s: float  # when its new layout can serve (its running jobs' end, then the switch)
    places: tuple[str, ...] = ()  # MIG types with pending work that had no place to run and get one
    wait: Wait | None = None  # the longest expected wait of a MIG type before and after it
    replayed: tuple[float, float] | None = None  # the mean wait of the jobs waiting now, without and with it
    spread: tuple[tuple[str, int], ...] = ()  # of ``places``, those whose jobs span several nodes: how many

    @property
    def reason(self) -> str:
        over = "".join(f" ({t}: its jobs span {n} nodes, so it needs {n} places)" for t, n in self.spread)
        place = f"; gives {', '.join(self.places)} a place to run{over}" if self.places else ""
        wait = f"; {self.wait}" if self.wait is not None else ""
        replayed = (f"; the jobs waiting now wait {self.replayed[0] / 3600:.1f} h on average -> "
                    f"{self.replayed[1] / 3600:.1f} h (replayed)" if self.replayed is not None else "")
        return (f"{self.node}: {self.old} -> {self.new}: gains {self.benefit_slice_h:.1f} slice-hours of pending "
                f"work for {self.cost_slice_h:.1f} idled while it drains (ready in {self.ready_in_s / 60:.0f} min)"
                + wait + replayed + place)


@dataclass(frozen=True)
class Wait:
    """The longest expected wait of a MIG type (its oldest pending job's age plus the time the type's
    supply takes to run its work), before and after a change: what a change is first chosen by."""

    before_s: float
    before_type: str
    after_s: float
    after_type: str

    def __str__(self) -> str:
        return (f"longest expected wait {self.before_s / 3600:.1f} h ({self.before_type}) -> "
                f"{self.after_s / 3600:.1f} h ({self.after_type})")


@dataclass(frozen=True)
class Decision:
    changes: tuple[Change, ...]
    demand: tuple[tuple[str, float], ...]  # fair-weighted slice-hours of work per MIG type within the horizon
    unservable: tuple[str, ...]  # MIG types asked for that no candidate layout offers
    held: tuple[tuple[str, str], ...]  # (node, why a paying change was not made)


def _work(p: Pending, params: Params, ratio: Mapping[str, float]) -> float:
    return slices_of(p.mig_type) * p.count * p.nodes * min(expected_s(p.time_limit_s, ratio.get(p.account, 1.0)),
                                                  params.horizon_s) / 3600


def _demand(snap: Snapshot, offered: set[str], capacity: float, params: Params) -> tuple[
        dict[str, dict[str, float]], tuple[str, ...]]:
    """Fair-weighted slice-hours of work per type within the horizon: the pending jobs', plus, for the
    jobs submitted in the last ``recent_s`` (pending or started), as much again for every ``recent_s``
    of ``lookahead_s`` (a persistence forecast: demand that just appeared is assumed to go on)."""
    again = params.lookahead_s / params.recent_s
    ratio = dict(snap.run_ratio)
    wants: list[tuple[str, str, float]] = []  # (account, type, slice-hours)
    for p in snap.pending:
        wants.append((p.account, p.mig_type, _work(p, params, ratio) * (1 + again if p.age_s <= params.recent_s
                                                                          else 1)))
    for n in snap.nodes:
        wants += [(r.account, r.mig_type, again * slices_of(r.mig_type) * r.count
                   * min(expected_s(r.limit_s, ratio.get(r.account, 1.0)), params.horizon_s) / 3600)
                  for r in n.running if r.submitted_s_ago <= params.recent_s]
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


def decide(snap: Snapshot, layouts: Mapping[str, Layout] | Shapes, params: Params = Params()) -> Decision:
    """Which nodes change to which layout now (``Decision.changes``), and why the others do not.
    ``layouts``: every layout a node may take, or (nodes whose GPUs differ) Shapes."""
    shapes = layouts if isinstance(layouts, Shapes) else Shapes(layouts)
    snap = Snapshot(tuple(sorted(possible(snap.pending, snap.nodes, shapes),  # one order:
                                 key=lambda p: (p.account, p.mig_type, p.job))),
                    tuple(replace(n, running=tuple(sorted(n.running, key=lambda r: r.job)))  # the same sums
                          for n in sorted(snap.nodes, key=lambda n: n.name)), tuple(sorted(snap.run_ratio)),
                    tuple(sorted(snap.seen, key=lambda s: s.mig_type)))
    if not snap.nodes:
        return Decision((), (), (), ())
    h = params.horizon(dict(snap.run_ratio))
    every = shapes.every(snap.nodes)
    offered = {t for lay in every for t, _ in lay.capacity}
    demand, unservable = _demand(snap, offered, sum(shapes.slices(n) for n in snap.nodes), params)
    oldest: dict[str, float] = {}
    for p in snap.pending:
        oldest[p.mig_type] = max(oldest.get(p.mig_type, 0.0), p.age_s)
    keep = startable({s.mig_type: s.count for s in snap.seen if s.ago_s < params.keep_place_s}, every)
    ahead = Ahead.of(snap.pending, lambda p: _work(p, params, h.ratio)) if params.reserves else NONE
    spread = spread_of(snap.pending)
    fleet = Fleet(Queue(demand, need(snap.pending, every), oldest, keep, ahead, spread), params.horizon_s)
    fleet.put({n.name: _part(n, shapes.of(n)[n.layout], h) for n in snap.nodes})
    busy = sum(1 for n in snap.nodes if n.draining)
    changes: list[Change] = []
    held: dict[str, str] = {}
    free = [n for n in snap.nodes if not n.draining]
    refused: set[tuple[str, str]] = set()
    starts = Starts(snap.nodes, snap.pending, shapes, h)
    while fleet.need:  # (a change must start a waiting job: with none, none is made)
        search = _Search(shapes, fleet, params, h, held, refused, starts)
        best = search.best(free)
        if best is None:
            break
        node, ranked, new_part = best
        change = search.confirm(node, ranked, new_part)
        if change is None:
            continue
        if params.max_in_maintenance is not None and busy >= params.max_in_maintenance:
            held[node.name] = (f"{change.reason}; waits: {busy} node(s) in maintenance, "
                               f"max_in_maintenance is {params.max_in_maintenance}")
            break
        changes.append(change)
        fleet.put({node.name: new_part})
        starts.take(node.name, change.new)
        free.remove(node)
        busy += 1
    return Decision(tuple(changes), tuple(sorted((t, sum(a.values())) for t, a in demand.items())), unservable,
                    tuple(sorted(held.items())))


_Key = tuple[int, float, float, float, float, str, str]  # unplaced types, when (a place) opens, longest
# expected wait, worst, -net, node, layout


@dataclass(frozen=True)
class _Search:
    shapes: Shapes
    fleet: Fleet
    params: Params
    h: Horizon
    held: dict[str, str]
    refused: set[tuple[str, str]]  # (node, layout): ranked best, then found not to pay when weighed exactly
    starts: Starts  # the jobs waiting now, replayed (starts.py)

    def best(self, nodes: list[NodeView]) -> tuple[NodeView, Change, Part] | None:
        """The change that gives the most unplaced types a place (soonest), then most shortens the longest
        expected wait of a type, then best lifts the worst-served account, then gains the most net (ties:
        node, then layout name).  Nodes alike (same layout, same running jobs, same history) are tried
        once: the first by name stands for them all."""
        now = self.fleet.score()
        found: _Key | None = None
        pick: tuple[NodeView, Change, Part] | None = None
        seen: set[object] = set()
        for node in nodes:
            stuck = _hysteresis(node, self.params)
            alike = (node.layout, tuple((r.mig_type, r.count, r.ends_in_s, r.account, r.limit_s) for r in node.running),
                     node.left, stuck, node.shape)
            if alike in seen:
                continue
            seen.add(alike)
            for key, change, new in self._trials(node, now, stuck):
                if found is None or key < found:
                    found, pick = key, (node, change, new)
        return pick

    def _trials(self, node: NodeView, now: Score, stuck: str | None) -> list[tuple[_Key, Change, Part]]:
        """``stuck``: why the node's hysteresis holds it (whichever layout: its first paying change says it)."""
        out: list[tuple[_Key, Change, Part]] = []
        cost = drain_cost(node, self.shapes.slices(node), self.h)
        if not now.unplaced and self.fleet.work - now.served - cost < self.params.min_gain_slice_h - 1e-6:
            return out  # (no layout could gain enough: what is left unserved is too little)
        layouts = self.shapes.of(node)
        here = layouts[node.layout]
        ready = ready_in_s(node, self.h)
        for name in sorted(layouts):
            if name == node.layout or (self.shapes.choices is not None and name not in self.shapes.choices):
                continue
            if (node.name, name) in self.refused:
                continue
            layout = layouts[name]
            if not any(layout.count(t) > here.count(t) for t in self.fleet.need):
                continue  # (it would start no job that waits: forecast work weighs a change, starts none)
            new = Part(from_ready(layout, ready, self.h), layout, dict(layout.capacity))
            after = self.fleet.score(node.name, new)
            change = self._paying(node, name, now, after, cost, ready)
            if change is None:
                continue
            places, benefit = change.places, change.benefit_slice_h
            # (a type waiting with no place outranks one only seen lately: keep_place never holds its place)
            why = stuck or self._reversal(node, layout) or (None if places else self._keeps(now, after))
            if why is not None:
                self.held.setdefault(node.name, f"{change.reason}; held: {why}")
                if stuck:
                    return out
                continue
            opens = ready + self.h.horizon_s * max((self.fleet.held(node.name, new, t) for t in places), default=0.0)
            # (places lacked after it, a further place not yet due counted as still lacked: one that gives a
            # type its first comes first)
            key = (len(now.unplaced) - len(places), opens if places else 0.0, round(after.wait_s, 3),
                   -round(after.worst, 6), -round(benefit - cost, 6))
            out.append(((*key, node.name, name), change, new))
        return out

    def _paying(self, node: NodeView, name: str, now: Score, after: Score, cost: float,
                ready: float) -> Change | None:
        """The change of ``node`` to ``name`` that scores ``after``, if it pays: it gives a type a place for
        no more idling than that type's work, or it gains enough, lengthens no type's expected wait and
        leaves no account worse served."""
        if len(after.unplaced) > len(now.unplaced):
            return None
        places: tuple[str, ...] = ()
        if now.unplaced:  # (places lacked, per type: each type once per place it lacks)
            before, left = Counter(now.unplaced), Counter(after.unplaced)
            places = tuple(t for t in before if left[t] < before[t])
            if any(self.fleet.places.get(t, 0) for t in places) and left - before:
                return None  # (a place is taken from a type that needs it only to give another its first)
            places = tuple(t for t in places if before[t] >= self.fleet.spread.get(t, 1) or self._due(t, now, after))
        benefit = after.served - now.served
        if cost > sum(self.fleet.by_type.get(t, 0.0) for t in places) if places else (
                benefit - cost < self.params.min_gain_slice_h or after.worst < now.worst - 1e-9
                or after.wait_s > now.wait_s + 1e-3 or benefit < self.params.gain_ratio * cost):
            return None
        return Change(node.name, node.layout, name, benefit, cost, ready, places,
                      Wait(now.wait_s, now.wait_type, after.wait_s, after.wait_type),
                      spread=tuple((t, self.fleet.spread[t]) for t in places if t in self.fleet.spread))

    def _due(self, t: str, now: Score, after: Score) -> bool:
        """Whether a further place for ``t``'s job over several nodes is given as a place (a type's first
        place always is): only while no type the change would slow has a pending job older than ``t``'s
        oldest, or would then expect to wait longer than ``t`` does.  Slurm starts jobs by age and holds
        nodes for the oldest (reserve.py); gathered at once, a younger job over two nodes took a whole node
        from the older queues of other types, and alone in the queue at 09:44 it took one of the day's two
        2g nodes and 2g's p95 was 11 hours (docs/demand.md).  Otherwise the change is weighed as any other."""
        was, oldest, mine = dict(now.waits), self.fleet.oldest, dict(after.waits).get(t, 0.0)
        return all(oldest.get(t, 0.0) >= oldest.get(u, 0.0) and w <= max(was.get(u, 0.0), mine) + 1e-3
                   for u, w in after.waits if u != t and w > was.get(u, 0.0) + 1e-3)

    def confirm(self, node: NodeView, change: Change, part: Part) -> Change | None:
        """``change`` as taking it scores, every node weighed again (the search ranked it with the others
        as they stand), and unless it gives a type a place, the jobs waiting now replayed with and
        without it: None, and not tried again, if it no longer pays or they would wait longer."""
        after = self.fleet.score(node.name, part, exact=True)
        exact = self._paying(node, change.new, self.fleet.score(), after, change.cost_slice_h, change.ready_in_s)
        if exact is not None and not exact.places:
            before, with_it = self.starts.waits_s(), self.starts.waits_s(node.name, change.new)
            exact = replace(exact, replayed=(before, with_it))
            if with_it >= before - 1e-6:
                self.held.setdefault(node.name, f"{exact.reason}; held: the jobs waiting now would not wait less "
                                                "with it")
                exact = None
        if exact is None:
            self.refused.add((node.name, change.new))
        return exact

    def _keeps(self, now: Score, after: Score) -> str | None:
        lost = [t for t in after.unkept if t not in now.unkept]
        if not lost:
            return None
        return (f"it would take the last place of {', '.join(lost)}, seen within {self.params.keep_place_s / 3600:g} h "
                "(keep_place)")

    def _reversal(self, node: NodeView, layout: Layout) -> str | None:
        layouts = self.shapes.of(node)
        left = layouts.get(node.left) if node.left is not None else None
        if left is None or node.in_layout_s >= self.params.reverse_s:
            return None
        if not moved_back(left, layouts[node.layout], layout):
            return None
        return (f"it would undo its change from {node.left} {node.in_layout_s / 3600:.1f} h ago: demand that turns "
                f"around within {self.params.reverse_s / 3600:g} h is held")


def _part(node: NodeView, layout: Layout, h: Horizon) -> Part:
    """``node``'s part as it stands: in its layout, or draining, in the one it changes to."""
    if node.draining:
        return Part(supply(node, layout, h, staying=False), layout, dict(layout.capacity))
    free = dict(layout.capacity)
    for r in node.running:
        if r.mig_type in free:
            free[r.mig_type] -= r.count
    return Part(supply(node, layout, h, staying=True), layout, free)


def _hysteresis(node: NodeView, params: Params) -> str | None:
    if node.in_layout_s < params.min_dwell_s:
        return (f"in {node.layout} for {node.in_layout_s / 60:.0f} min of the {params.min_dwell_s / 60:.0f} min "
                f"minimum; earliest change in {(params.min_dwell_s - node.in_layout_s) / 60:.0f} min")
    if node.changes_today >= params.max_changes_per_day:
        return f"{node.changes_today} switches in 24 hours, max_changes_per_day is {params.max_changes_per_day}"
    return None

"""When the jobs waiting now would start: the queue as it stands replayed over the horizon, with and
without a change.  The check every change the rule ranks must pass before it is made (rule.py).

The rule weighs a change in slice-hours: the work the fleet could run within the horizon with it,
less the slices its drain idles.  That arithmetic cannot see when each job starts.  A change can gain
slice-hours for a type whose queue is long in work but short in jobs, while the many jobs waiting
for the instances it takes away start hours later; and a node drained for a queue that another node
will serve within the hour idles for nothing.  So a change is made only if, replayed, the jobs
waiting now wait less in all with it than without it.  Replayed from the accounting mix itself, the
rule without this check left 4 nodes waiting longer than keeping that mix would have on five draws
of eight (docs/demand-tried.md).

The replay: each node's instances of each MIG type free when the running job on them is expected to
end (supply.remaining_s); a node changing (this change, one already decided this pass, or one
draining) offers all of its new layout when it is ready (its drain, then the switch:
supply.ready_in_s).  The pending jobs Slurm's backfill tests (at most ``BF_MAX_JOB_TEST``, in its
order: reserve.py), each on the node where the instances it asks are free soonest (the first of
equals; a job over N nodes on the N such nodes, starting on all when the last has them), for its
expected run time (its account's learned share of its time limit); a job that
would not start within the horizon counts as starting at its end.  No job arrives in it: the
forecast weighs a change, it starts none.  Slurm's whole-node reservations are not replayed here:
replayed with them, the check did no better with Slurm's reservations in the bench (docs/demand-tried.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from migd.demand.inputs import Layout, NodeView, Pending, Shapes
from migd.demand.reserve import tested
from migd.demand.supply import Horizon, expected_s, ready_in_s, remaining_s

Slots = dict[str, list[float]]  # MIG type -> when each of the node's instances of it is free (sorted)


def slots(node: NodeView, layout: Layout, h: Horizon, changing: bool) -> Slots:
    """``node``'s instances in ``layout`` and when each is free: all when it is ready if ``changing``
    (or draining), else each as the job running on it ends."""
    if changing or node.draining:
        ready = ready_in_s(node, h)
        return {t: [ready] * n for t, n in layout.capacity}
    out: Slots = {t: [0.0] * n for t, n in layout.capacity}
    for r in node.running:
        free = out.get(r.mig_type, [])
        for _ in range(min(r.count, free.count(0.0))):
            free[free.index(0.0)] = remaining_s(r, h)
    for free in out.values():
        free.sort()
    return out


def total_wait_s(fleet: Sequence[Slots], pending: Sequence[Pending], h: Horizon) -> float:
    """The waits of ``pending`` (in the order given) summed: each job's age plus when it starts (a job
    over N nodes: each of its N shares', ``_soonest``), the fleet being ``fleet`` (copied: it is not
    changed)."""
    free = [{t: list(s) for t, s in node.items()} for node in fleet]
    total = 0.0
    for p in pending:
        at, shares, best = _soonest(free, p, h.horizon_s)
        end = at + expected_s(p.time_limit_s, h.ratio.get(p.account, 1.0))
        for s in best:
            i = bisect.bisect_right(s, at)
            del s[i - p.count:i]
            for _ in range(p.count):
                bisect.insort(s, end)
        total += p.nodes * p.age_s + shares
    return total


def _soonest(free: list[Slots], p: Pending, horizon_s: float) -> tuple[float, float, list[list[float]]]:
    """When ``p`` starts within the horizon (its end if not), its shares' waits summed, and the nodes it
    starts on (none if not).  A one-node job: on the node whose ``count`` instances are free soonest
    (the first of equals).  A job over N nodes: on the N such nodes (distinct), all at once when the
    last has them; each of its N shares waits until its own node has them (at most the horizon: a
    share with no node, the whole of it).  The shares' waits understate the job's, but each node that
    comes sooner counts: weighed by its last node alone, no change but the one that completes its N
    nodes would shorten a wait, and the rule changes one node at a time."""
    if p.nodes == 1:
        at, best = horizon_s, None
        for node in free:
            s = node.get(p.mig_type)
            if s is not None and len(s) >= p.count and s[p.count - 1] < at:
                at, best = s[p.count - 1], s
        return at, at, [] if best is None else [best]
    ready = sorted((min(s[p.count - 1], horizon_s), i) for i, node in enumerate(free)
                   if (s := node.get(p.mig_type)) is not None and len(s) >= p.count)[:p.nodes]
    shares = sum(t for t, _ in ready) + horizon_s * (p.nodes - len(ready))
    if len(ready) < p.nodes or ready[-1][0] >= horizon_s:
        return horizon_s, shares, []
    return ready[-1][0], shares, [free[i][p.mig_type] for _, i in ready]


class Starts:
    """The fleet as a pass of the rule leaves it (each change decided is taken), and what the jobs
    waiting now would wait with one more node changing."""

    def __init__(self, nodes: Sequence[NodeView], pending: Sequence[Pending], shapes: Shapes, h: Horizon) -> None:
        self.nodes, self.shapes, self.h = list(nodes), shapes, h
        self.pending = tested(pending)
        self.shares = sum(p.nodes for p in self.pending)  # (a job over N nodes weighs as N: total_wait_s)
        self.taken: dict[str, str] = {}
        self._now: float | None = None
        self._as_is: list[Slots] | None = None  # each node's slots in its layout (the same for every trial)

    def take(self, node: str, layout: str) -> None:
        self.taken[node] = layout
        self._now = None

    def waits_s(self, node: str | None = None, layout: str | None = None) -> float:
        """The mean wait of the jobs waiting now (0 with none; a job over N nodes N shares): the fleet as it
        stands, or with ``node`` changing to ``layout``."""
        if not self.pending:
            return 0.0
        if node is None and self._now is not None:
            return self._now
        changing: Mapping[str, str] = {**self.taken, node: layout} if node and layout else self.taken
        if self._as_is is None:
            self._as_is = [slots(n, self.shapes.of(n)[n.layout], self.h, False) for n in self.nodes]
        fleet = [slots(n, self.shapes.of(n)[changing[n.name]], self.h, True) if n.name in changing else as_is
                 for n, as_is in zip(self.nodes, self._as_is, strict=True)]
        mean = total_wait_s(fleet, self.pending, self.h) / self.shares
        if node is None:
            self._now = mean
        return mean

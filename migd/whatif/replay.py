"""A discrete-time model of Slurm's queue over MIG nodes: what the what-if and bench/demand.py replay.

GRES semantics as Slurm's: a job asks ``count`` instances of one MIG type on each of its nodes
(``--gres=gpu:1g.10gb:2``) and starts only on nodes whose layouts offer them free, on all of a job's
nodes at once; a drained node starts nothing and keeps its running jobs; a node switches layout only
once it is empty (migd's Slurm mode never kills a job: ``jobs_killed``, figures.py, counts any job a
switch cut short, and must stay 0), then is out of service ``switch_s`` (apply, GRES, Slurm restart,
registration).  Scheduling is first-come per MIG type with backfill: a job that fits starts even if an
older one of its type does not, on the nodes select/cons_tres's best fit picks (place.py: for one node,
the busiest node of the tightest set of consecutive nodes that can take it, not the first).  With
``reserve`` it is Slurm 22.05's sched/backfill over select/cons_tres, as read in Slurm's source and
checked against a replay on a real cluster (migd/whatif/backfill.py): every pending job in submission
order reserves whole nodes from cons_tres's estimate of its start, and a younger job of any MIG type
starts only where its time limit meets no reservation.  Steps of ``step_s`` seconds: waits are measured to a step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from migd.demand.inputs import Layout
from migd.whatif.backfill import Backfill, Pass
from migd.whatif.fleet import Job, Node
from migd.whatif.jobs import TraceJob
from migd.whatif.place import best_nodes

__all__ = ["Cluster", "Job", "Node", "Policy", "run"]  # Job and Node live in fleet.py, shared with backfill.py


Policy = Callable[[float, "Cluster"], Mapping[str, Layout]]


@dataclass
class Cluster:
    nodes: list[Node]
    layouts: Mapping[str, Layout]
    switch_s: float = 180.0
    max_in_maintenance: int = 1
    pending: dict[str, list[Job]] = field(default_factory=lambda: defaultdict(list))
    done: list[Job] = field(default_factory=list)
    ended: list[Job] = field(default_factory=list)  # ended since a policy last looked (it may learn from them)
    busy_slice_s: float = 0.0
    drain_slice_s: float = 0.0
    idle_waiting_slice_s: float = 0.0  # slices idle on serving nodes while any job waits (figures.py)
    reserve: bool = False  # Slurm's backfill and its reservations (above); off: first-come per type
    release_s: float = 0.0  # an ended job's instances serve again this much later (Slurm: its end seen, a pass)
    epoch_s: float = 0.0  # the wall clock at time 0 (Slurm's backfill rounds its estimates on it)
    # a change ordered drains its node this much later (on Slurm the node's own migd drains it on its
    # next pass, not the planner as it decides); node -> (layout, when)
    drain_lag_s: float = 0.0
    ordered: dict[str, tuple[Layout, float]] = field(default_factory=dict)
    backfill: Pass = field(default_factory=Backfill, repr=False, compare=False)  # its pass, skipped when idle

    def jobs(self) -> list[Job]:
        """Every job of the replay once: ended, running (a job over several nodes runs on each: taken from
        its first), and pending."""
        return self.done + [j for n in self.nodes for j in n.running if j.node == n.name] + [
            j for q in self.pending.values() for j in q]

    def in_maintenance(self) -> int:
        return sum(1 for n in self.nodes if self.changing(n))

    def changing(self, n: Node) -> bool:
        """Ordered to change, draining or switching: out of the next wave, and counted in this one."""
        return n.target is not None or n.ready_at is not None or n.name in self.ordered

    def order(self, node: Node, layout: Layout, now: float) -> bool:
        """A policy's change: drain ``node`` towards ``layout`` (False: the wave is full)."""
        if layout.name == node.layout.name or self.changing(node):
            return False
        if self.in_maintenance() >= self.max_in_maintenance:
            return False
        if self.drain_lag_s > 0:
            self.ordered[node.name] = (layout, now + self.drain_lag_s)
        else:
            node.target = layout
        return True

    def step(self, now: float, dt: float) -> None:
        for n in self.nodes:
            if n.name in self.ordered and self.ordered[n.name][1] <= now:
                n.target = self.ordered.pop(n.name)[0]
            for j in [j for j in n.running if j.end + self.release_s <= now]:
                n.running.remove(j)
                if j.node == n.name:  # (a job over several nodes ends on all of them in this step: once)
                    self.done.append(j)
                    self.ended.append(j)
            if n.ready_at is not None and now >= n.ready_at:
                n.ready_at = None
            if n.target is not None and not n.running:
                n.history.append((now, n.layout, n.target))
                n.layout, n.target, n.ready_at, n.since = n.target, None, now + self.switch_s, now
                n.switches.append(now)
        if self.reserve:
            self.backfill(self.nodes, self.pending, now, self.epoch_s)
        else:
            self._schedule(now)
        waiting = any(self.pending.values())
        for n in self.nodes:
            busy = n.busy_slices()
            self.busy_slice_s += busy * dt
            if n.target is not None or n.ready_at is not None:
                self.drain_slice_s += (n.slices - busy) * dt
            elif waiting:
                self.idle_waiting_slice_s += (n.slices - busy) * dt

    def _schedule(self, now: float) -> None:
        for mig_type, queue in self.pending.items():
            free = {n.name: n.free(mig_type) for n in self.nodes}
            if not queue or max(free.values(), default=0) <= 0:
                continue
            started = []
            for job in queue:
                nodes = best_nodes(self.nodes, {name for name, k in free.items() if k >= job.spec.count},
                                   job.spec.nodes)
                if nodes is None:
                    continue
                job.start, job.nodes = now, tuple(n.name for n in nodes)
                for node in nodes:
                    node.running.append(job)
                    free[node.name] -= job.spec.count
                started.append(job)
                if max(free.values()) <= 0:
                    break
            if started:
                ids = {id(j) for j in started}
                self.pending[mig_type] = [j for j in queue if id(j) not in ids]


def run(trace: list[TraceJob], cluster: Cluster, policy: Policy, end_s: float, step_s: float = 30.0,
        decide_every_s: float = 300.0) -> Cluster:
    arrivals = iter(trace)
    nxt = next(arrivals, None)
    t = 0.0
    while t < end_s:
        while nxt is not None and nxt.submit_s <= t:
            cluster.pending[nxt.gres].append(Job(nxt))
            nxt = next(arrivals, None)
        if t % decide_every_s < step_s:
            for name, layout in sorted(policy(t, cluster).items()):
                cluster.order(next(n for n in cluster.nodes if n.name == name), layout, t)
        cluster.step(t, step_s)
        t += step_s
    return cluster

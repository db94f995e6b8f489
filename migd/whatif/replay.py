"""A discrete-time model of Slurm's queue over MIG nodes: what the what-if and bench/demand.py replay.

GRES semantics as Slurm's: a job asks ``count`` instances of one MIG type on one node (``--gres=
gpu:1g.10gb:2``) and starts only on a node whose layout offers them free; a drained node starts
nothing and keeps its running jobs; a node switches layout only once it is empty (migd's Slurm mode
never kills a job: ``jobs_killed`` counts any job a switch would have cut short, and must stay 0),
then is out of service ``switch_s`` (apply, GRES, Slurm restart, registration).  Scheduling is
first-come per MIG type with backfill: a job that fits starts even if an older one of its type does
not.  With ``reserve`` it is Slurm 22.05's as measured on a real cluster (tests/test_slurm_replay.py):
every pending job in submission order (priority/basic); one that cannot start reserves the node where
the running jobs' time limits free its instances soonest, and a younger job starts on a reserved node
only if its own time limit ends before that (sched/backfill's reservations are whole nodes, so a job
of another MIG type waits too).  Steps of ``step_s`` seconds: waits are measured to a step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from migd.demand.inputs import Layout, slices_of
from migd.whatif.jobs import TraceJob


@dataclass
class Job:
    spec: TraceJob
    start: float | None = None
    node: str | None = None

    @property
    def end(self) -> float:
        assert self.start is not None
        return self.start + self.spec.duration_s


@dataclass
class Node:
    name: str
    layout: Layout
    slices: int  # physical slices (7 per GPU)
    since: float = 0.0
    running: list[Job] = field(default_factory=list)
    target: Layout | None = None  # draining towards it
    ready_at: float | None = None  # switching: in service again then
    switches: list[float] = field(default_factory=list)
    history: list[tuple[float, Layout, Layout]] = field(default_factory=list)  # (when, from, to), each switch

    def free(self, mig_type: str) -> int:
        if self.target is not None or self.ready_at is not None:
            return 0
        used = sum(j.spec.count for j in self.running if j.spec.gres == mig_type)
        return self.layout.count(mig_type) - used

    def busy_slices(self) -> int:
        return sum(slices_of(j.spec.gres) * j.spec.count for j in self.running)


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
    killed: int = 0
    reserve: bool = False  # Slurm's backfill reservations (above); off: first-come per type
    release_s: float = 0.0  # an ended job's instances serve again this much later (Slurm: its end seen, a pass)

    def in_maintenance(self) -> int:
        return sum(1 for n in self.nodes if n.target is not None or n.ready_at is not None)

    def order(self, node: Node, layout: Layout, now: float) -> bool:
        """A policy's change: drain ``node`` towards ``layout`` (False: the wave is full)."""
        if layout.name == node.layout.name or node.target is not None or node.ready_at is not None:
            return False
        if self.in_maintenance() >= self.max_in_maintenance:
            return False
        node.target = layout
        return True

    def step(self, now: float, dt: float) -> None:
        for n in self.nodes:
            for j in [j for j in n.running if j.end + self.release_s <= now]:
                n.running.remove(j)
                self.done.append(j)
                self.ended.append(j)
            if n.ready_at is not None and now >= n.ready_at:
                n.ready_at = None
            if n.target is not None and not n.running:
                n.history.append((now, n.layout, n.target))
                n.layout, n.target, n.ready_at, n.since = n.target, None, now + self.switch_s, now
                n.switches.append(now)
        (self._schedule_reserving if self.reserve else self._schedule)(now)
        for n in self.nodes:
            busy = n.busy_slices()
            self.busy_slice_s += busy * dt
            if n.target is not None or n.ready_at is not None:
                self.drain_slice_s += (n.slices - busy) * dt

    def _schedule(self, now: float) -> None:
        for mig_type, queue in self.pending.items():
            free = {n.name: n.free(mig_type) for n in self.nodes}
            if not queue or max(free.values(), default=0) <= 0:
                continue
            started = []
            for job in queue:
                node = next((n for n in self.nodes if free[n.name] >= job.spec.count), None)
                if node is None:
                    continue
                job.start, job.node = now, node.name
                node.running.append(job)
                free[node.name] -= job.spec.count
                started.append(job)
                if max(free.values()) <= 0:
                    break
            if started:
                ids = {id(j) for j in started}
                self.pending[mig_type] = [j for j in queue if id(j) not in ids]


    def _schedule_reserving(self, now: float) -> None:
        """Every pending job oldest first: it starts on the first node with its instances free and no
        reservation its time limit would reach into; else it reserves the node it can start on soonest."""
        queue = sorted((j for q in self.pending.values() for j in q), key=lambda j: j.spec.submit_s)
        free = {n.name: {t: n.free(t) for t, _ in n.layout.capacity} for n in self.nodes}
        held: dict[str, float] = {}  # node -> when the earliest reservation on it begins
        started: set[int] = set()
        for job in queue:
            t, k, until = job.spec.gres, job.spec.count, now + job.spec.time_limit_s
            node = next((n for n in self.nodes if free[n.name].get(t, 0) >= k
                         and until <= held.get(n.name, float("inf"))), None)
            if node is not None:
                job.start, job.node = now, node.name
                node.running.append(job)
                free[node.name][t] -= k
                started.add(id(job))
                continue
            soonest = min(((self._frees(n, t, k, free[n.name].get(t, 0)), n.name) for n in self.nodes
                           if n.target is None and n.ready_at is None and n.layout.count(t) >= k), default=None)
            if soonest is not None:
                held[soonest[1]] = min(held.get(soonest[1], float("inf")), soonest[0])
        if started:
            for t, q in self.pending.items():
                self.pending[t] = [j for j in q if id(j) not in started]

    @staticmethod
    def _frees(n: Node, mig_type: str, count: int, free: int) -> float:
        """When ``count`` instances of ``mig_type`` are free on ``n`` by its running jobs' time limits."""
        for end, k in sorted((j.start + j.spec.time_limit_s, j.spec.count) for j in n.running
                             if j.spec.gres == mig_type and j.start is not None):
            free += k
            if free >= count:
                return end
        return float("inf")


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

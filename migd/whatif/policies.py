"""The policies a what-if compares, all from one configuration (a migd.yaml: its profiles, its
schedule and ``slurm.demand.candidates``), so a what-if weighs exactly the layouts a site has.

- ``clock``: the configured schedule, by the calendar from the trace's start date;
- ``greedy``, in the manner of nebuly's nos: each node in turn takes the whole candidate that fits the
  most pending jobs; no drain cost, no hysteresis;
- ``migd``: migd.demand.rule over every per-GPU mix of the candidates, learning run times per account
  from the jobs it sees end, as the planner does;
- a fixed mix: each node keeps one layout (a candidate or a per-GPU mix) for the whole trace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, tzinfo
from typing import Protocol

from migd.catalog.models import GpuModel
from migd.demand.capacity import node_layout
from migd.demand.inputs import Layout, NodeView, Pending, Running, Shapes, Snapshot
from migd.demand.mix import Candidates, choices
from migd.demand.rule import Params, decide
from migd.demand.runtime import RunTimes
from migd.demand.seen import LastSeen
from migd.profiles.model import Profile
from migd.slurm.demandconf import Mixes
from migd.slurm.slurmconf import SlurmSettings
from migd.whatif.jobs import DAY
from migd.whatif.replay import Cluster, Job, Node

GREEDY_LOOK = 500  # pending jobs per type the greedy rule tries to fit (a node fits at most 56)
Policy = Callable[[float, Cluster], Mapping[str, Layout]]


class Entry(Protocol):
    @property
    def profile(self) -> str: ...


class ScheduleLike(Protocol):
    """migd's schedule (migd.config.schedule.Schedule), as the clock policy reads it."""

    @property
    def entries(self) -> Sequence[Entry]: ...

    def active(self, when: datetime) -> Entry | None: ...


class SiteConfig(Protocol):
    """A loaded migd.yaml (migd.config.migdyaml.Config), as much of it as a what-if weighs: taken as a
    protocol so this package needs no part of the daemon, and reads the configuration migd itself loaded."""

    @property
    def profiles(self) -> Mapping[str, Profile]: ...

    @property
    def schedule(self) -> ScheduleLike: ...

    @property
    def timezone(self) -> tzinfo: ...

    @property
    def slurm(self) -> SlurmSettings | None: ...

    @property
    def reconcile_interval_s(self) -> float: ...


@dataclass(frozen=True)
class Setup:
    """The layouts of one configuration resolved on a node of ``models``, and its schedule."""

    candidates: Candidates
    mixes: Mapping[str, Layout]  # every candidate and per-GPU mix of them, by name: what migd may choose
    # (all of them, less what ``choices`` leaves out)
    layouts: Mapping[str, Layout]  # those and the schedule's profiles
    schedule: ScheduleLike
    start: datetime  # the trace's second 0, in the configuration's time zone
    params: Params
    gpus: int
    choices: frozenset[str] | None = None  # the layouts migd may change to (None: every mix; whole: the candidates)
    mixing: Mixes = Mixes.AUTO  # the configuration's slurm.demand.mixes
    interval_s: float = 60.0  # the planner decides this often (slurm.demand.interval): every policy is asked so
    # a change the planner writes reaches its node on the node's next pass (reconcile_interval): on
    # average half an interval later
    lag_s: float = 30.0

    @classmethod
    def of(cls, cfg: SiteConfig, models: Sequence[GpuModel], start: datetime, waves: int,
           where: str = "the configuration") -> Setup:
        """``where``: the file, for the one line that says its demand section is missing."""
        demand = cfg.slurm.demand if cfg.slurm is not None else None
        if demand is None:
            raise ValueError(f"{where}: needs slurm.demand.candidates (the layouts a node may take)")
        cands = Candidates.resolve(cfg.profiles, demand.candidates, models)
        mixes = cands.layouts()
        layouts = dict(mixes)
        for e in cfg.schedule.entries:
            layouts.setdefault(e.profile, node_layout(cfg.profiles[e.profile], models))
        params = replace(demand.params, max_in_maintenance=waves)
        return cls(cands, mixes, layouts, cfg.schedule, start.replace(tzinfo=cfg.timezone), params, len(models),
                   mixing=demand.mixes, interval_s=demand.interval_s,
                   lag_s=cfg.reconcile_interval_s / 2).reserving(params.reserves)

    def reserving(self, reserves: bool, nodes: int | None = None) -> Setup:
        """This setup on a cluster of ``nodes`` (None: not known) whose scheduler reserves whole nodes for
        pending jobs (Slurm's backfill: the replay's ``reserve``, and what the planner always assumes) or
        does not (the bench's plain model): migd's rule weighs what it is told."""
        whole = self.mixing.whole(reserves, nodes, len(self.candidates.names))
        return replace(self, params=replace(self.params, reserves=reserves),
                       choices=choices(self.candidates.names, not whole))

    def scheduled(self, now: float) -> Layout:
        entry = self.schedule.active(self.start + timedelta(seconds=now))
        return self.layouts[entry.profile if entry else self.candidates.names[0]]


def cluster(setup: Setup, nodes: int, waves: int, initial: list[Layout] | None = None,
            settled_s: float = 0.0) -> Cluster:
    """``nodes`` in the clock's layout (or ``initial``'s), each in it since ``settled_s`` before second 0
    (0: as if just switched, so the rule's minimum dwell holds it at first)."""
    first = initial or [setup.scheduled(0.0)] * nodes
    return Cluster([Node(f"gpu{i:03d}", first[i], 7 * setup.gpus, since=-settled_s) for i in range(nodes)],
                   setup.layouts, max_in_maintenance=waves)


def clock(setup: Setup) -> Policy:
    def policy(now: float, c: Cluster) -> dict[str, Layout]:
        want = setup.scheduled(now)
        return {n.name: want for n in c.nodes if n.layout.name != want.name and n.target is None}
    return policy


def fixed(now: float, c: Cluster) -> dict[str, Layout]:
    return {}


def greedy(setup: Setup) -> Policy:
    whole = setup.candidates.names

    def policy(now: float, c: Cluster) -> dict[str, Layout]:
        """Each node in turn takes the candidate that starts the most still-unclaimed pending jobs (a job over
        N nodes as N shares, a node claiming one at most, after the one-node jobs of its type: nos places
        pods, each on one node)."""
        left = {t: ([j.spec.count for j in q[:GREEDY_LOOK] if j.spec.nodes == 1],
                    [(j.spec.count, id(j)) for j in q[:GREEDY_LOOK] for _ in range(j.spec.nodes) if j.spec.nodes > 1])
                for t, q in c.pending.items() if q}
        out: dict[str, Layout] = {}
        for n in c.nodes:
            if n.target is not None or n.ready_at is not None:
                continue
            here = _fits({t: n.free(t) for t in left}, left)
            best, fits = None, here[0]
            for name in whole:
                trial = _fits({t: setup.layouts[name].count(t) for t in left}, left)
                if name != n.layout.name and trial[0] > fits:
                    best, fits = name, trial[0]
            left = (here if best is None else _fits({t: setup.layouts[best].count(t) for t in left}, left))[1]
            if best is not None:
                out[n.name] = setup.layouts[best]
        return out
    return policy


Shares = dict[str, tuple[list[int], list[tuple[int, int]]]]  # MIG type -> unclaimed: one-node jobs' instances,
# and each share of a job over several nodes as (instances, the job's id)


def _fits(free: Mapping[str, int], left: Shares) -> tuple[int, Shares]:
    """How many of ``left``'s jobs and shares one node with ``free`` instances claims, and those it leaves
    (of a job over several nodes, one share at most)."""
    started, rest = 0, {}
    for t, (counts, shares) in left.items():
        room, keep, wide, mine = free.get(t, 0), [], [], set()
        for k in counts:
            if k <= room:
                room -= k
                started += 1
            else:
                keep.append(k)
        for k, job in shares:
            if k <= room and job not in mine:
                room -= k
                started += 1
                mine.add(job)
            else:
                wide.append((k, job))
        rest[t] = (keep, wide)
    return started, rest


@dataclass(frozen=True)
class Planner:
    """migd's policy as the daemon runs it: its changes drain their nodes ``lag_s`` after it decides
    (the replay's ``drain_lag_s``), when each node's own migd reads its want."""

    decide: Policy
    lag_s: float

    def __call__(self, now: float, c: Cluster) -> Mapping[str, Layout]:
        return self.decide(now, c)


def migd(setup: Setup) -> Planner:
    learned, seen = RunTimes(), LastSeen()
    ids: dict[int, str] = {}  # a job's id for the rule: its number in the order it was first seen

    def named(j: Job) -> str:
        """The same number in every run (the rule orders jobs by it; ``id()`` differs between runs)."""
        return ids.setdefault(id(j), str(len(ids)))

    def asked(j: Job) -> str:
        """A pending job's id as the planner reads it from Slurm, where the trace has it (sacct's: a job over
        N nodes is one, an array's task ``12_3``, whose array's later tasks reserve nothing)."""
        return j.spec.job or named(j)

    def policy(now: float, c: Cluster) -> dict[str, Layout]:
        for j in c.ended:  # (as the planner sees a job it watched run leave Slurm's running set)
            learned.observe(j.spec.account, j.spec.duration_s, j.spec.time_limit_s)
        c.ended.clear()
        seen.observe(now, ((j.spec.gres, j.spec.count) for q in (*c.pending.values(), *(n.running for n in c.nodes))
                           for j in q))
        if not any(c.pending.values()):  # the rule changes a node only to start a waiting job: none, no change
            for n in c.nodes:  # (named as a decision names them: the numbers, and so the rule's order, as ever)
                for j in n.running:
                    named(j)
            return {}
        snap = Snapshot(tuple(Pending(asked(j), j.spec.account, j.spec.gres, j.spec.count, j.spec.time_limit_s,
                                      age_s=now - j.spec.submit_s, nodes=j.spec.nodes)
                              for q in c.pending.values() for j in q),
                        tuple(_view(n, now, c, named) for n in c.nodes if _heading(n, c).name in setup.mixes),
                        learned.ratios(), seen.seen(now))
        # (a node in a layout of the schedule's only is skipped, as by the planner)
        changes = decide(snap, Shapes(setup.mixes, choices=setup.choices), setup.params).changes
        return {ch.node: setup.mixes[ch.new] for ch in changes}
    return Planner(policy, setup.lag_s)


def _heading(n: Node, c: Cluster) -> Layout:
    """The layout ``n`` is in or changing to: one the planner wanted and its node has not yet read counts
    (the planner reads its wants back as changes under way)."""
    return n.target or (c.ordered[n.name][0] if n.name in c.ordered else n.layout)


def _view(n: Node, now: float, c: Cluster, named: Callable[[Job], str]) -> NodeView:
    running = tuple(Running(named(j), j.spec.gres, j.spec.count, (j.start or 0) + j.spec.time_limit_s - now,
                            j.spec.account, now - j.spec.submit_s, j.spec.time_limit_s) for j in n.running)
    return NodeView(n.name, _heading(n, c).name, now - n.since, running, c.changing(n),
                    sum(1 for s in n.switches if s > now - DAY), n.history[-1][1].name if n.history else None)
